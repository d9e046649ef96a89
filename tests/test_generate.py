"""`fixed-replay generate` against Dopamine's own buffer and a replayed game.

Generated files are loaded with Dopamine's `OutOfGraphReplayBuffer.load` and
`fixed_replay.sources.dopamine.checkpoints.read_checkpoint`; their rows are
checked by replaying the stored actions in a freshly seeded environment,
which must reproduce every stored observation, reward and terminal.
"""

# ruff: noqa: I001  (fixed_replay must be imported before Dopamine)
import json
import os
import subprocess
import sys
import textwrap

import fixed_replay  # noqa: F401
from dopamine.tf.replay_memory import circular_replay_buffer
import numpy as np
import pytest

from fixed_replay.sources.dopamine import checkpoints
from fixed_replay.sources.dopamine import file_names
from fixed_replay.generate import generate
from fixed_replay.sources.dopamine import environments
from fixed_replay.generate import policies
from fixed_replay.errors import CheckpointError

_STORE_FILES = [f'$store$_{n}' for n in ('action', 'observation', 'reward')]
_STORE_FILES.append('$store$_terminal')
_PUBLISHED_NAMES = sorted(_STORE_FILES + ['add_count', 'invalid_range'])
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _names(directory, suffix):
  """The `{name}` parts of the files of one suffix."""
  parsed = filter(None, map(file_names.parse, os.listdir(directory)))
  return sorted(name for name, s in parsed if s == suffix)


def _dopamine_load(directory, suffix, environment, rows):
  spec = environments.ENVIRONMENT_SPECS[environment]
  buffer = circular_replay_buffer.OutOfGraphReplayBuffer(
    observation_shape=spec.observation_shape,
    stack_size=spec.stack_size,
    replay_capacity=rows,
    batch_size=32,
    observation_dtype=spec.observation_dtype,
    checkpoint_duration=10**9,
  )
  buffer.load(str(directory), suffix)
  return buffer


def _check_against_dopamine(directory, environment, rows, cursor, count):
  """Checks every checkpoint with Dopamine's load and read_checkpoint.

  Returns:
    list of CheckpointWindow, in suffix order.
  """
  spec = environments.ENVIRONMENT_SPECS[environment]
  found = checkpoints.find_checkpoints(directory)
  assert list(found) == list(range(count))
  windows = []
  for suffix, files in found.items():
    oracle = _dopamine_load(directory, suffix, environment, rows)
    window = checkpoints.read_checkpoint(
      files,
      observation_shape=spec.observation_shape,
      observation_dtype=spec.observation_dtype,
    )
    for name, array in oracle._store.items():
      np.testing.assert_array_equal(window.store[name], array)
      assert window.store[name].dtype == array.dtype
    expected_add_count = (cursor or rows) + suffix * rows
    assert window.add_count == int(oracle.add_count) == expected_add_count
    assert window.cursor == cursor
    assert window.is_full == (suffix > 0 or cursor == 0)
    expected_range = circular_replay_buffer.invalid_range(
      cursor, rows, spec.stack_size, 1
    )
    np.testing.assert_array_equal(window.invalid_range, expected_range)
    np.testing.assert_array_equal(oracle.invalid_range, expected_range)
    windows.append(window)
  return windows


def _stream(windows, rows, cursor):
  """Concatenates two consecutive checkpoints into the rows added, in order."""
  first, second = windows
  return {
    name: np.concatenate(
      [
        first.store[name][:cursor],
        second.store[name][cursor:],
        second.store[name][:cursor],
      ]
    )
    for name in first.store
  }


def _replay(stream, environment, game, seed, max_steps=None):
  """Replays the stored actions; every stored row must be reproduced.

  Returns:
    int, number of episodes that ended in the stream.
  """
  spec = environments.ENVIRONMENT_SPECS[environment]
  max_steps = max_steps or spec.max_steps_per_episode
  env = environments.create_environment(environment, game)
  env.environment.reset(seed=seed)
  num_rows, row, episodes = len(stream['action']), 0, 0
  while row < num_rows:
    for _ in range(min(spec.stack_size - 1, num_rows - row)):  # Padding.
      for name in ('observation', 'action', 'reward', 'terminal'):
        assert not stream[name][row].any(), (name, row)
      row += 1
    observation, step = env.reset(), 0
    while row < num_rows:
      stored = np.asarray(observation, spec.observation_dtype)
      np.testing.assert_array_equal(
        stream['observation'][row], stored.reshape(spec.observation_shape)
      )
      observation, reward, terminal, _ = env.step(stream['action'][row])
      step += 1
      assert stream['reward'][row] == np.clip(reward, -1, 1), row
      episode_over = terminal or step == max_steps
      assert stream['terminal'][row] == episode_over, row
      row += 1
      if episode_over:
        episodes += 1
        break
  return episodes


