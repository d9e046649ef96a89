"""`python -m fixed_replay.cli COMMAND ...`, the same as `fixed-replay`."""

import sys

from fixed_replay.cli import main

sys.exit(main())
