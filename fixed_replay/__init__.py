"""fixed_replay: offline RL on Dopamine replay checkpoints without the RAM.

The names most users need, importable from the top:

  from fixed_replay import FixedReplayBuffer, CompactReplayBuffer
  from fixed_replay import WrappedFixedReplayBuffer, FixedReplayRunner
  from fixed_replay import CheckpointError, ReplayMixture

They are imported on first use, so `import fixed_replay` stays light (it does
not import TensorFlow or JAX; see compat.py and quiet.py for what it does set
up). First
use may come after gin's config is locked (an agent's `_build_replay_buffer`
runs inside the runner): the import then registers its gin names with the
lock lifted, since no binding can name them yet (parsing a binding of a name
not yet registered fails), instead of gin's "Attempted to add a new
configurable after the config was locked".
"""

import contextlib
import importlib
import sys

from fixed_replay import compat as _compat
from fixed_replay import module_aliases as _module_aliases
from fixed_replay import quiet as _quiet
from fixed_replay.io import remote as _remote

_quiet.set_environment()
_compat.install()
_module_aliases.install()
_remote.set_tensorflow_defaults()

__version__ = '0.1.0'

# Public name -> the module that defines it.
_PUBLIC = {
  'CheckpointError': 'fixed_replay.errors',
  'FixedReplayBuffer': 'fixed_replay.replay.fixed_replay_buffer',
  'CompactReplayBuffer': 'fixed_replay.replay.fixed_replay_buffer',
  'WrappedFixedReplayBuffer': (
    'fixed_replay.agents.tf.wrapped_fixed_replay_buffer'
  ),
  'FixedReplayRunner': 'fixed_replay.training.run_experiment',
  'ReplayMixture': 'fixed_replay.mixture',
}
__all__ = sorted(_PUBLIC)


def __getattr__(name):
  if name not in _PUBLIC:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  with _gin_unlocked():
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
  globals()[name] = value
  return value


def _gin_unlocked():
  """gin.unlock_config() if gin is in use, else nothing (gin stays unloaded)."""
  gin = sys.modules.get('gin')
  if gin is None:
    return contextlib.nullcontext()
  return gin.unlock_config()


def __dir__():
  return sorted(set(globals()) | set(_PUBLIC))
