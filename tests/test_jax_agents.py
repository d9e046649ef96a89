"""Offline JAX agents built from their gin configs, trained on real data.

Atari configs train on Dopamine-written Pong checkpoints (the session
fixture); loss checks use a small CartPole dataset written with Dopamine's
own OutOfGraphReplayBuffer from the real game. Dopamine's own JAX train
functions are the oracles for the base losses.
"""

# ruff: noqa: I001  (fixed_replay must be imported before Dopamine)
import gc
import math
import os
import pickle
import threading
import time

import fixed_replay  # noqa: F401
from dopamine.discrete_domains import atari_lib
from dopamine.discrete_domains import checkpointer
from dopamine.discrete_domains import gym_lib
from dopamine.jax.agents.dqn import dqn_agent
from dopamine.jax.agents.quantile import quantile_agent
import gin
import jax
import numpy as np
import optax
import pytest

from fixed_replay import agents
from fixed_replay import gin_files
from fixed_replay.errors import CheckpointError
from fixed_replay import prefetch
from fixed_replay.training import run_experiment
from fixed_replay.agents.jax import cql_agent as jax_cql_agent
from fixed_replay.agents.jax import offline as jax_offline
from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, 'configs')
AGENT_CLASSES = {
  'jax_dqn': ('FixedReplayJaxDQNAgent', dqn_agent.JaxDQNAgent),
  'jax_quantile': (
    'FixedReplayJaxQuantileAgent',
    quantile_agent.JaxQuantileAgent,
  ),
  'jax_rem': ('FixedReplayJaxREMAgent', dqn_agent.JaxDQNAgent),
  'jax_cql': ('FixedReplayJaxCQLAgent', dqn_agent.JaxDQNAgent),
  'jax_quantile_cql': (
    'FixedReplayJaxQuantileCQLAgent',
    quantile_agent.JaxQuantileAgent,
  ),
}
NAMES = list(AGENT_CLASSES)
# Bindings that keep the Atari networks small; the rest is the config's.
SMALL = {
  'jax_rem': ['FixedReplayJaxREMAgent.num_heads = 3'],
  'jax_quantile': ['FixedReplayJaxQuantileAgent.num_atoms = 5'],
  'jax_quantile_cql': ['FixedReplayJaxQuantileCQLAgent.num_atoms = 5'],
}
TEST_DATA = [
  'FixedReplayBuffer.num_buffers_to_load = 2',
  'FixedReplayBuffer.prefetch = False',
  'FixedReplayBuffer.seed = 0',
]
CARTPOLE_ROWS = 700
CARTPOLE_SHAPE = (4, 1)


@pytest.fixture(autouse=True)
def _clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _parse(config, bindings=()):
  gin.clear_config()  # Each agent gets exactly these bindings.
  gin_files.load_gin_configs(
    [os.path.join(CONFIGS, config)], list(bindings), finalize_config=False
  )


def _cartpole():
  return gym_lib.create_gym_environment('CartPole', 'v0')


def _cartpole_agent(agent_name, directory, bindings=(), **kwargs):
  """An agent from configs/cartpole/<agent_name>.gin on the test data."""
  agents.agent_class(agent_name)
  _parse(
    os.path.join('cartpole', f'{agent_name}.gin'),
    TEST_DATA + ['FixedReplayBuffer.batch_size = 32'] + list(bindings),
  )
  return agents.create_agent(
    None, _cartpole(), agent_name, replay_data_dir=directory, **kwargs
  )


def _leaves(tree):
  return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


def _assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(_leaves(a), _leaves(b), strict=True):
    np.testing.assert_array_equal(x, y)


def _changed(a, b):
  return any(
    not np.array_equal(x, y)
    for x, y in zip(_leaves(a), _leaves(b), strict=True)
  )


def _huber(x):
  return np.where(np.abs(x) <= 1.0, 0.5 * x**2, np.abs(x) - 0.5)


def _outputs(agent, params, states):
  """The agent's network outputs on a batch of states, as numpy."""
  outputs = jax.vmap(lambda s: agent.network_def.apply(params, s))(states)
  return jax.tree.map(np.asarray, outputs)