def test_pong_random_published_layout(tmp_path):
  rows = 400
  summary = generate.generate_dataset(
    tmp_path, game='Pong', num_checkpoints=2, checkpoint_rows=rows, seed=3
  )
  assert summary.suffixes == [0, 1]
  assert [c.add_count for c in summary.checkpoints] == [399, 799]
  # The published files and nothing else: no episode_end_indices, no staging.
  for suffix in (0, 1):
    assert _names(tmp_path, suffix) == _PUBLISHED_NAMES
  assert len(os.listdir(tmp_path)) == 12
  windows = _check_against_dopamine(tmp_path, 'atari', rows, rows - 1, 2)
  assert [w.episode_end_indices for w in windows] == [None, None]
  # The one row past add_count of the partial checkpoint is zero, not
  # leftover memory.
  for array in windows[0].store.values():
    assert not array[rows - 1].any()
  np.testing.assert_array_equal(windows[1].invalid_range, [398, 399, 0, 1, 2])
  # Pong frames, random actions over Pong's 6 actions.
  assert windows[1].store['observation'].shape == (rows, 84, 84)
  assert len(np.unique(windows[1].store['action'])) == 6
  stream = _stream(windows, rows, rows - 1)
  _replay(stream, 'atari', 'Pong', seed=3)


def test_custom_cursor_and_episode_end_indices(tmp_path):
  rows, cursor = 300, 117
  summary = generate.generate_dataset(
    tmp_path,
    game='Breakout',
    num_checkpoints=2,
    checkpoint_rows=rows,
    cursor=cursor,
    seed=5,
    write_episode_end_indices=True,
  )
  assert [c.add_count for c in summary.checkpoints] == [117, 417]
  for suffix in (0, 1):
    assert _names(tmp_path, suffix) == sorted(
      _PUBLISHED_NAMES + ['episode_end_indices']
    )
  windows = _check_against_dopamine(tmp_path, 'atari', rows, cursor, 2)
  np.testing.assert_array_equal(
    windows[1].invalid_range, [116, 117, 118, 119, 120]
  )
  for window in windows:
    oracle = _dopamine_load(tmp_path, window.suffix, 'atari', rows)
    expected = sorted(int(i) for i in oracle.episode_end_indices)
    np.testing.assert_array_equal(window.episode_end_indices, expected)
    # Every episode ends with a terminal row, so the two agree.
    terminal_rows = np.flatnonzero(window.store['terminal'][: window.add_count])
    np.testing.assert_array_equal(window.episode_end_indices, terminal_rows)
  # Random Breakout loses its 5 lives in ~200 steps: several episodes, each
  # with its padding rows, all reproduced by the replay.
  stream = _stream(windows, rows, cursor)
  episodes = _replay(stream, 'atari', 'Breakout', seed=5)
  assert episodes >= 1 and episodes == len(summary.episode_returns)


def test_dump_inside_episode_start_padding(tmp_path):
  # Dopamine's add() writes an episode's 3 padding rows and its first row in
  # one call; a dump due after the first padding row must still happen there.
  rows = 600
  first = generate.generate_dataset(
    tmp_path / 'probe', game='Breakout', num_checkpoints=1, checkpoint_rows=rows
  )
  assert first.episode_lengths, 'random Breakout ended no episode'
  # Stream rows: 3 padding + the first episode, then the second's padding.
  cursor = 3 + first.episode_lengths[0] + 1
  assert cursor < rows
  generate.generate_dataset(
    tmp_path / 'data',
    game='Breakout',
    num_checkpoints=2,
    checkpoint_rows=rows,
    cursor=cursor,
  )
  windows = _check_against_dopamine(tmp_path / 'data', 'atari', rows, cursor, 2)
  terminal = windows[0].store['terminal']
  assert terminal[cursor - 2] == 1 and not terminal[: cursor - 2].any()
  assert not windows[0].store['observation'][cursor - 1].any()  # Padding.
  _replay(_stream(windows, rows, cursor), 'atari', 'Breakout', seed=0)


