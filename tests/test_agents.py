"""Offline TF agents built from their gin configs, trained on real data.

Atari configs train on Dopamine-written Pong checkpoints (the session
fixture); loss checks use a small CartPole dataset written with Dopamine's
own OutOfGraphReplayBuffer from the real game, so they run in seconds.
"""

# ruff: noqa: I001  (fixed_replay must be imported before Dopamine)
import os

import fixed_replay  # noqa: F401
from dopamine.discrete_domains import atari_lib
from dopamine.discrete_domains import gym_lib
from dopamine.tf.agents.dqn import dqn_agent
from dopamine.tf.agents.rainbow import rainbow_agent
import gin
import numpy as np
import pytest
import tensorflow as tf

from fixed_replay import agents
from fixed_replay import gin_files
from fixed_replay.training import run_experiment  # noqa: F401  (FixedReplayRunner)
from fixed_replay.agents.tf import c51_agent
from fixed_replay.agents.tf import multi_head_dqn_agent
from fixed_replay.agents.tf import networks
from fixed_replay.agents.tf import offline
from fixed_replay.agents.tf import quantile_agent

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'configs')
AGENT_CLASSES = {
  'dqn': 'FixedReplayDQNAgent',
  'multi_head_dqn': 'FixedReplayMultiHeadDQNAgent',
  'rem': 'FixedReplayREMAgent',
  'multi_network_dqn': 'FixedReplayMultiNetworkDQNAgent',
  'quantile': 'FixedReplayQuantileAgent',
  'c51': 'FixedReplayC51Agent',
}
# The class `--agent_name` builds, where it is a subclass of the above.
BUILT_CLASSES = dict(AGENT_CLASSES, c51='FixedReplayRainbowAgent')
# Bindings that keep the Atari graphs small; the rest is the config's.
SMALL = {
  'multi_head_dqn': ['FixedReplayMultiHeadDQNAgent.num_heads = 3'],
  'rem': ['FixedReplayREMAgent.num_heads = 3'],
  'multi_network_dqn': ['FixedReplayMultiNetworkDQNAgent.num_networks = 2'],
  'quantile': ['FixedReplayQuantileAgent.num_atoms = 5'],
  'c51': ['FixedReplayC51Agent.num_atoms = 11'],
  'dqn': [],
}
TEST_DATA = [
  'FixedReplayBuffer.num_buffers_to_load = 2',
  'FixedReplayBuffer.prefetch = False',
  'FixedReplayBuffer.seed = 0',
]
CARTPOLE_ROWS = 700
# Dopamine's gin constants gym_lib.CARTPOLE_OBSERVATION_SHAPE and
# CARTPOLE_STACK_SIZE (gin constants, not module attributes).
CARTPOLE_SHAPE = (4, 1)
CARTPOLE_STACK = 1


@pytest.fixture(autouse=True)
def _clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _parse(config, bindings=()):
  gin.clear_config()
  gin_files.load_gin_configs(
    [os.path.join(CONFIGS, config)], list(bindings), finalize_config=False
  )


def _session():
  # As the agents' own sessions (Dopamine's Runner passes sess=None).
  config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
  return tf.compat.v1.Session(config=config)


def _create(sess, agent_name, data_dir, environment, **kwargs):
  return agents.create_agent(
    sess, environment, agent_name, replay_data_dir=data_dir, **kwargs
  )


def _trainables(agent):
  """Values of the online network's weights (scoped by its Keras name)."""
  return agent._sess.run(tf.compat.v1.trainable_variables(scope='Online'))


def _huber(x):
  return np.where(np.abs(x) <= 1.0, 0.5 * x**2, np.abs(x) - 0.5)


def _pong():
  return atari_lib.create_atari_environment('Pong', sticky_actions=True)


def _cartpole():
  return gym_lib.create_gym_environment('CartPole', 'v0')


def _dqn_loss(agent):
  """DQN's minibatch loss, from the agent's own tensors (same sample)."""
  chosen = tf.reduce_sum(
    agent._replay_net_outputs.q_values
    * tf.one_hot(agent._replay.actions, agent.num_actions),
    axis=1,
  )
  return tf.reduce_mean(
    tf.compat.v1.losses.huber_loss(
      agent._build_target_q_op(),
      chosen,
      reduction=tf.compat.v1.losses.Reduction.NONE,
    )
  )