def _batch(agent):
  return {k: np.asarray(v) for k, v in agent.replay_elements.items()}


# ------------------------------------------------------------------ registry


def test_registry_names_classes_and_bases():
  for name, (class_name, base) in AGENT_CLASSES.items():
    cls = agents.agent_class(name)
    assert cls.__name__ == class_name
    assert issubclass(cls, jax_offline.JaxOfflineAgent)
    assert issubclass(cls, base)


# ------------------------------------------------------- published settings


@pytest.mark.parametrize(
  'config, agent_name',
  [
    (f'{name}{subset}.gin', name)
    for name in NAMES
    for subset in ('', '_1pct', '_10pct')
  ],
)
def test_configs_hold_published_settings(config, agent_name):
  agents.agent_class(agent_name)
  _parse(config)
  agent = AGENT_CLASSES[agent_name][0]
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
  if agent_name in ('jax_dqn', 'jax_cql'):
    assert query(f'{agent}.loss_type') == 'huber'
    assert query('optax.rmsprop.learning_rate') == 0.00025
    assert query('optax.rmsprop.decay') == 0.95
    assert query('optax.rmsprop.eps') == 0.00001
    assert query('optax.rmsprop.centered') is True
    assert query('optax.rmsprop.initial_scale') == 1.0
  else:
    assert query(f'{agent}.optimizer') == 'adam'
    assert query('create_optimizer.learning_rate') == 0.00005
    assert query('create_optimizer.eps') == 0.0003125
  if agent_name == 'jax_rem':
    assert query(f'{agent}.num_heads') == 200
  if 'quantile' in agent_name:
    assert query(f'{agent}.num_atoms') == 200
    assert query(f'{agent}.kappa') == 1.0
    assert query(f'{agent}.replay_scheme') == 'uniform'
  if 'cql' in agent_name:
    assert query(f'{agent}.cql_alpha') == (4.0 if '1pct' in config else 1.0)
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


# The other two agents share these networks and optimizers (their losses are
# checked on CartPole below).
@pytest.mark.parametrize(
  'config, agent_name',
  [
    ('jax_dqn.gin', 'jax_dqn'),
    ('jax_rem_1pct.gin', 'jax_rem'),
    ('jax_quantile_cql.gin', 'jax_quantile_cql'),
  ],
)
def test_atari_config_builds_and_trains(dopamine_dir, config, agent_name):
  directory, _, _ = dopamine_dir
  agents.agent_class(agent_name)
  _parse(config, SMALL.get(agent_name, []) + TEST_DATA)
  environment = atari_lib.create_atari_environment('Pong')
  agent = agents.create_agent(None, environment, agent_name, str(directory))
  try:
    assert type(agent).__name__ == AGENT_CLASSES[agent_name][0]
    assert agent.num_actions == environment.action_space.n
    assert agent.min_replay_history == 0
    assert (agent.update_period, agent.target_update_period) == (4, 8000)
    assert agent.epsilon_eval == 0.001
    assert len(agent.replay.loaded_suffixes) == 2
    assert agent.replay.batch_size == 32
    # jax_rem_1pct.gin: the first 1% of the rows of each checkpoint.
    replay = agent.replay
    assert replay.shard(replay.loaded_suffixes[0]).window.num_rows == (
      10 if '1pct' in config else 1000
    )
    if agent_name in ('jax_dqn', 'jax_cql'):
      # TF1's RMSProp: the mean square starts at 1.
      assert isinstance(agent.optimizer, optax.GradientTransformation)
      nu = [
        leaf
        for state in jax.tree.leaves(
          agent.optimizer_state,
          is_leaf=lambda x: isinstance(x, optax.ScaleByRStdDevState),
        )
        if isinstance(state, optax.ScaleByRStdDevState)
        for leaf in jax.tree.leaves(state.nu)
      ]
      assert nu and all(np.all(np.asarray(n) == 1.0) for n in nu)
    before = agent.online_params
    values = []
    for step in range(2 * agent.update_period):  # Two gradient updates.
      agent.train_step()
      if step % agent.update_period == 0:
        values.append(float(next(iter(agent.last_losses.values()))))
    assert agent.training_steps == 8
    assert agent.replay_batches == 2
    assert _changed(before, agent.online_params)
  finally:
    agent.close()
  assert len(values) == 2
  assert np.all(np.isfinite(values)) and values[0] != values[1], values


