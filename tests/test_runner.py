"""FixedReplayRunner on Dopamine's CartPole with a Dopamine-written dataset."""

# ruff: noqa: I001  (fixed_replay must be imported before Dopamine)
import collections
import functools
import os
import pickle
import subprocess
import sys

import dopamine_data
import fixed_replay  # noqa: F401
from dopamine.discrete_domains import gym_lib
from dopamine.metrics import collector_dispatcher
from dopamine.metrics import statistics_instance
from dopamine.tf.agents.dqn import dqn_agent
import gin
import numpy as np
import pytest
import tensorflow as tf

from fixed_replay import agents
from fixed_replay import progress
from fixed_replay import WrappedFixedReplayBuffer
from fixed_replay.sources import layout
from fixed_replay.errors import CheckpointError
from fixed_replay.training import plotting
from fixed_replay.training import reporting
from fixed_replay.training import run_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
CAPACITY = 500

# Dopamine's CartPole settings for DQN (its dqn_cartpole.gin), made tiny.
AGENT_BINDINGS = [
  'DQNAgent.observation_shape = %gym_lib.CARTPOLE_OBSERVATION_SHAPE',
  'DQNAgent.observation_dtype = %gym_lib.CARTPOLE_OBSERVATION_DTYPE',
  'DQNAgent.stack_size = %gym_lib.CARTPOLE_STACK_SIZE',
  'DQNAgent.network = @gym_lib.CartpoleDQNNetwork',
  'DQNAgent.target_update_period = 8',
  # Losses reach the summary writer (and the runner's per-iteration mean)
  # every 4 steps.
  'DQNAgent.summary_writing_frequency = 4',
  f'WrappedFixedReplayBuffer.replay_capacity = {CAPACITY}',
  'FixedReplayBuffer.num_buffers_to_load = 1',
]


@pytest.fixture(scope='module')
def replay_run(tmp_path_factory):
  """A run directory whose replay_logs/ holds two CartPole checkpoints.

  Written by Dopamine's OutOfGraphReplayBuffer from random play in
  Dopamine's CartPole environment (dopamine_data.write_cartpole_run).
  """
  run_dir = tmp_path_factory.mktemp('cartpole_data')
  replay_logs = run_dir / 'replay_logs'
  replay_logs.mkdir()
  dopamine_data.write_cartpole_run(replay_logs, CAPACITY)
  return run_dir


@pytest.fixture(autouse=True)
def fresh_gin():
  gin.clear_config()
  yield
  gin.clear_config()


class CountingEnvironment:
  """A real environment that counts its calls by the agent's mode."""

  def __init__(self, environment):
    self._environment = environment
    self.agent = None
    self.calls = collections.Counter()

  def _count(self, name):
    phase = 'eval' if self.agent.eval_mode else 'train'
    self.calls[phase, name] += 1

  def reset(self):
    self._count('reset')
    return self._environment.reset()

  def step(self, action):
    self._count('step')
    return self._environment.step(action)

  def __getattr__(self, name):
    return getattr(self._environment, name)


def make_runner(base_dir, replay_dir, init_checkpoint_dir=None, **kwargs):
  """A FixedReplayRunner on counted CartPole; returns it once built."""
  agents.agent_class('dqn')
  gin.parse_config(AGENT_BINDINGS)
  create_agent_fn = functools.partial(
    agents.create_agent,
    agent_name='dqn',
    replay_data_dir=layout.detect(replay_dir).data_dir,
    init_checkpoint_dir=init_checkpoint_dir,
  )
  runner = run_experiment.FixedReplayRunner(
    str(base_dir),
    create_agent_fn,
    create_environment_fn=lambda: CountingEnvironment(
      gym_lib.create_gym_environment('CartPole')
    ),
    max_steps_per_episode=200,
    **kwargs,
  )
  runner.environment.agent = runner.agent
  return runner


def online_weights(agent):
  """{name: value} of the agent's online network variables."""
  variables = [
    v
    for v in agent._sess.graph.get_collection('variables')
    if v.name.startswith('Online')
  ]
  assert variables
  return agent._sess.run({v.name: v for v in variables})


def summaries(base_dir):
  """{tag: {step: value}} of the scalar summaries in base_dir's events."""
  found = collections.defaultdict(dict)
  for name in os.listdir(base_dir):
    if not name.startswith('events.out.tfevents'):
      continue
    path = os.path.join(base_dir, name)
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.WhichOneof('value') == 'simple_value':
          found[value.tag][event.step] = value.simple_value
  return found