# ------------------------------------------------------------------ registry


def test_registry_names_classes_and_bases():
  for name, class_name in BUILT_CLASSES.items():
    cls = agents.agent_class(name)
    assert cls.__name__ == class_name
    assert issubclass(cls, offline.OfflineAgent)
    assert issubclass(cls, dqn_agent.DQNAgent)
  assert issubclass(agents.agent_class('c51'), rainbow_agent.RainbowAgent)
  assert issubclass(agents.agent_class('c51'), c51_agent.FixedReplayC51Agent)
  with pytest.raises(ValueError, match='unknown agent_name'):
    agents.agent_class('rem_typo')
  # Any agent class by its path.
  assert agents.agent_class(
    'fixed_replay.agents.tf.rem_agent:FixedReplayREMAgent'
  ) is agents.agent_class('rem')
  with pytest.raises(ValueError, match='has no class'):
    agents.agent_class('fixed_replay.agents.tf.rem_agent:NoSuchAgent')


# ------------------------------------------------------- published settings


@pytest.mark.parametrize(
  'config, agent_name',
  [(f'{name}.gin', name) for name in AGENT_CLASSES]
  + [
    (f'{name}_{pct}pct.gin', name) for name in AGENT_CLASSES for pct in (1, 10)
  ],
)
def test_configs_hold_published_settings(config, agent_name):
  _parse(config)
  agent = AGENT_CLASSES[agent_name]
  query = gin.query_parameter
  assert query('FixedReplayRunner.num_iterations') == 200
  assert query('FixedReplayRunner.training_steps') == 250_000
  assert query('FixedReplayRunner.evaluation_steps') == 125_000
  assert query('FixedReplayRunner.max_steps_per_episode') == 27_000
  assert query('atari_lib.create_atari_environment.sticky_actions') is True
  assert query(f'{agent}.update_period') == 4
  assert query(f'{agent}.target_update_period') == 8000
  assert query(f'{agent}.epsilon_eval') == 0.001
  assert query(f'{agent}.gamma') == 0.99
  assert query(f'{agent}.update_horizon') == 1
  assert query('FixedReplayBuffer.batch_size') == 32
  optimizer = {
    'dqn': ('tf.train.RMSPropOptimizer', 0.00025, 0.00001),
    'multi_head_dqn': ('tf.train.AdamOptimizer', 0.00005, 0.0003125),
    'rem': ('tf.train.AdamOptimizer', 0.00005, 0.0003125),
    'multi_network_dqn': ('tf.train.AdamOptimizer', 0.00005, 0.0003125),
    'quantile': ('tf.train.AdamOptimizer', 0.00005, 0.0003125),
    'c51': ('tf.train.AdamOptimizer', 0.00025, 0.0003125),
  }[agent_name]
  assert query(f'{optimizer[0]}.learning_rate') == optimizer[1]
  assert query(f'{optimizer[0]}.epsilon') == optimizer[2]
  if agent_name in ('rem', 'multi_head_dqn'):
    assert query(f'{agent}.num_heads') == 200
  if agent_name == 'multi_network_dqn':
    assert query(f'{agent}.num_networks') == 4
    assert query(f'{agent}.transform_strategy') == 'STOCHASTIC'
  if agent_name == 'quantile':
    assert query(f'{agent}.num_atoms') == 200
    assert query(f'{agent}.kappa') == 1.0
  if agent_name == 'c51':
    assert query(f'{agent}.num_atoms') == 51
    assert query(f'{agent}.vmax') == 10.0
    assert query(f'{agent}.replay_scheme') == 'uniform'
  if agent_name == 'dqn':
    assert query('tf.train.RMSPropOptimizer.decay') == 0.95
    assert query('tf.train.RMSPropOptimizer.centered') is True
  fraction, buffers = {'1pct': (0.01, 50), '10pct': (0.1, 5)}.get(
    config[:-4].rsplit('_', 1)[-1], (None, 5)
  )
  assert query('FixedReplayBuffer.replay_capacity') == 1_000_000
  assert query('FixedReplayBuffer.num_buffers_to_load') == buffers
  if 'pct' in config:
    # The CQL code's subsets: the first rows of each of the 50 checkpoints.
    assert query('FixedReplayBuffer.subsample') == 'first_rows'
    assert query('FixedReplayBuffer.subsample_fraction') == fraction
    assert query('FixedReplayBuffer.replay_transitions_start_index') == 0
    assert query('FixedReplayBuffer.replay_file_start_index') == 0
    assert query('FixedReplayBuffer.replay_file_end_index') == 50


