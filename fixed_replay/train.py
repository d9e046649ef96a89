r"""Trains an offline agent on a replay dataset: batch_rl's entry point.

`python -m fixed_replay.train --flags` is the same command as `fixed-replay
train` (see fixed_replay/cli/train.py), with batch_rl's flags (--base_dir,
--replay_dir, --agent_name, --gin_files, --gin_bindings,
--init_checkpoint_dir), and --verbose as `fixed-replay train` takes it.
"""

import sys

from absl import flags

from fixed_replay import cli
from fixed_replay.cli import train as _train

# --help lists the flags of the command, defined in fixed_replay.cli.train.
flags.adopt_module_key_flags(_train)
main = _train.main

if __name__ == '__main__':
  # As `fixed-replay train` runs: quiet unless --verbose, which it takes
  # too, and errors in the data or the request print as one line.
  cli.run_module('train', main, sys.argv[0])