def test_cartpole_scripted_balances_and_cuts_episodes(tmp_path):
  rows = 1000
  runs = {}
  for policy in ('random', 'scripted'):
    runs[policy] = generate.generate_dataset(
      tmp_path / policy,
      environment='cartpole',
      num_checkpoints=2,
      checkpoint_rows=rows,
      policy=policy,
      seed=1,
    )
  random_return = runs['random'].mean_return
  scripted = runs['scripted']
  assert 10 < random_return < 40, random_return
  # epsilon = 0.1 around the controller still balances to the 200-step cut.
  assert scripted.mean_return > 5 * random_return
  assert set(scripted.episode_lengths) == {200}
  windows = _check_against_dopamine(
    tmp_path / 'scripted', 'cartpole', 1000, 999, 2
  )
  assert windows[0].store['observation'].shape == (rows, 4, 1)
  assert windows[0].store['observation'].dtype == np.float64
  stream = _stream(windows, rows, rows - 1)
  # Cut episodes are stored as terminal, every 200 rows (no padding rows).
  np.testing.assert_array_equal(
    np.flatnonzero(stream['terminal']), np.arange(199, 2 * rows - 1, 200)
  )
  assert _replay(stream, 'cartpole', None, seed=1) == 9


def test_max_steps_per_episode_cut_and_replay(tmp_path):
  generate.generate_dataset(
    tmp_path,
    environment='cartpole',
    num_checkpoints=2,
    checkpoint_rows=100,
    policy='scripted',
    epsilon=0.0,
    max_steps_per_episode=30,
    cursor=40,
  )
  windows = _check_against_dopamine(tmp_path, 'cartpole', 100, 40, 2)
  stream = _stream(windows, 100, 40)
  np.testing.assert_array_equal(
    np.flatnonzero(stream['terminal']), np.arange(29, 140, 30)
  )
  assert _replay(stream, 'cartpole', None, seed=0, max_steps=30) == 4


def test_refuses_directory_with_checkpoint_files(tmp_path):
  existing = tmp_path / '$store$_action_ckpt.3.gz'
  existing.write_bytes(b'user data')
  with pytest.raises(FileExistsError, match='already holds replay checkpoint'):
    generate.generate_dataset(
      tmp_path, environment='cartpole', checkpoint_rows=50
    )
  assert existing.read_bytes() == b'user data'
  assert os.listdir(tmp_path) == [existing.name]
  # Unrelated files are fine.
  other = tmp_path.parent / 'with_readme'
  other.mkdir()
  (other / 'README').write_text('notes')
  generate.generate_dataset(other, environment='cartpole', checkpoint_rows=50)
  assert checkpoints.checkpoint_suffixes(other) == [0, 1]


def test_bad_arguments_raise_clear_errors(tmp_path):
  with pytest.raises(ValueError, match='cursor must be in'):
    generate.generate_dataset(tmp_path, checkpoint_rows=10, cursor=10)
  with pytest.raises(ValueError, match='unknown policy'):
    generate.generate_dataset(tmp_path, policy='greedy')
  with pytest.raises(ValueError, match=r"no scripted policy .*'Pong'"):
    generate.generate_dataset(tmp_path, game='Seaquest', policy='scripted')
  with pytest.raises(ValueError, match='needs agent_checkpoint_dir'):
    generate.generate_dataset(tmp_path, environment='cartpole', policy='agent')
  with pytest.raises(CheckpointError, match='no complete Dopamine agent'):
    generate.generate_dataset(
      tmp_path,
      environment='cartpole',
      policy='agent',
      agent_checkpoint_dir=tmp_path / 'no_agent',
    )
  assert not checkpoints.scan_checkpoints(tmp_path)[0]


def test_same_seed_same_dataset(tmp_path):
  def arrays(seed, name):
    generate.generate_dataset(
      tmp_path / name,
      environment='cartpole',
      num_checkpoints=2,
      checkpoint_rows=300,
      policy='scripted',
      epsilon=0.3,
      seed=seed,
    )
    found = checkpoints.find_checkpoints(tmp_path / name)
    return [checkpoints.read_checkpoint(f).store for f in found.values()]

  first, again, other = arrays(7, 'a'), arrays(7, 'b'), arrays(8, 'c')
  for store_a, store_b, store_c in zip(first, again, other, strict=True):
    for name in store_a:
      np.testing.assert_array_equal(store_a[name], store_b[name])
    assert not np.array_equal(store_a['observation'], store_c['observation'])