def test_two_iterations_train_offline_and_write_everything(
  replay_run, tmp_path
):
  base_dir = tmp_path / 'run'
  with tf.Graph().as_default():
    runner = make_runner(
      base_dir,
      replay_run,
      num_iterations=2,
      training_steps=40,
      evaluation_steps=60,
    )
    agent = runner.agent
    reloads = []
    reload_data = agent.reload_data
    agent.reload_data = lambda: (reloads.append(1), reload_data())
    runner.run_experiment()

  # Training never touched the game; evaluation played whole episodes.
  calls = runner.environment.calls
  assert calls['train', 'step'] == calls['train', 'reset'] == 0
  assert calls['eval', 'step'] >= 2 * 60
  assert calls['eval', 'reset'] >= 2
  assert agent.training_steps == 2 * 40
  assert agent.eval_mode
  # The first iteration used the set loaded at construction.
  assert len(reloads) == 1

  checkpoints = set(os.listdir(base_dir / 'checkpoints'))
  for iteration in (0, 1):
    assert f'sentinel_checkpoint_complete.{iteration}' in checkpoints
    assert f'ckpt.{iteration}' in checkpoints
    assert f'tf_ckpt-{iteration}.index' in checkpoints

  with open(base_dir / 'logs' / 'log_1', 'rb') as f:
    logged = pickle.load(f)
  assert set(logged) == {'iteration_0', 'iteration_1'}
  for iteration in (0, 1):
    stats = logged[f'iteration_{iteration}']
    returns = stats['eval_episode_returns']
    assert sum(stats['eval_episode_lengths']) >= 60
    assert stats['eval_average_return'] == [pytest.approx(np.mean(returns))]
    assert stats['train_average_steps_per_second'][0] > 0
    assert stats['train_seconds'][0] > 0
    assert np.isfinite(stats['train_average_HuberLoss'][0])
  assert logged['iteration_0']['reload_seconds'] == [0.0]

  scalars = summaries(base_dir)
  for tag in (
    'Eval/AverageReturns',
    'Eval/NumEpisodes',
    'Train/AverageStepsPerSecond',
    'Train/HuberLoss',
    'Time/TrainSeconds',
    'Time/ReloadSeconds',
    'Time/EvalSeconds',
  ):
    assert set(scalars[tag]) == {0, 1}, tag
  assert scalars['Eval/NumEpisodes'][1] == len(
    logged['iteration_1']['eval_episode_returns']
  )
  assert scalars['Eval/AverageReturns'][1] == pytest.approx(
    logged['iteration_1']['eval_average_return'][0]
  )
  # The agent's own loss summaries still reach the event file.
  assert scalars['Losses/HuberLoss']

  iterations, returns = plotting.load_eval_returns(base_dir)
  np.testing.assert_array_equal(iterations, [0, 1])
  np.testing.assert_allclose(
    returns,
    [logged[f'iteration_{i}']['eval_average_return'][0] for i in (0, 1)],
  )


def test_interrupted_run_resumes_iteration_and_weights(replay_run, tmp_path):
  base_dir = tmp_path / 'run'
  with tf.Graph().as_default():
    first = make_runner(
      base_dir,
      replay_run / 'replay_logs',
      num_iterations=1,
      training_steps=40,
      evaluation_steps=20,
    )
    first.run_experiment()
    saved = online_weights(first.agent)
    saved_training_steps = first.agent.training_steps

  gin.clear_config()
  with tf.Graph().as_default():
    second = make_runner(
      base_dir,
      replay_run,
      num_iterations=2,
      training_steps=40,
      evaluation_steps=20,
    )
    assert second.start_iteration == 1
    assert second.agent.training_steps == saved_training_steps == 40
    restored = online_weights(second.agent)
    assert restored.keys() == saved.keys()
    for name, value in saved.items():
      np.testing.assert_array_equal(restored[name], value, err_msg=name)
    second.run_experiment()
    assert second.agent.training_steps == 80
    assert second.environment.calls['train', 'step'] == 0

  with open(base_dir / 'logs' / 'log_1', 'rb') as f:
    logged = pickle.load(f)
  # The logger's history came back with the checkpoint.
  assert set(logged) == {'iteration_0', 'iteration_1'}
  # The resumed process swapped in the next set first, as the run would
  # have (its buffer held the saved run's set: the checkpoint's stream).
  assert logged['iteration_1']['reload_seconds'][0] > 0
  assert 'sentinel_checkpoint_complete.1' in os.listdir(
    base_dir / 'checkpoints'
  )


@pytest.mark.parametrize(
  'command',
  [
    [PYTHON, '-m', 'fixed_replay.train'],
    [PYTHON, '-m', 'fixed_replay.cli', 'train'],
  ],
)
def test_train_help_and_required_flags(command):
  result = subprocess.run(
    command + ['--help'], cwd=ROOT, capture_output=True, text=True
  )
  # absl exits with status 1 after --help.
  assert 'trains an offline agent' in result.stdout.lower(), result.stderr
  for flag in (
    '--base_dir',
    '--replay_dir',
    '--agent_name',
    '--gin_files',
    '--gin_bindings',
    '--init_checkpoint_dir',
  ):
    assert flag in result.stdout, flag
  missing = subprocess.run(
    command + ['--replay_dir=/nowhere'],
    cwd=ROOT,
    capture_output=True,
    text=True,
  )
  assert missing.returncode != 0
  assert '--base_dir must be given' in missing.stderr