# ----------------------------------------------------- Atari configs train


@pytest.mark.parametrize(
  'config, agent_name',
  [(f'{name}.gin', name) for name in AGENT_CLASSES] + [('rem_1pct.gin', 'rem')],
)
def test_atari_config_builds_and_trains(dopamine_dir, config, agent_name):
  directory, _, _ = dopamine_dir
  _parse(config, SMALL[agent_name] + TEST_DATA)
  environment = _pong()
  with tf.Graph().as_default(), _session() as sess:
    agent = _create(sess, agent_name, str(directory), environment)
    assert type(agent).__name__ == BUILT_CLASSES[agent_name]
    assert agent.num_actions == environment.action_space.n
    assert agent.min_replay_history == 0
    assert (agent.update_period, agent.target_update_period) == (4, 8000)
    assert agent.epsilon_eval == 0.001
    memory = agent.replay.memory
    assert len(memory.loaded_suffixes) == 2
    # rem_1pct.gin: the first 1% of the rows of each checkpoint.
    assert memory.shard(memory.loaded_suffixes[0]).window.num_rows == (
      10 if config == 'rem_1pct.gin' else 1000
    )
    assert agent.replay.batch_size == 32
    before = _trainables(agent)
    for _ in range(2 * agent.update_period):  # Two gradient updates.
      agent.train_step()
    after = _trainables(agent)
    assert agent.training_steps == 8
    assert any(
      not np.array_equal(a, b) for a, b in zip(before, after, strict=True)
    )
    loss = agent.loss if agent_name != 'dqn' else _dqn_loss(agent)
    losses = [sess.run([agent._train_op, loss])[1] for _ in range(3)]
  assert np.all(np.isfinite(losses)), losses
  assert len(set(np.round(losses, 7))) > 1, losses


def test_c51_refuses_prioritized_replay(cartpole_dir):
  gin.parse_config(TEST_DATA)
  with tf.Graph().as_default(), _session() as sess:
    with pytest.raises(ValueError, match="only 'uniform'"):
      c51_agent.FixedReplayC51Agent(
        sess, 2, cartpole_dir, replay_scheme='prioritized'
      )


# -------------------------------------------------------------- the losses


def _cartpole_agent(sess, agent_name, directory, bindings=(), **kwargs):
  bindings = list(bindings)
  _parse(os.path.join('cartpole', f'{agent_name}.gin'), TEST_DATA + bindings)
  return _create(sess, agent_name, directory, _cartpole(), **kwargs)


def _replay_fetches(agent):
  replay = agent.replay
  return {
    'reward': replay.rewards,
    'terminal': replay.terminals,
    'action': replay.actions,
  }


def _rem_fetches(agent):
  """A REM agent's train op, mixing weights, loss and both heads' outputs."""
  return dict(
    _replay_fetches(agent),
    train=agent._train_op,
    alpha=agent.mixing_weights,
    loss=agent.loss,
    q_heads=agent._replay_net_outputs.q_heads,
    next_q_heads=agent._replay_next_target_net_outputs.q_heads,
  )