def test_breakout_scripted_beats_random():
  # One life-long rally of the scripted paddle outscores random play.
  returns = {}
  for policy in ('random', 'scripted'):
    env = environments.create_environment('atari', 'Breakout')
    env.environment.reset(seed=0)
    rng = np.random.default_rng(0)
    behaviour = generate.make_policy(
      policy, env, 'atari', 'Breakout', rng, epsilon=0.0
    )
    action, total = behaviour.begin_episode(env.reset()), 0.0
    for _ in range(400):
      observation, reward, terminal, _ = env.step(action)
      total += reward
      if terminal:
        break
      action = behaviour.step(reward, observation)
    returns[policy] = total
  assert returns['scripted'] >= returns['random'] + 5, returns


def test_random_policy_repeats_actions():
  policy = policies.RandomPolicy(6, np.random.default_rng(0), action_repeat=4)
  actions = [policy.begin_episode(None)]
  actions += [policy.step(0.0, None) for _ in range(39)]
  blocks = np.array(actions).reshape(10, 4)
  assert (blocks == blocks[:, :1]).all()
  assert len(set(blocks[:, 0])) > 1


# Dopamine's dopamine/tf/agents/dqn/configs/dqn_cartpole.gin (not shipped in
# the 4.1.2 wheel), on the CPU, without its optimizer lines: their
# `import gin.tf.external_configurables` fails on TensorFlow >= 2.16 (gin.tf
# subclasses tf.estimator.SessionRunHook, and tf.estimator is gone). The
# optimizer does not matter for acting. identity_epsilon is spelled out
# because run_experiment also imports the JAX dqn_agent, which has one too.
_DQN_CARTPOLE_GIN = """
import dopamine.discrete_domains.gym_lib
import dopamine.discrete_domains.run_experiment
import dopamine.tf.agents.dqn.dqn_agent
import dopamine.tf.replay_memory.circular_replay_buffer

DQNAgent.observation_shape = %gym_lib.CARTPOLE_OBSERVATION_SHAPE
DQNAgent.observation_dtype = %gym_lib.CARTPOLE_OBSERVATION_DTYPE
DQNAgent.stack_size = %gym_lib.CARTPOLE_STACK_SIZE
DQNAgent.network = @gym_lib.CartpoleDQNNetwork
DQNAgent.gamma = 0.99
DQNAgent.update_horizon = 1
DQNAgent.min_replay_history = 500
DQNAgent.update_period = 4
DQNAgent.target_update_period = 100
DQNAgent.epsilon_fn = @dopamine.tf.agents.dqn.dqn_agent.identity_epsilon
DQNAgent.tf_device = '/cpu:*'

create_gym_environment.environment_name = 'CartPole'
create_gym_environment.version = 'v0'
create_agent.agent_name = 'dqn'
Runner.create_environment_fn = @gym_lib.create_gym_environment
Runner.max_steps_per_episode = 200

WrappedReplayBuffer.replay_capacity = 50000
WrappedReplayBuffer.batch_size = 128
"""

