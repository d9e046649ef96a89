"""fixed_replay: offline RL on Dopamine replay checkpoints without the RAM."""

from fixed_replay import compat as _compat

_compat.install()

__version__ = '0.1.0'
