"""Old module paths that keep importing: each is an alias of a module today.

Gin files and user code name modules by path (`import
batch_rl.fixed_replay.agents.dqn_agent` in a batch_rl config). Two families
of old paths are listed in one table (this package's own paths before its
split into folders are gone: it was never released under them):

* batch_rl's `batch_rl.fixed_replay.*` modules, which hold what this library
  replaces (no `batch_rl` package is installed: its packages exist only as
  aliases);
* Dopamine's paths before 4.x (`dopamine.agents.*`,
  `dopamine.replay_memory.*`, now under `dopamine.tf`), and the one module of
  Dopamine's `labs/offline_rl` that its gin files import but dopamine-rl
  4.1.2 does not ship (`dopamine.labs.offline_rl.jax.networks`).

An alias resolves to the same module object as its target, so gin's
registrations, `isinstance` checks and module-level state are shared. The
packages above an alias (`batch_rl`, `batch_rl.fixed_replay`, ...) import as
empty packages that only hold aliases. The finder sits at the end of
`sys.meta_path`: a real module of the same name, if one is installed, always
wins (so Dopamine's own `dopamine.labs.offline_rl.fixed_replay` is used, and
imports `batch_rl` from here).
"""

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

# Old path -> the module that now holds its contents.
ALIASES = {
  # CompactReplayBuffer is FixedReplayBuffer's; configs import this path.
  'fixed_replay.replay.compact_replay_buffer': (
    'fixed_replay.replay.fixed_replay_buffer'
  ),
  # batch_rl (google-research/batch_rl), the code this library replaces.
  'batch_rl.fixed_replay.run_experiment': (
    'fixed_replay.training.run_experiment'
  ),
  'batch_rl.fixed_replay.train': 'fixed_replay.train',
  # batch_rl kept FixedReplayBuffer and WrappedFixedReplayBuffer in one
  # module; the wrapper's module holds both names.
  'batch_rl.fixed_replay.replay_memory.fixed_replay_buffer': (
    'fixed_replay.agents.tf.wrapped_fixed_replay_buffer'
  ),
  'batch_rl.fixed_replay.agents.dqn_agent': 'fixed_replay.agents.tf.dqn_agent',
  'batch_rl.fixed_replay.agents.multi_head_dqn_agent': (
    'fixed_replay.agents.tf.multi_head_dqn_agent'
  ),
  'batch_rl.fixed_replay.agents.multi_network_dqn_agent': (
    'fixed_replay.agents.tf.multi_network_dqn_agent'
  ),
  'batch_rl.fixed_replay.agents.quantile_agent': (
    'fixed_replay.agents.tf.quantile_agent'
  ),
  'batch_rl.fixed_replay.agents.rainbow_agent': (
    'fixed_replay.agents.tf.c51_agent'
  ),
  # Dopamine before 4.x kept its TF agents and replay at the top level.
  'dopamine.agents.dqn.dqn_agent': 'dopamine.tf.agents.dqn.dqn_agent',
  'dopamine.agents.rainbow.rainbow_agent': (
    'dopamine.tf.agents.rainbow.rainbow_agent'
  ),
  'dopamine.agents.implicit_quantile.implicit_quantile_agent': (
    'dopamine.tf.agents.implicit_quantile.implicit_quantile_agent'
  ),
  'dopamine.replay_memory.circular_replay_buffer': (
    'dopamine.tf.replay_memory.circular_replay_buffer'
  ),
  'dopamine.replay_memory.prioritized_replay_buffer': (
    'dopamine.tf.replay_memory.prioritized_replay_buffer'
  ),
  'dopamine.replay_memory.sum_tree': 'dopamine.tf.replay_memory.sum_tree',
  # Imported by every gin file of Dopamine's labs/offline_rl/jax/configs,
  # not shipped in dopamine-rl 4.1.2: our offline JAX networks.
  'dopamine.labs.offline_rl.jax.networks': 'fixed_replay.agents.jax.networks',
}


def _parent_packages(aliases):
  """Every package above an alias that is not an alias itself."""
  parents = set()
  for name in aliases:
    parts = name.split('.')
    parents.update('.'.join(parts[:i]) for i in range(1, len(parts)))
  return parents - set(aliases)


class _AliasLoader(importlib.abc.Loader):
  """Loads an alias by importing its target and returning that module."""

  def __init__(self, target):
    self._target = target
    self._target_spec = None

  def create_module(self, spec):
    del spec
    module = importlib.import_module(self._target)
    self._target_spec = module.__spec__
    return module

  def exec_module(self, module):
    # The target ran its own code when it was imported. The import system
    # has just set its __spec__ to the alias's: give it back its own.
    module.__spec__ = self._target_spec


class _PackageLoader(importlib.abc.Loader):
  """Creates an empty package whose submodules are aliases."""

  def create_module(self, spec):
    module = types.ModuleType(spec.name)
    module.__path__ = []
    module.__doc__ = (
      'Holds old module paths that fixed_replay maps to its modules (see '
      'fixed_replay/module_aliases.py).'
    )
    return module

  def exec_module(self, module):
    del module


class AliasFinder(importlib.abc.MetaPathFinder):
  """Finds the modules of an {old path: new path} table and their parents."""

  def __init__(self, aliases):
    self.aliases = aliases
    self.packages = _parent_packages(aliases)

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    if fullname in self.aliases:
      return importlib.machinery.ModuleSpec(
        fullname, _AliasLoader(self.aliases[fullname])
      )
    if fullname in self.packages:
      return importlib.machinery.ModuleSpec(
        fullname, _PackageLoader(), is_package=True
      )
    return None


_FINDER = AliasFinder(ALIASES)


def install():
  """Appends the finder to sys.meta_path once."""
  if _FINDER not in sys.meta_path:
    sys.meta_path.append(_FINDER)