def test_rem_mixing_weights_are_fresh_convex_and_shared(cartpole_dir):
  with tf.Graph().as_default(), _session() as sess:
    agent = _cartpole_agent(sess, 'rem', cartpole_dir)
    assert agent.num_heads == 10
    fetches = _rem_fetches(agent)
    runs = [sess.run(fetches) for _ in range(3)]
  alphas = np.array([run['alpha'] for run in runs])
  assert alphas.shape == (3, 10)
  assert np.all(alphas >= 0)
  np.testing.assert_allclose(alphas.sum(axis=1), 1.0, rtol=1e-5)
  assert not np.allclose(alphas[0], alphas[1])
  assert not np.allclose(alphas[1], alphas[2])
  for run in runs:
    # The loss of each step is the Huber TD loss of that step's alpha
    # applied to the online AND the target heads.
    alpha = run['alpha']
    batch = np.arange(len(run['action']))
    q = run['q_heads'] @ alpha
    next_q = run['next_q_heads'] @ alpha
    target = run['reward'] + 0.99 * next_q.max(axis=1) * (1 - run['terminal'])
    expected = _huber(target - q[batch, run['action']]).mean()
    np.testing.assert_allclose(run['loss'], expected, rtol=1e-5)
    uniform = np.full_like(alpha, 1 / alpha.size)
    other = run['reward'] + 0.99 * (run['next_q_heads'] @ uniform).max(1) * (
      1 - run['terminal']
    )
    assert not np.isclose(
      run['loss'], _huber(other - q[batch, run['action']]).mean(), rtol=1e-5
    )


def test_heads_act_on_their_mean(cartpole_dir):
  with tf.Graph().as_default(), _session() as sess:
    agent = _cartpole_agent(sess, 'rem', cartpole_dir)
    state = np.random.default_rng(0).normal(size=agent.state.shape)
    outputs, argmax = sess.run(
      [agent._net_outputs, agent._q_argmax], {agent.state_ph: state}
    )
  np.testing.assert_allclose(
    outputs.q_values, outputs.q_heads.mean(axis=-1), rtol=1e-5, atol=1e-6
  )
  assert argmax == np.argmax(outputs.q_heads.mean(axis=-1)[0])


def test_ensemble_loss_is_mean_of_per_head_td_losses(cartpole_dir):
  gin.parse_config(TEST_DATA)
  with tf.Graph().as_default(), _session() as sess:
    agent = multi_head_dqn_agent.FixedReplayMultiHeadDQNAgent(
      sess,
      2,
      cartpole_dir,
      num_heads=4,
      observation_shape=CARTPOLE_SHAPE,
      observation_dtype=tf.float64,
      stack_size=CARTPOLE_STACK,
      network=networks.CartpoleMultiHeadQNetwork,
    )
    fetches = dict(
      _replay_fetches(agent),
      train=agent._train_op,
      loss=agent.loss,
      q_heads=agent._replay_net_outputs.q_heads,
      next_q_heads=agent._replay_next_target_net_outputs.q_heads,
    )
    run = sess.run(fetches)
  batch = np.arange(len(run['action']))
  chosen = run['q_heads'][batch, run['action']]  # [batch, heads]
  target = run['reward'][:, None] + 0.99 * run['next_q_heads'].max(axis=1) * (
    1 - run['terminal'][:, None]
  )
  np.testing.assert_allclose(
    run['loss'], _huber(target - chosen).mean(), rtol=1e-5
  )
  assert run['loss'] > 0


def _numpy_quantile_huber(target, online, kappa):
  """The formula, one (transition, online i, target j) term at a time."""
  batch, n = online.shape
  losses = np.zeros(batch)
  for b in range(batch):
    for i in range(n):
      tau = (i + 0.5) / n
      terms = []
      for j in range(target.shape[1]):
        u = target[b, j] - online[b, i]
        if kappa == 0:
          rho = abs(u)
        elif abs(u) <= kappa:
          rho = 0.5 * u * u / kappa
        else:
          rho = abs(u) - 0.5 * kappa
        terms.append(abs(tau - (u < 0)) * rho)
      losses[b] += np.mean(terms)
  return losses