# ------------------------------------------------- CartPole: loss, resume


@pytest.mark.parametrize('agent_name', NAMES)
def test_cartpole_loss_is_finite_and_changes(cartpole_dir, agent_name):
  agent = _cartpole_agent(agent_name, cartpole_dir)
  try:
    before = agent.online_params
    losses = []
    for _ in range(6):
      agent.train_step()
      losses.append({k: float(v) for k, v in agent.last_losses.items()})
  finally:
    agent.close()
  assert _changed(before, agent.online_params)
  for name in losses[0]:
    series = [loss[name] for loss in losses]
    assert np.all(np.isfinite(series)), (name, series)
    assert len(set(series)) > 1, (name, series)


@pytest.mark.parametrize(
  'agent_name', ['jax_dqn', 'jax_rem', 'jax_quantile_cql']
)
def test_resume_restores_parameters_and_optimizer_state(
  cartpole_dir, tmp_path, agent_name
):
  trained = _cartpole_agent(agent_name, cartpole_dir)
  fresh = _cartpole_agent(
    agent_name, cartpole_dir, [f'{AGENT_CLASSES[agent_name][0]}.seed = 7']
  )
  try:
    for _ in range(5):
      trained.train_step()
    # Through Dopamine's Checkpointer (pickle files), as the runner does.
    saver = checkpointer.Checkpointer(str(tmp_path))
    saver.save_checkpoint(3, trained.bundle_and_checkpoint(str(tmp_path), 3))
    assert _changed(trained.online_params, fresh.online_params)
    assert fresh.unbundle(str(tmp_path), 3, saver.load_checkpoint(3))
    _assert_trees_equal(fresh.online_params, trained.online_params)
    _assert_trees_equal(
      fresh.target_network_params, trained.target_network_params
    )
    _assert_trees_equal(fresh.optimizer_state, trained.optimizer_state)
    _assert_trees_equal(fresh._rng, trained._rng)
    assert fresh.training_steps == trained.training_steps == 5
    # The same batch now gives the same update (REM: the same mixture).
    trained._sample_from_replay_buffer()
    fresh.replay_elements = trained.replay_elements
    trained._update()
    fresh._update()
    _assert_trees_equal(fresh.online_params, trained.online_params)
    _assert_trees_equal(fresh.optimizer_state, trained.optimizer_state)
  finally:
    trained.close()
    fresh.close()


def test_runner_trains_checkpoints_and_resumes(cartpole_dir, tmp_path):
  base_dir = str(tmp_path / 'run')
  bindings = TEST_DATA + [
    'FixedReplayBuffer.batch_size = 32',
    'FixedReplayJaxREMAgent.summary_writing_frequency = 4',
    'FixedReplayRunner.training_steps = 20',
    'FixedReplayRunner.evaluation_steps = 20',
  ]
  config = [os.path.join(CONFIGS, 'cartpole', 'jax_rem.gin')]

  def make(num_iterations):
    gin.clear_config()
    return run_experiment.create_runner(
      base_dir,
      agent_name='jax_rem',
      replay_dir=cartpole_dir,
      gin_files=config,
      gin_bindings=bindings
      + [f'FixedReplayRunner.num_iterations = {num_iterations}'],
    )

  first = make(1)
  first.run_experiment()
  saved = first.agent
  saved.close()
  second = make(2)
  try:
    assert second.start_iteration == 1
    assert second.agent.training_steps == 20
    _assert_trees_equal(second.agent.online_params, saved.online_params)
    _assert_trees_equal(second.agent.optimizer_state, saved.optimizer_state)
    second.run_experiment()
    assert second.agent.training_steps == 40
  finally:
    second.agent.close()
  with open(os.path.join(base_dir, 'logs', 'log_1'), 'rb') as f:
    logged = pickle.load(f)
  for iteration in (0, 1):
    stats = logged[f'iteration_{iteration}']
    assert np.isfinite(stats['train_average_HuberLoss'][0])
    assert sum(stats['eval_episode_lengths']) >= 20
    # The runner records how long training waited on minibatches.
    wait = stats['train_replay_wait_seconds'][0]
    assert 0 <= wait <= stats['train_seconds'][0]


