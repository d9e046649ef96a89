"""Old module paths that keep importing: each is an alias of a module today.

Gin files and user code name modules by path (`import
fixed_replay.fixed_replay_buffer` in a config). When a module moves, its old
path is listed here and resolves to the same module object, so gin's
registrations, `isinstance` checks and module-level state are shared. The
finder sits at the end of `sys.meta_path`: a real module of that name, if
one is installed, always wins.
"""

import importlib
import importlib.abc
import importlib.machinery
import sys

# Old path -> the module that now holds its contents.
ALIASES = {
  'fixed_replay.storage': 'fixed_replay.io.files',
  'fixed_replay.gzip_stream': 'fixed_replay.io.gzip_stream',
  'fixed_replay.npy_stream': 'fixed_replay.io.npy_stream',
  'fixed_replay.checkpoints': 'fixed_replay.dataset.checkpoints',
  'fixed_replay.validity': 'fixed_replay.dataset.validity',
  'fixed_replay.inspection': 'fixed_replay.dataset.inspection',
  'fixed_replay.generate': 'fixed_replay.dataset.generate',
  'fixed_replay.policies': 'fixed_replay.dataset.policies',
  'fixed_replay.compact_store': 'fixed_replay.store.compact_store',
  'fixed_replay.convert': 'fixed_replay.store.convert',
  'fixed_replay.block_cache': 'fixed_replay.store.block_cache',
  'fixed_replay.shard': 'fixed_replay.replay.shard',
  'fixed_replay.stacking': 'fixed_replay.replay.stacking',
  'fixed_replay.memory': 'fixed_replay.replay.memory_budget',
  'fixed_replay.prefetch': 'fixed_replay.replay.prefetch',
  'fixed_replay.fixed_replay_buffer': 'fixed_replay.replay.fixed_replay_buffer',
  'fixed_replay.compact_replay_buffer': (
    'fixed_replay.replay.compact_replay_buffer'
  ),
  'fixed_replay.wrapped_fixed_replay_buffer': (
    'fixed_replay.replay.wrapped_fixed_replay_buffer'
  ),
  'fixed_replay.run_experiment': 'fixed_replay.training.run_experiment',
  'fixed_replay.plotting': 'fixed_replay.training.plotting',
  'fixed_replay.agents.offline': 'fixed_replay.agents.tf.offline',
  'fixed_replay.agents.networks': 'fixed_replay.agents.tf.networks',
  'fixed_replay.agents.dqn_agent': 'fixed_replay.agents.tf.dqn_agent',
  'fixed_replay.agents.multi_head_dqn_agent': (
    'fixed_replay.agents.tf.multi_head_dqn_agent'
  ),
  'fixed_replay.agents.rem_agent': 'fixed_replay.agents.tf.rem_agent',
  'fixed_replay.agents.quantile_agent': 'fixed_replay.agents.tf.quantile_agent',
  'fixed_replay.agents.c51_agent': 'fixed_replay.agents.tf.c51_agent',
  'fixed_replay.agents.jax_offline': 'fixed_replay.agents.jax.offline',
  'fixed_replay.agents.jax_networks': 'fixed_replay.agents.jax.networks',
  'fixed_replay.agents.jax_dqn_agent': 'fixed_replay.agents.jax.dqn_agent',
  'fixed_replay.agents.jax_quantile_agent': (
    'fixed_replay.agents.jax.quantile_agent'
  ),
  'fixed_replay.agents.jax_rem_agent': 'fixed_replay.agents.jax.rem_agent',
  'fixed_replay.agents.jax_cql_agent': 'fixed_replay.agents.jax.cql_agent',
}


class _AliasLoader(importlib.abc.Loader):
  """Loads an alias by importing its target and returning that module."""

  def __init__(self, target):
    self._target = target

  def create_module(self, spec):
    del spec
    return importlib.import_module(self._target)

  def exec_module(self, module):
    del module  # The target ran its own code when it was imported.


class AliasFinder(importlib.abc.MetaPathFinder):
  """Finds the modules of an {old path: new path} table."""

  def __init__(self, aliases):
    self.aliases = aliases

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    if fullname not in self.aliases:
      return None
    target_name = self.aliases[fullname]
    return importlib.machinery.ModuleSpec(
      fullname,
      _AliasLoader(target_name),
      is_package=hasattr(importlib.import_module(target_name), '__path__'),
    )


_FINDER = AliasFinder(ALIASES)


def install():
  """Appends the finder to sys.meta_path once."""
  if _FINDER not in sys.meta_path:
    sys.meta_path.append(_FINDER)