def test_replay_dir_accepts_a_run_or_its_replay_logs(replay_run, tmp_path):
  replay_logs = str(replay_run / 'replay_logs')
  assert layout.detect(replay_run).data_dir == replay_logs
  assert layout.detect(replay_logs).data_dir == replay_logs
  with pytest.raises(CheckpointError, match='no such directory'):
    layout.detect(tmp_path / 'missing').require_trainable()


def test_losses_reported_to_a_collector_dispatcher_are_averaged(tmp_path):
  # JAX agents report losses through Dopamine's CollectorDispatcher.
  dispatcher = collector_dispatcher.CollectorDispatcher(
    str(tmp_path), collectors=('pickle',)
  )
  tap = reporting.LossTap()
  tapped = reporting.TappedDispatcher(dispatcher, tap)
  for step, loss in enumerate([1.0, 2.0, 6.0]):
    tapped.write(
      [
        statistics_instance.StatisticsInstance('HuberLoss', loss, step),
        statistics_instance.StatisticsInstance('QValue', 9.0, step),
      ],
      collector_allowlist=('pickle',),
    )
  assert tap.pop_means() == {'HuberLoss': 3.0}
  assert tap.pop_means() == {}
  tapped.flush()  # Forwarded to the real dispatcher.
  with open(tmp_path / 'metrics' / 'pickle' / 'pickle_0.pkl', 'rb') as f:
    written = pickle.load(f)
  assert written['iteration_2']['HuberLoss'] == [6.0]


def test_format_duration():
  assert progress.format_duration(65) == '1m 05s'
  assert progress.format_duration(3 * 3600 + 4 * 60 + 5) == '3h 04m 05s'
  assert progress.format_duration(2 * 86400 + 3 * 3600) == '2d 03h 00m'


# ------------------------------------------- batch_rl's runner behaviours


def test_init_checkpoint_dir_continues_another_run(replay_run, tmp_path):
  # batch_rl's --init_checkpoint_dir: when base_dir has no checkpoint, the
  # other run's latest one (weights, training steps, logged history) is
  # restored and training goes on from its next iteration.
  first_dir = tmp_path / 'first'
  with tf.Graph().as_default():
    first = make_runner(
      first_dir,
      replay_run,
      num_iterations=1,
      training_steps=40,
      evaluation_steps=20,
    )
    first.run_experiment()
    saved = online_weights(first.agent)
  gin.clear_config()
  second_dir = tmp_path / 'second'
  with tf.Graph().as_default():
    second = make_runner(
      second_dir,
      replay_run,
      init_checkpoint_dir=str(first_dir),
      num_iterations=2,
      training_steps=40,
      evaluation_steps=20,
    )
    assert second.start_iteration == 1
    assert second.agent.training_steps == 40
    restored = online_weights(second.agent)
    for name, value in saved.items():
      np.testing.assert_array_equal(restored[name], value, err_msg=name)
    second.run_experiment()
  with open(second_dir / 'logs' / 'log_1', 'rb') as f:
    logged = pickle.load(f)
  assert set(logged) == {'iteration_0', 'iteration_1'}
  assert not (second_dir / 'checkpoints' / 'ckpt.0').exists()
  assert (second_dir / 'checkpoints' / 'ckpt.1').exists()
  # Once base_dir has its own checkpoint, that one is resumed instead.
  gin.clear_config()
  with tf.Graph().as_default():
    third = make_runner(
      second_dir,
      replay_run,
      init_checkpoint_dir=str(tmp_path / 'nowhere'),
      num_iterations=3,
      training_steps=40,
    )
    assert third.start_iteration == 2
  gin.clear_config()
  with tf.Graph().as_default():
    with pytest.raises(CheckpointError, match='no complete Dopamine agent'):
      make_runner(
        tmp_path / 'fourth', replay_run, init_checkpoint_dir=str(tmp_path)
      )


def test_runner_takes_dopamine_runner_bindings(replay_run, tmp_path):
  # As in batch_rl (and Dopamine's labs configs): Runner.* bindings apply
  # to FixedReplayRunner; FixedReplayRunner.* bindings win.
  gin.parse_config(
    [
      'Runner.num_iterations = 3',
      'Runner.training_steps = 7',
      'Runner.evaluation_steps = 11',
      'FixedReplayRunner.training_steps = 9',
    ]
  )
  with tf.Graph().as_default():
    runner = make_runner(tmp_path / 'run', replay_run)
  assert runner._num_iterations == 3
  assert runner._training_steps == 9
  assert runner._evaluation_steps == 11
  assert runner._max_steps_per_episode == 200  # Given explicitly.