@pytest.mark.parametrize('kappa', [1.0, 0.5, 0.0])
def test_quantile_huber_loss_matches_formula(kappa):
  rng = np.random.default_rng(1)
  target = rng.normal(scale=2.0, size=(3, 4)).astype(np.float32)
  online = rng.normal(scale=2.0, size=(3, 5)).astype(np.float32)
  with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
    loss = sess.run(
      quantile_agent.quantile_huber_loss(
        tf.constant(target), tf.constant(online), kappa
      )
    )
    # By hand: one quantile (tau_hat 0.5) at 0, target 1: 0.5 * huber(1).
    single = sess.run(
      quantile_agent.quantile_huber_loss(
        tf.constant([[1.0]]), tf.constant([[0.0]])
      )
    )
    # Two quantiles at 0 (tau_hat 1/4, 3/4), targets -3 and 0.5:
    # i=0: (|0.25 - 1| * 2.5 + 0.25 * 0.125) / 2 = 0.953125
    # i=1: (|0.75 - 1| * 2.5 + 0.75 * 0.125) / 2 = 0.359375
    pair = sess.run(
      quantile_agent.quantile_huber_loss(
        tf.constant([[-3.0, 0.5]]), tf.constant([[0.0, 0.0]])
      )
    )
  np.testing.assert_allclose(
    loss, _numpy_quantile_huber(target, online, kappa), rtol=1e-5
  )
  np.testing.assert_allclose(single, [0.25])
  np.testing.assert_allclose(pair, [1.3125])


def test_quantile_loss_rejects_negative_kappa():
  with pytest.raises(ValueError, match='kappa'):
    quantile_agent.quantile_huber_loss(tf.zeros([1, 2]), tf.zeros([1, 2]), -1)


def test_quantile_agent_target_and_loss(cartpole_dir):
  with tf.Graph().as_default(), _session() as sess:
    agent = _cartpole_agent(
      sess, 'quantile', cartpole_dir, ['FixedReplayQuantileAgent.num_atoms = 7']
    )
    fetches = dict(
      _replay_fetches(agent),
      train=agent._train_op,
      loss=agent.loss,
      quantiles=agent._replay_net_outputs.quantile_values,
      next_quantiles=agent._replay_next_target_net_outputs.quantile_values,
    )
    runs = [sess.run(fetches) for _ in range(2)]
  for run in runs:
    batch = np.arange(len(run['action']))
    next_action = run['next_quantiles'].mean(axis=2).argmax(axis=1)
    target = (
      run['reward'][:, None]
      + 0.99
      * (1 - run['terminal'][:, None])
      * (run['next_quantiles'][batch, next_action])
    )
    online = run['quantiles'][batch, run['action']]
    assert online.shape == (128, 7)
    expected = _numpy_quantile_huber(target, online, 1.0).mean()
    np.testing.assert_allclose(run['loss'], expected, rtol=1e-5)
  assert runs[0]['loss'] != runs[1]['loss']


# ------------------------------------------------ acting, data, warm start


@pytest.mark.parametrize('agent_name', ['dqn', 'rem', 'quantile'])
def test_acting_never_adds_nor_trains(cartpole_dir, agent_name):
  env = _cartpole()
  env.environment.reset(seed=1)
  with tf.Graph().as_default(), _session() as sess:
    agent = _cartpole_agent(sess, agent_name, cartpole_dir)
    memory = agent.replay.memory
    rows, valid = int(memory.add_count), memory.num_valid_transitions
    before = _trainables(agent)
    actions = []
    for eval_mode in (False, True):  # Dopamine's train mode would add.
      agent.eval_mode = eval_mode
      actions.append(agent.begin_episode(env.reset()))
      for _ in range(30):
        observation, reward, terminal, _ = env.step(actions[-1])
        if terminal:
          break
        actions.append(agent.step(reward, observation))
      agent.end_episode(reward)
    after = _trainables(agent)
    assert agent.training_steps == 0
    assert (int(memory.add_count), memory.num_valid_transitions) == (
      rows,
      valid,
    )
    for a, b in zip(before, after, strict=True):
      np.testing.assert_array_equal(a, b)
    with pytest.raises(NotImplementedError, match='read-only'):
      memory.add(np.zeros((4, 1)), 0, 0.0, False)
  assert set(actions) <= {0, 1}
  assert len(actions) > 2