# --------------------------------------------------------------- REM, CQL


def test_rem_mixing_weights_are_fresh_convex_and_used(cartpole_dir):
  agent = _cartpole_agent('jax_rem', cartpole_dir)
  try:
    assert agent.num_heads == 10
    runs = []
    for _ in range(3):
      agent._sample_from_replay_buffer()
      batch = _batch(agent)
      params, target = agent.online_params, agent.target_network_params
      loss = float(agent._update()['HuberLoss'])
      heads = _outputs(agent, params, batch['state']).q_heads
      next_heads = _outputs(agent, target, batch['next_state']).q_heads
      runs.append(
        (np.asarray(agent.mixing_weights), loss, batch, heads, next_heads)
      )
  finally:
    agent.close()
  alphas = np.array([run[0] for run in runs])
  assert alphas.shape == (3, 10)
  assert np.all(alphas >= 0)
  np.testing.assert_allclose(alphas.sum(axis=1), 1.0, rtol=1e-5)
  assert not np.allclose(alphas[0], alphas[1])
  assert not np.allclose(alphas[1], alphas[2])
  for alpha, loss, batch, heads, next_heads in runs:
    # The same alpha mixes the online AND the target heads.
    rows = np.arange(len(batch['action']))
    q = (heads @ alpha)[rows, batch['action']]
    target = batch['reward'] + 0.99 * (next_heads @ alpha).max(axis=1) * (
      1 - batch['terminal']
    )
    mixed = _huber(target - q).mean()
    np.testing.assert_allclose(loss, mixed, rtol=1e-5)
    uniform = np.full_like(alpha, 1 / alpha.size)
    other = batch['reward'] + 0.99 * (next_heads @ uniform).max(axis=1) * (
      1 - batch['terminal']
    )
    # Near initialisation the heads barely differ, so uniform weights can
    # give a loss within 1e-5 of the agent's by chance (5.6e-6 was seen):
    # the agent's weights must explain its loss better than uniform ones.
    assert abs(loss - mixed) < abs(loss - _huber(other - q).mean())


def test_rem_acts_on_the_mean_of_its_heads(cartpole_dir):
  agent = _cartpole_agent('jax_rem', cartpole_dir)
  agent.close()
  state = np.random.default_rng(0).normal(size=agent.state.shape)
  outputs = agent.network_def.apply(agent.online_params, state)
  np.testing.assert_allclose(
    outputs.q_values,
    np.asarray(outputs.q_heads).mean(axis=-1),
    rtol=1e-5,
    atol=1e-6,
  )


def test_cql_penalty_matches_a_hand_computed_value():
  q_values = np.array([[1.0, 2.0, 3.0], [0.5, -1.0, 0.0]], np.float32)
  actions = np.array([2, 0], np.int32)
  by_hand = [
    math.log(math.exp(1.0) + math.exp(2.0) + math.exp(3.0)) - 3.0,
    math.log(math.exp(0.5) + math.exp(-1.0) + math.exp(0.0)) - 0.5,
  ]
  penalty = jax_cql_agent.cql_penalty(q_values, actions)
  np.testing.assert_allclose(penalty, by_hand, rtol=1e-6)
  np.testing.assert_allclose(penalty, [0.40760596, 0.60413063], rtol=1e-6)
  # Equal Q-values: the penalty is log(num_actions) whatever the action.
  flat = jax_cql_agent.cql_penalty(np.zeros((1, 4), np.float32), np.array([1]))
  np.testing.assert_allclose(flat, [math.log(4)], rtol=1e-6)