class OwnDQNAgent(dqn_agent.DQNAgent):
  """A plain Dopamine DQN agent with batch_rl's offline contract."""

  def __init__(self, sess, num_actions, replay_data_dir, **kwargs):
    self._replay_data_dir = replay_data_dir
    super().__init__(sess, num_actions, **kwargs)

  def _build_replay_buffer(self, use_staging):
    return WrappedFixedReplayBuffer(
      data_dir=self._replay_data_dir,
      observation_shape=self.observation_shape,
      stack_size=self.stack_size,
      update_horizon=self.update_horizon,
      gamma=self.gamma,
      observation_dtype=self.observation_dtype.as_numpy_dtype,
      num_buffers_to_load=1,  # Any FixedReplayBuffer argument.
      replay_capacity=CAPACITY,
    )


def _own_runner(base_dir, replay_run, min_replay_history):
  gin.parse_config(AGENT_BINDINGS)

  def create_agent(sess, environment, summary_writer=None):
    return OwnDQNAgent(
      sess,
      environment.action_space.n,
      str(replay_run / 'replay_logs'),
      min_replay_history=min_replay_history,
      summary_writer=summary_writer,
    )

  return run_experiment.FixedReplayRunner(
    str(base_dir),
    create_agent,
    create_environment_fn=lambda: gym_lib.create_gym_environment('CartPole'),
    num_iterations=1,
    training_steps=20,
    evaluation_steps=10,
    max_steps_per_episode=50,
  )


def test_own_dopamine_agent_trains_and_warm_up_is_flagged(
  replay_run, tmp_path, caplog
):
  with tf.Graph().as_default():
    runner = _own_runner(tmp_path / 'warm_up', replay_run, 20_000)
    assert runner.agent._replay.memory.loaded_suffixes in ([0], [1])
    assert 'will not train' in caplog.text
    assert 'min_replay_history=20000 but its replay holds 500 rows' in (
      caplog.text
    )
  caplog.clear()
  gin.clear_config()
  with tf.Graph().as_default():
    runner = _own_runner(tmp_path / 'trains', replay_run, 0)
    assert 'will not train' not in caplog.text
    before = online_weights(runner.agent)
    runner.run_experiment()  # Through the agent's own _train_step.
    after = online_weights(runner.agent)
  assert runner.agent.training_steps == 20
  assert any(not np.array_equal(before[k], after[k]) for k in before)
  assert (tmp_path / 'trains' / 'checkpoints' / 'ckpt.0').exists()


@pytest.mark.parametrize('agent', ['jax_dqn', 'dqn'])
def test_a_killed_train_run_draws_on_as_the_uninterrupted_one(
  replay_run, tmp_path, agent
):
  """`fixed-replay train` stopped after iteration 1 and started again on its
  base_dir draws what the uninterrupted run draws: each checkpoint's replay
  stream (the sampler's place and the set held and loading, one of two
  checkpoints an iteration) is the uninterrupted run's."""

  def train(base_dir, iterations):
    subprocess.run(
      [
        PYTHON,
        '-m',
        'fixed_replay.cli',
        'train',
        f'--base_dir={base_dir}',
        f'--replay_dir={replay_run}',
        f'--agent_name={agent}',
        f'--gin_files={ROOT}/configs/cartpole/{agent}.gin',
        '--gin_bindings=FixedReplayBuffer.num_buffers_to_load = 1',
        '--gin_bindings=FixedReplayBuffer.seed = 3',
        f'--gin_bindings=FixedReplayRunner.num_iterations = {iterations}',
        '--gin_bindings=FixedReplayRunner.training_steps = 30',
        '--gin_bindings=FixedReplayRunner.evaluation_steps = 10',
      ],
      cwd=ROOT,
      check=True,
      capture_output=True,
      timeout=600,
    )

  def streams(base_dir):
    found = []
    for iteration in range(4):
      with open(base_dir / 'checkpoints' / f'ckpt.{iteration}', 'rb') as f:
        found.append(pickle.load(f)[run_experiment.REPLAY_STREAM])
    return found

  train(tmp_path / 'uninterrupted', 4)
  train(tmp_path / 'killed', 2)
  train(tmp_path / 'killed', 4)
  expected = streams(tmp_path / 'uninterrupted')
  assert streams(tmp_path / 'killed') == expected
  # Both sets were held, and the sampler moved every iteration.
  assert {tuple(s['loaded']) for s in expected} == {(0,), (1,)}
  assert len({str(s['rng']) for s in expected}) == 4
