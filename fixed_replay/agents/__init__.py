"""Offline agents, by the names `fixed-replay train --agent_name` takes."""

import importlib

# agent_name -> (module, class). Modules are imported on demand so that TF
# agents never import JAX and the other way round.
AGENTS = {
  'dqn': ('fixed_replay.agents.tf.dqn_agent', 'FixedReplayDQNAgent'),
  'multi_head_dqn': (
    'fixed_replay.agents.tf.multi_head_dqn_agent',
    'FixedReplayMultiHeadDQNAgent',
  ),
  'rem': ('fixed_replay.agents.tf.rem_agent', 'FixedReplayREMAgent'),
  'quantile': (
    'fixed_replay.agents.tf.quantile_agent',
    'FixedReplayQuantileAgent',
  ),
  'c51': ('fixed_replay.agents.tf.c51_agent', 'FixedReplayC51Agent'),
  'jax_dqn': ('fixed_replay.agents.jax.dqn_agent', 'FixedReplayJaxDQNAgent'),
  'jax_quantile': (
    'fixed_replay.agents.jax.quantile_agent',
    'FixedReplayJaxQuantileAgent',
  ),
  'jax_rem': ('fixed_replay.agents.jax.rem_agent', 'FixedReplayJaxREMAgent'),
  'jax_cql': ('fixed_replay.agents.jax.cql_agent', 'FixedReplayJaxCQLAgent'),
  'jax_quantile_cql': (
    'fixed_replay.agents.jax.cql_agent',
    'FixedReplayJaxQuantileCQLAgent',
  ),
}


def agent_class(agent_name):
  """Returns the agent class registered under agent_name."""
  if agent_name not in AGENTS:
    raise ValueError(
      f'Unknown agent_name {agent_name!r}; choose one of ' f'{sorted(AGENTS)}'
    )
  module_name, class_name = AGENTS[agent_name]
  return getattr(importlib.import_module(module_name), class_name)


def create_agent(
  sess,
  environment,
  agent_name,
  replay_data_dir,
  replay_suffix=None,
  init_checkpoint_dir=None,
  summary_writer=None,
):
  """Creates an offline agent for an environment.

  Args:
    sess: tf.compat.v1.Session (None for JAX agents).
    environment: a Dopamine environment (gives the number of actions).
    agent_name: str, a key of AGENTS.
    replay_data_dir: str, directory of replay checkpoints.
    replay_suffix: int or None, train on one checkpoint only.
    init_checkpoint_dir: str or None, warm-start from this run's weights.
    summary_writer: a TF summary writer or None.

  Returns:
    The agent.
  """
  cls = agent_class(agent_name)
  kwargs = dict(
    num_actions=environment.action_space.n,
    replay_data_dir=replay_data_dir,
    replay_suffix=replay_suffix,
    init_checkpoint_dir=init_checkpoint_dir,
    summary_writer=summary_writer,
  )
  if agent_name.startswith('jax_'):
    return cls(**kwargs)
  return cls(sess, **kwargs)