def test_dqn_cql_loss_is_dopamine_td_loss_plus_alpha_penalty(cartpole_dir):
  agent = _cartpole_agent(
    'jax_cql', cartpole_dir, ['FixedReplayJaxCQLAgent.cql_alpha = 2.5']
  )
  try:
    agent._sample_from_replay_buffer()
    batch = _batch(agent)
    elements = agent.replay_elements
    params = agent.online_params
    _, _, dopamine_loss = dqn_agent.train(
      agent.network_def,
      params,
      agent.target_network_params,
      agent.optimizer,
      agent.optimizer_state,
      elements['state'],
      elements['action'],
      elements['next_state'],
      elements['reward'],
      elements['terminal'],
      agent.cumulative_gamma,
      'huber',
    )
    losses = {k: float(v) for k, v in agent._update().items()}
  finally:
    agent.close()
  q_values = _outputs(agent, params, batch['state']).q_values
  rows = np.arange(len(batch['action']))
  chosen = q_values[rows, batch['action']]
  logsumexp = np.log(np.exp(q_values.astype(np.float64)).sum(axis=1))
  penalty = np.mean(logsumexp - chosen)
  np.testing.assert_allclose(losses['HuberLoss'], dopamine_loss, rtol=1e-5)
  np.testing.assert_allclose(losses['CQLLoss'], penalty, rtol=1e-5)
  np.testing.assert_allclose(
    losses['Loss'], losses['HuberLoss'] + 2.5 * penalty, rtol=1e-5
  )
  assert penalty > 0


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
        rho = 0.5 * u * u if abs(u) <= kappa else kappa * (abs(u) - 0.5 * kappa)
        terms.append(abs(tau - (u < 0)) * rho)
      losses[b] += np.mean(terms)
  return losses


@pytest.mark.parametrize('kappa', [1.0, 0.5])
def test_quantile_huber_loss_matches_formula(kappa):
  rng = np.random.default_rng(1)
  target = rng.normal(scale=2.0, size=(3, 4)).astype(np.float32)
  online = rng.normal(scale=2.0, size=(3, 5)).astype(np.float32)
  loss = jax_cql_agent.quantile_huber_loss(target, online, kappa)
  np.testing.assert_allclose(
    loss, _numpy_quantile_huber(target, online, kappa), rtol=1e-5
  )
  # Two quantiles at 0 (tau_hat 1/4, 3/4), targets -3 and 0.5, kappa 1:
  # i=0: (|0.25 - 1| * 2.5 + 0.25 * 0.125) / 2 = 0.953125
  # i=1: (|0.75 - 1| * 2.5 + 0.75 * 0.125) / 2 = 0.359375
  pair = jax_cql_agent.quantile_huber_loss(
    np.array([[-3.0, 0.5]]), np.array([[0.0, 0.0]]), 1.0
  )
  np.testing.assert_allclose(pair, [1.3125])


def test_quantile_cql_loss_is_dopamine_loss_plus_alpha_penalty(cartpole_dir):
  agent = _cartpole_agent(
    'jax_quantile_cql',
    cartpole_dir,
    ['FixedReplayJaxQuantileCQLAgent.num_atoms = 7'],
  )
  try:
    agent._sample_from_replay_buffer()
    batch = _batch(agent)
    elements = agent.replay_elements
    params = agent.online_params
    *_, dopamine_loss = quantile_agent.train(
      agent.network_def,
      params,
      agent.target_network_params,
      agent.optimizer,
      agent.optimizer_state,
      elements['state'],
      elements['action'],
      elements['next_state'],
      elements['reward'],
      elements['terminal'],
      agent.kappa,
      agent.num_atoms,
      agent.cumulative_gamma,
    )
    losses = {k: float(v) for k, v in agent._update().items()}
  finally:
    agent.close()
  outputs = _outputs(agent, params, batch['state'])
  assert outputs.logits.shape == (32, 2, 7)
  q_values = outputs.logits.mean(axis=2)
  rows = np.arange(len(batch['action']))
  logsumexp = np.log(np.exp(q_values.astype(np.float64)).sum(axis=1))
  penalty = np.mean(logsumexp - q_values[rows, batch['action']])
  np.testing.assert_allclose(losses['QuantileLoss'], dopamine_loss, rtol=1e-5)
  np.testing.assert_allclose(losses['CQLLoss'], penalty, rtol=1e-5)
  np.testing.assert_allclose(
    losses['Loss'], losses['QuantileLoss'] + penalty, rtol=1e-5
  )