# Runs in a subprocess: Dopamine's TF agents switch TensorFlow to graph mode
# for the whole process. Saves a DQN agent the way Dopamine's Runner does,
# generates from it and reports the greedy actions of the saved agent and of
# a freshly initialised one on the stored observations.
_AGENT_SCRIPT = textwrap.dedent("""
  import json, os, sys
  import fixed_replay
  from dopamine.discrete_domains import checkpointer, gym_lib, run_experiment
  import numpy as np
  import tensorflow as tf
  from fixed_replay.generate import generate
  from fixed_replay.sources.dopamine import checkpoints

  base_dir, gin_file, output_dir = sys.argv[1:4]
  run_experiment.load_gin_configs([gin_file], [])
  env = gym_lib.create_gym_environment('CartPole', 'v0')
  # Seeded graphs: the same initialisations, so the same outcome, every run
  # (unseeded, which ones were drawn decided whether the checks held). A
  # graph of its own: TensorFlow is still eager here, and an eager seed would
  # not reach the graph Dopamine builds the agent in.
  graph = tf.Graph()
  with graph.as_default():
    tf.compat.v1.set_random_seed(0)
    agent = run_experiment.create_agent(None, env, agent_name='dqn')
  # An untrained CartPole network often picks one action everywhere, and two
  # such networks agree; draw initialisations until the saved policy depends
  # on the state, so that matching it below means its weights were restored.
  rng = np.random.default_rng(0)
  probes = rng.uniform(-0.2, 0.2, size=(64, 4)).astype(np.float32)
  online = [v for v in graph.get_collection('variables') if 'Online' in v.name]

  def probe_actions():
    return {int(agent._sess.run(agent._q_argmax,
                                {agent.state_ph: p.reshape(agent.state.shape)}))
            for p in probes}

  with graph.as_default():
    reinitialise = tf.compat.v1.variables_initializer(online)
  for _ in range(100):
    if len(probe_actions()) > 1:
      break
    agent._sess.run(reinitialise)
  agent._sess.run(agent._sync_qt_ops)
  checkpoint_dir = os.path.join(base_dir, 'checkpoints')
  os.makedirs(checkpoint_dir)
  # As Runner._checkpoint_experiment.
  with graph.as_default():
    data = agent.bundle_and_checkpoint(checkpoint_dir, 2)
  data['current_iteration'] = 2
  data['logs'] = {}
  checkpointer.Checkpointer(checkpoint_dir).save_checkpoint(2, data)

  summary = generate.generate_dataset(
      output_dir, environment='cartpole', num_checkpoints=1,
      checkpoint_rows=300, policy='agent', epsilon=0.0,
      agent_checkpoint_dir=base_dir, gin_files=[gin_file], progress=False)
  files = checkpoints.find_checkpoints(output_dir)[0]
  window = checkpoints.read_checkpoint(files)
  observations = window.store['observation'][: window.add_count]

  def greedy(a):
    a.eval_mode, a.epsilon_eval = True, 0.0
    return [int(a.begin_episode(o)) for o in observations]

  with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(1)
    fresh = run_experiment.create_agent(None, env, agent_name='dqn')
  print(json.dumps({
      'saved': greedy(agent), 'fresh': greedy(fresh),
      'stored': window.store['action'][: window.add_count].tolist(),
      'add_count': window.add_count}))
""")


def _run(args, **kwargs):
  env = dict(os.environ, PYTHONPATH=_REPO_ROOT)
  return subprocess.run(
    [sys.executable] + args,
    capture_output=True,
    text=True,
    env=env,
    cwd=_REPO_ROOT,
    timeout=300,
    check=False,
    **kwargs,
  )


def test_agent_policy_round_trip(tmp_path):
  gin_file = tmp_path / 'dqn_cartpole.gin'
  gin_file.write_text(_DQN_CARTPOLE_GIN)
  result = _run(
    [
      '-c',
      _AGENT_SCRIPT,
      str(tmp_path / 'run'),
      str(gin_file),
      str(tmp_path / 'data'),
    ]
  )
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert report['add_count'] == 299
  # With epsilon 0 every stored action is the restored agent's greedy one.
  assert report['stored'] == report['saved']
  # Not a vacuous match: the saved policy depends on the state, and an
  # unrestored (freshly initialised) agent acts differently.
  assert len(set(report['saved'])) > 1
  assert report['fresh'] != report['saved']


def test_cli_generate(tmp_path):
  help_result = _run(['-m', 'fixed_replay.cli', 'generate', '--help'])
  # absl's --help exits with status 1 after printing the usage to stdout.
  assert 'Traceback' not in help_result.stderr
  for flag in ('--output_dir', '--policy', '--cursor', '--checkpoint_rows'):
    assert flag in help_result.stdout
  output_dir = tmp_path / 'cartpole'
  args = [
    '-m',
    'fixed_replay.cli',
    'generate',
    f'--output_dir={output_dir}',
    '--environment=cartpole',
    '--num_checkpoints=3',
    '--checkpoint_rows=64',
    '--cursor=10',
    '--policy=scripted',
  ]
  result = _run(args)
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert report['suffixes'] == [0, 1, 2]
  assert report['add_counts'] == [10, 74, 138]
  assert 'Wrote checkpoint 3/3' in result.stderr
  _check_against_dopamine(output_dir, 'cartpole', 64, 10, 3)
  # A second run into the same directory is refused, files untouched.
  before = {n: os.path.getmtime(output_dir / n) for n in os.listdir(output_dir)}
  again = _run(args)
  assert again.returncode != 0
  assert 'already holds replay checkpoint files' in again.stderr
  after = {n: os.path.getmtime(output_dir / n) for n in os.listdir(output_dir)}
  assert after == before
