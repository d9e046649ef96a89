"""Offline agents, by the names `fixed-replay train --agent_name` takes.

Besides the names in AGENTS, `--agent_name` takes `package.module:Class`, any
Dopamine agent class with batch_rl's contract (see README, "Your own
agent"): TF agents are built as `Class(sess, num_actions=...,
replay_data_dir=..., summary_writer=...)`, JAX agents without `sess`.
"""

import importlib
import inspect
from typing import Any

from fixed_replay.errors import UsageError

# agent_name -> 'module:Class' (as `--agent_name` takes your own agent).
# Modules are imported on demand so that TF agents never import JAX and the
# other way round. 'c51' is batch_rl's name of the C51 agent.
_TF, _JAX = 'fixed_replay.agents.tf', 'fixed_replay.agents.jax'
AGENTS = {
  'dqn': f'{_TF}.dqn_agent:FixedReplayDQNAgent',
  'multi_head_dqn': f'{_TF}.multi_head_dqn_agent:FixedReplayMultiHeadDQNAgent',
  'rem': f'{_TF}.rem_agent:FixedReplayREMAgent',
  'multi_network_dqn': (
    f'{_TF}.multi_network_dqn_agent:FixedReplayMultiNetworkDQNAgent'
  ),
  'quantile': f'{_TF}.quantile_agent:FixedReplayQuantileAgent',
  'c51': f'{_TF}.c51_agent:FixedReplayRainbowAgent',
  'jax_dqn': f'{_JAX}.dqn_agent:FixedReplayJaxDQNAgent',
  'jax_quantile': f'{_JAX}.quantile_agent:FixedReplayJaxQuantileAgent',
  'jax_rem': f'{_JAX}.rem_agent:FixedReplayJaxREMAgent',
  'jax_cql': f'{_JAX}.cql_agent:FixedReplayJaxCQLAgent',
  'jax_quantile_cql': f'{_JAX}.cql_agent:FixedReplayJaxQuantileCQLAgent',
}

# Modules whose agents are JAX agents (built without a TF session).
_JAX_MODULES = ('dopamine.jax.', 'fixed_replay.agents.jax.')


def agent_class(agent_name: str) -> type:
  """Returns the agent class registered under agent_name.

  Args:
    agent_name: str, a key of AGENTS or 'package.module:Class'.

  Raises:
    UsageError: (a ValueError) for an unknown name, or a path that names no
      module or class.
  """
  if ':' not in AGENTS.get(agent_name, agent_name):
    raise UsageError(
      f'unknown agent_name {agent_name!r}: choose one of '
      f'{", ".join(sorted(AGENTS))}, or give your own agent class as '
      "'package.module:Class'"
    )
  module_name, _, class_name = AGENTS.get(agent_name, agent_name).partition(':')
  try:
    module = importlib.import_module(module_name)
  except ModuleNotFoundError as error:
    missing = error.name or ''
    if not (module_name + '.').startswith(missing + '.'):
      raise  # The module exists; something it imports does not.
    raise UsageError(
      f'agent_name={agent_name!r}: no module {module_name!r} (for your own '
      'agent, put its directory on PYTHONPATH, e.g. PYTHONPATH=.)'
    ) from error
  cls = getattr(module, class_name, None)
  if not inspect.isclass(cls):
    raise UsageError(
      f'agent_name={agent_name!r}: {module_name} has no class {class_name!r}'
    )
  return cls


# Our modules that register gin names a config may bind: imported before a
# config is parsed (and so locked), never first from inside a run, where gin
# would refuse "a new configurable after the config was locked".
_GIN_MODULES = (
  'fixed_replay.replay.fixed_replay_buffer',
  'fixed_replay.agents.tf.wrapped_fixed_replay_buffer',
  'fixed_replay.replay.compact_replay_buffer',
  'fixed_replay.training.run_experiment',
)
_TF_GIN_MODULES = ('fixed_replay.agents.tf.runtime',)


def import_gin_names(cls):
  """Imports every module of ours whose gin names training with cls uses.

  Call it before parsing the configs: the buffers (FixedReplayBuffer.*,
  WrappedFixedReplayBuffer.*, CompactReplayBuffer.*), the runner and, for a
  TF agent, TF's optimizers and `preferred_tf_device`.
  """
  modules = _GIN_MODULES + (() if is_jax_agent(cls) else _TF_GIN_MODULES)
  for module_name in modules:
    importlib.import_module(module_name)


def is_jax_agent(cls: type) -> bool:
  """Whether cls is a JAX agent (built without a TF session)."""
  return any(c.__module__.startswith(_JAX_MODULES) for c in cls.__mro__)


def _accepts(cls, name):
  """Whether cls's constructor takes an argument called name."""
  parameters = inspect.signature(cls.__init__).parameters
  return name in parameters or any(
    p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
  )


def create_agent(
  sess: Any,
  environment: Any,
  agent_name: str,
  replay_data_dir: str,
  replay_suffix: int | None = None,
  init_checkpoint_dir: str | None = None,
  summary_writer: Any = None,
) -> Any:
  """Creates an offline agent for an environment.

  Args:
    sess: tf.compat.v1.Session or None (TF agents make their own; JAX agents
      take none).
    environment: a Dopamine environment (gives the number of actions).
    agent_name: str, a key of AGENTS or 'package.module:Class'.
    replay_data_dir: str, directory of replay checkpoints.
    replay_suffix: int or None, train on one checkpoint only (None leaves it
      to the gin bindings).
    init_checkpoint_dir: str or None, a run to continue from.
    summary_writer: a TF summary writer, a directory, or None.

  Returns:
    The agent.

  Raises:
    ValueError: if the agent cannot take replay_suffix or
      init_checkpoint_dir and one is given.
  """
  cls = agent_class(agent_name)
  kwargs = dict(
    num_actions=environment.action_space.n,
    replay_data_dir=replay_data_dir,
    summary_writer=summary_writer,
  )
  # Passed only when given, so that gin bindings of the agent's own
  # replay_suffix (batch_rl's) take effect otherwise.
  for name, value in (
    ('replay_suffix', replay_suffix),
    ('init_checkpoint_dir', init_checkpoint_dir),
  ):
    if value is None:
      continue
    if not _accepts(cls, name):
      raise ValueError(f'{cls.__name__} takes no {name} argument')
    kwargs[name] = value
  if is_jax_agent(cls):
    return cls(**kwargs)
  from fixed_replay.agents.tf import runtime

  runtime.use_graph_mode()
  return cls(sess, **kwargs)