def test_quantile_agents_refuse_prioritized_replay(cartpole_dir):
  with pytest.raises(ValueError, match="only 'uniform'"):
    _cartpole_agent(
      'jax_quantile',
      cartpole_dir,
      ["FixedReplayJaxQuantileAgent.replay_scheme = 'prioritized'"],
    )


# ------------------------------------------------ acting, data, warm start


@pytest.mark.parametrize('agent_name', ['jax_rem', 'jax_quantile'])
def test_acting_never_adds_nor_trains(cartpole_dir, agent_name):
  env = _cartpole()
  env.environment.reset(seed=1)
  agent = _cartpole_agent(agent_name, cartpole_dir)
  try:
    memory = agent.replay
    rows, valid = int(memory.add_count), memory.num_valid_transitions
    before = agent.online_params
    actions = []
    for eval_mode in (False, True):  # Dopamine's train mode would add.
      agent.eval_mode = eval_mode
      actions.append(int(agent.begin_episode(env.reset())))
      for _ in range(30):
        observation, reward, terminal, _ = env.step(actions[-1])
        if terminal:
          break
        actions.append(int(agent.step(reward, observation)))
      agent.end_episode(reward)
    assert agent.training_steps == 0
    assert agent.replay_batches == 0
    assert (int(memory.add_count), memory.num_valid_transitions) == (
      rows,
      valid,
    )
    _assert_trees_equal(before, agent.online_params)
    with pytest.raises(NotImplementedError, match='read-only'):
      memory.add(np.zeros(CARTPOLE_SHAPE), 0, 0.0, False)
  finally:
    agent.close()
  assert set(actions) <= {0, 1}
  assert len(actions) > 2


def _runner(base_dir, directory, num_iterations, bindings=(), **kwargs):
  gin.clear_config()
  return run_experiment.create_runner(
    base_dir,
    agent_name='jax_rem',
    replay_dir=directory,
    gin_files=[os.path.join(CONFIGS, 'cartpole', 'jax_rem.gin')],
    gin_bindings=TEST_DATA
    + [
      'FixedReplayBuffer.batch_size = 32',
      'FixedReplayRunner.training_steps = 10',
      'FixedReplayRunner.evaluation_steps = 10',
      f'FixedReplayRunner.num_iterations = {num_iterations}',
    ]
    + list(bindings),
    **kwargs,
  )


def test_init_checkpoint_dir_continues_another_run(cartpole_dir, tmp_path):
  # batch_rl's --init_checkpoint_dir: a new base_dir starts from the other
  # run's latest checkpoint (parameters, optimizer state, training steps,
  # history) and goes on from its next iteration.
  first = _runner(str(tmp_path / 'first'), cartpole_dir, 1)
  first.run_experiment()
  first.agent.close()
  for init_dir in (tmp_path / 'first', tmp_path / 'first' / 'checkpoints'):
    second = _runner(
      str(tmp_path / init_dir.name / 'second'),
      cartpole_dir,
      2,
      init_checkpoint_dir=str(init_dir),
    )
    try:
      assert second.start_iteration == 1
      assert second.agent.training_steps == 10
      _assert_trees_equal(second.agent.online_params, first.agent.online_params)
      _assert_trees_equal(
        second.agent.optimizer_state, first.agent.optimizer_state
      )
    finally:
      second.agent.close()


def test_init_checkpoint_dir_refuses_missing_or_mismatched_checkpoints(
  cartpole_dir, tmp_path
):
  with pytest.raises(CheckpointError, match='no complete Dopamine agent'):
    _runner(
      str(tmp_path / 'run'), cartpole_dir, 1, init_checkpoint_dir=str(tmp_path)
    )
  other = _runner(
    str(tmp_path / 'other'),
    cartpole_dir,
    1,
    ['FixedReplayJaxREMAgent.num_heads = 4'],
  )
  other.run_experiment()
  other.agent.close()
  with pytest.raises(ValueError, match='do not fit'):
    _runner(
      str(tmp_path / 'run2'),
      cartpole_dir,
      2,
      init_checkpoint_dir=str(tmp_path / 'other'),
    )


# ------------------------------------------------------ background batches