def test_multi_head_agent_trains_rem_with_stochastic_transform(cartpole_dir):
  # batch_rl's rem.gin: the multi-head agent with transform_strategy
  # 'STOCHASTIC' is REM, here with 3 mixtures per step (batch_rl's
  # num_convex_combinations): each mixture its own TD loss, then the mean.
  gin.parse_config(TEST_DATA)
  with tf.Graph().as_default(), _session() as sess:
    agent = multi_head_dqn_agent.FixedReplayMultiHeadDQNAgent(
      sess,
      2,
      cartpole_dir,
      num_heads=4,
      transform_strategy='STOCHASTIC',
      num_convex_combinations=3,
      observation_shape=CARTPOLE_SHAPE,
      observation_dtype=tf.float64,
      stack_size=CARTPOLE_STACK,
      network=networks.CartpoleMultiHeadQNetwork,
    )
    assert agent.method == 'REM'
    fetches = _rem_fetches(agent)
    runs = [sess.run(fetches) for _ in range(2)]
  assert runs[0]['alpha'].shape == (4, 3)
  np.testing.assert_allclose(runs[0]['alpha'].sum(axis=0), 1.0, rtol=1e-5)
  assert not np.allclose(runs[0]['alpha'], runs[1]['alpha'])
  for run in runs:
    batch = np.arange(len(run['action']))
    q = run['q_heads'] @ run['alpha']  # [batch, actions, 3]
    next_q = run['next_q_heads'] @ run['alpha']
    target = run['reward'][:, None] + 0.99 * next_q.max(axis=1) * (
      1 - run['terminal'][:, None]
    )
    expected = _huber(target - q[batch, run['action']]).mean()
    np.testing.assert_allclose(run['loss'], expected, rtol=1e-5)


def test_multi_network_agent_has_separate_networks(cartpole_dir):
  with tf.Graph().as_default(), _session() as sess:
    agent = _cartpole_agent(
      sess,
      'multi_network_dqn',
      cartpole_dir,
      ["FixedReplayMultiNetworkDQNAgent.transform_strategy = 'IDENTITY'"],
    )
    assert agent.method == 'Ensemble-DQN over 4 separate networks'
    names = {v.name for v in tf.compat.v1.trainable_variables(scope='Online')}
    for i in range(4):  # Each network its own weights, nothing shared.
      assert any(f'subnet_{i}/' in name for name in names), names
    fetches = dict(
      _replay_fetches(agent),
      train=agent._train_op,
      loss=agent.loss,
      q_heads=agent._replay_net_outputs.q_heads,
      q_values=agent._replay_net_outputs.q_values,
      next_q_heads=agent._replay_next_target_net_outputs.q_heads,
    )
    run = sess.run(fetches)
  assert run['q_heads'].shape == (128, 2, 4)
  np.testing.assert_allclose(
    run['q_values'], run['q_heads'].mean(axis=-1), rtol=1e-5, atol=1e-6
  )
  batch = np.arange(len(run['action']))
  target = run['reward'][:, None] + 0.99 * run['next_q_heads'].max(axis=1) * (
    1 - run['terminal'][:, None]
  )
  expected = _huber(target - run['q_heads'][batch, run['action']]).mean()
  np.testing.assert_allclose(run['loss'], expected, rtol=1e-5)


def test_batch_rl_arguments_are_checked(cartpole_dir):
  gin.parse_config(TEST_DATA)
  with tf.Graph().as_default(), _session() as sess:
    with pytest.raises(ValueError, match="'IDENTITY' .* or 'STOCHASTIC'"):
      multi_head_dqn_agent.FixedReplayMultiHeadDQNAgent(
        sess, 2, cartpole_dir, transform_strategy='UNIFORM'
      )
    with pytest.raises(ValueError, match="only 'uniform'"):
      quantile_agent.FixedReplayQuantileAgent(
        sess, 2, cartpole_dir, replay_scheme='prioritized'
      )


def test_gpu_device_without_gpu_builds_on_cpu(cartpole_dir):
  assert not tf.config.list_physical_devices('GPU')  # This machine.
  with tf.Graph().as_default(), _session() as sess:
    agent = _cartpole_agent(
      sess, 'dqn', cartpole_dir, ["FixedReplayDQNAgent.tf_device = '/gpu:0'"]
    )
    devices = {op.device for op in sess.graph.get_operations()}
  assert not any('gpu' in d.lower() for d in devices), devices
  assert agent.method == 'DQN'