def _buffer(directory):
  return FixedReplayBuffer(
    directory,
    observation_shape=CARTPOLE_SHAPE,
    stack_size=1,
    observation_dtype=np.float64,
    batch_size=16,
    num_buffers_to_load=2,
    prefetch=False,
    seed=3,
  )


def test_prefetched_batches_are_the_buffer_batches_in_order(cartpole_dir):
  expected_buffer, buffer = _buffer(cartpole_dir), _buffer(cartpole_dir)
  expected = [expected_buffer.sample() for _ in range(5)]
  with prefetch.BatchPrefetcher(buffer.sample, depth=2) as prefetcher:
    got = [prefetcher.get() for _ in range(5)]
    assert prefetcher.batches == 5
    assert prefetcher.wait_seconds >= 0
  assert not prefetcher.running
  with pytest.raises(RuntimeError, match='closed'):
    prefetcher.get()
  for a, b in zip(expected, got, strict=True):
    assert a.state.shape == b.state.shape == (16, 4, 1, 1)
    for field in ('state', 'action', 'reward', 'next_state', 'is_terminal'):
      np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
  expected_buffer.close()
  buffer.close()


def test_prefetcher_drops_batches_drawn_before_a_pause():
  source = {'offset': 0, 'count': 0}

  def sample():
    source['count'] += 1
    return source['offset'] + source['count']

  prefetcher = prefetch.BatchPrefetcher(sample, depth=3)
  try:
    assert prefetcher.get() == 1
    deadline = time.time() + 5
    while source['count'] < 4 and time.time() < deadline:
      time.sleep(0.01)  # Let the queue fill with batches 2, 3, 4.
    with prefetcher.paused():
      count = source['count']
      source['offset'] = 1000
    assert prefetcher.get() == 1000 + count + 1
  finally:
    prefetcher.close()
  assert not prefetcher.running


def test_prefetcher_hands_over_errors_and_stops_when_abandoned():
  def broken():
    raise OSError('disk gone')

  failing = prefetch.BatchPrefetcher(broken)
  with pytest.raises(OSError, match='disk gone'):
    failing.get()
  failing.close()
  with pytest.raises(ValueError, match='depth'):
    prefetch.BatchPrefetcher(lambda: 0, depth=0)

  abandoned = prefetch.BatchPrefetcher(lambda: np.zeros(3), depth=1)
  thread = abandoned._thread
  del abandoned
  gc.collect()
  thread.join(2.0)
  assert not thread.is_alive()


def test_agent_prefetching_matches_foreground_sampling(cartpole_dir):
  # One checkpoint at a time, the next one loading in the background: the
  # buffer's loader thread and the agent's batch thread run together.
  data = [
    'FixedReplayBuffer.num_buffers_to_load = 1',
    'FixedReplayBuffer.prefetch = True',
  ]
  ahead = _cartpole_agent(
    'jax_dqn',
    cartpole_dir,
    data + ['FixedReplayJaxDQNAgent.prefetch_batches = 3'],
  )
  inline = _cartpole_agent(
    'jax_dqn',
    cartpole_dir,
    data + ['FixedReplayJaxDQNAgent.prefetch_batches = 0'],
  )
  try:
    assert ahead._prefetcher.running and inline._prefetcher is None
    for _ in range(4):
      ahead._sample_from_replay_buffer()
      inline._sample_from_replay_buffer()
      _assert_trees_equal(ahead.replay_elements, inline.replay_elements)
      assert isinstance(ahead.replay_elements['state'], jax.Array)
    assert ahead.replay_batches == inline.replay_batches == 4
    assert inline.replay_wait_seconds > 0
    # Swapping data under a running prefetcher: batches keep coming.
    for _ in range(3):
      ahead.reload_data()
      ahead.train_step()
      assert len(ahead.replay.loaded_suffixes) == 1
      assert ahead.replay_elements['state'].shape == (32, 4, 1, 1)
    assert ahead.replay_batches == 7
    ahead.reset_replay_wait()
    assert ahead.replay_batches == 0 and ahead.replay_wait_seconds == 0
  finally:
    ahead.close()
    inline.close()
  assert not ahead._prefetcher.running
  names = [t.name for t in threading.enumerate()]
  assert 'FixedReplayJaxDQNAgent_prefetch' not in names
