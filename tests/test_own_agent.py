"""The docs' "Your own agent" recipes, verbatim, as a user runs them.

Each recipe is written to a temporary directory outside the repository and
run there in a fresh process, with the docs' command (only the places
`$DATA` and `/tmp/mine` point to, and bindings that make the run tiny, are
added). The data is DATA/Pong/1/replay_logs, Dopamine-written Pong
checkpoints, so `train` finds the game in the path. The texts below are the
ones the docs print: change them together.
"""

import concurrent.futures
import os
import pickle
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MY_AGENTS_PY = '''\
"""my_agents.py: a Dopamine TF agent that learns from a fixed dataset."""

import fixed_replay  # First: it sets TensorFlow up for Dopamine.
from dopamine.tf.agents.dqn import dqn_agent
import gin


@gin.configurable
class MyDQNAgent(dqn_agent.DQNAgent):
  """Dopamine's DQN, reading its minibatches from logged checkpoints."""

  def __init__(self, sess, num_actions, replay_data_dir, replay_suffix=None,
               init_checkpoint_dir=None, **kwargs):
    self._replay_data_dir = replay_data_dir
    self._replay_suffix = replay_suffix
    self._init_checkpoint_dir = init_checkpoint_dir  # The runner reads it.
    super().__init__(sess, num_actions, **kwargs)

  def _build_replay_buffer(self, use_staging):
    return fixed_replay.WrappedFixedReplayBuffer(
        data_dir=self._replay_data_dir,
        replay_suffix=self._replay_suffix,
        observation_shape=self.observation_shape,
        stack_size=self.stack_size,
        update_horizon=self.update_horizon,
        gamma=self.gamma,
        observation_dtype=self.observation_dtype.as_numpy_dtype)
'''

TF_COMMAND = """\
PYTHONPATH=. fixed-replay train --agent_name=my_agents:MyDQNAgent \\
    --replay_dir=$DATA/Pong/1 --base_dir=/tmp/mine \\
    --gin_bindings='MyDQNAgent.min_replay_history = 0' \\
    --gin_bindings='FixedReplayBuffer.num_buffers_to_load = 5'
"""

TRAIN_MINE_PY = '''\
"""train_mine.py BASE_DIR REPLAY_DIR GIN_FILE [BINDING...]"""

import sys

import fixed_replay  # First: it sets TensorFlow up for Dopamine.
from absl import logging
from dopamine.jax.agents.dqn import dqn_agent
import gin


@gin.configurable
class MyJaxDQNAgent(dqn_agent.JaxDQNAgent):
  """Dopamine's JAX DQN, reading its minibatches from logged checkpoints."""

  def __init__(self, num_actions, replay_data_dir, **kwargs):
    self._replay_data_dir = replay_data_dir
    super().__init__(num_actions, **kwargs)

  def _build_replay_buffer(self):
    return fixed_replay.FixedReplayBuffer(
        data_dir=self._replay_data_dir,
        observation_shape=self.observation_shape,
        stack_size=self.stack_size,
        update_horizon=self.update_horizon,
        gamma=self.gamma,
        observation_dtype=self.observation_dtype)


def create_agent(sess, environment, summary_writer=None):
  del sess  # JAX agents have no TensorFlow session.
  return MyJaxDQNAgent(environment.action_space.n, REPLAY_DIR,
                       summary_writer=summary_writer)


if __name__ == '__main__':
  logging.set_verbosity(logging.INFO)  # Progress, one line per iteration.
  BASE_DIR, REPLAY_DIR = sys.argv[1:3]
  gin.parse_config_files_and_bindings(sys.argv[3:4], sys.argv[4:])
  fixed_replay.FixedReplayRunner(BASE_DIR, create_agent).run_experiment()
'''

MY_GIN = """\
# my.gin: what train_mine.py configures (gin's language).
import fixed_replay.replay.fixed_replay_buffer  # FixedReplayBuffer.*
import fixed_replay.training.run_experiment  # FixedReplayRunner.*

atari_lib.create_atari_environment.game_name = 'Pong'  # The data's game.
MyJaxDQNAgent.min_replay_history = 0
FixedReplayBuffer.num_buffers_to_load = 5
"""

JAX_COMMAND = 'python train_mine.py /tmp/mine $DATA/Pong/1/replay_logs my.gin\n'

# Only to make the runs tiny: Dopamine's defaults are 200 iterations.
TINY = (
  'FixedReplayRunner.num_iterations = 1',
  'FixedReplayRunner.training_steps = 8',
  'FixedReplayRunner.evaluation_steps = 20',
  'FixedReplayRunner.max_steps_per_episode = 20',
)


def _shell(command, cwd, data, base_dir):
  """Runs a docs command with bash in cwd; (returncode, stderr)."""
  command = command.strip().replace('/tmp/mine', str(base_dir))
  # The package under test must win over an installed copy of it.
  command = command.replace('PYTHONPATH=.', f'PYTHONPATH=.:{ROOT}')
  command = command.replace('python ', f'{sys.executable} ', 1)
  env = dict(os.environ, DATA=str(data))
  env['PATH'] = os.pathsep.join([os.path.dirname(sys.executable), env['PATH']])
  env['PYTHONPATH'] = ROOT
  result = subprocess.run(
    ['bash', '-c', command],
    cwd=cwd,
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
    check=False,
  )
  return result.returncode, result.stderr


@pytest.fixture(scope='module')
def recipes(dopamine_dir, tmp_path_factory):
  """Both recipes run in a directory of their own, two at a time."""
  data = tmp_path_factory.mktemp('data')
  replay_logs = data / 'Pong' / '1' / 'replay_logs'
  replay_logs.mkdir(parents=True)
  for name in os.listdir(dopamine_dir[0]):
    os.link(dopamine_dir[0] / name, replay_logs / name)
  work = tmp_path_factory.mktemp('mine')
  assert not str(work).startswith(ROOT)
  for name, text in (
    ('my_agents.py', MY_AGENTS_PY),
    ('train_mine.py', TRAIN_MINE_PY),
    ('my.gin', MY_GIN),
  ):
    (work / name).write_text(text)
  tf_command = TF_COMMAND.rstrip() + ''.join(
    f" \\\n    --gin_bindings='{b}'" for b in TINY
  )
  jax_command = JAX_COMMAND.rstrip() + ''.join(f" '{b}'" for b in TINY)
  runs = {'tf': (tf_command, work / 'tf'), 'jax': (jax_command, work / 'jax')}
  with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    futures = {
      name: pool.submit(_shell, command, work, data, base)
      for name, (command, base) in runs.items()
    }
    return {
      name: (*future.result(), runs[name][1])
      for name, future in futures.items()
    }


@pytest.mark.parametrize('recipe', ['tf', 'jax'])
def test_recipe_trains_evaluates_and_checkpoints(recipes, recipe):
  code, stderr, base_dir = recipes[recipe]
  assert code == 0, stderr[-4000:]
  assert 'Traceback' not in stderr
  assert 'after the config was locked' not in stderr
  with open(base_dir / 'logs' / 'log_0', 'rb') as f:
    logged = pickle.load(f)['iteration_0']
  assert logged['eval_episode_returns'], logged
  assert logged['train_average_steps_per_second'][0] > 0, logged
  assert 'Iteration 0 (1/1) done' in stderr
  assert {'ckpt.0', 'sentinel_checkpoint_complete.0'} <= set(
    os.listdir(base_dir / 'checkpoints')
  )
  agent = 'MyDQNAgent' if recipe == 'tf' else 'MyJaxDQNAgent'
  assert f'Training {agent} ({agent}) offline from ' in stderr
  # FixedReplayBuffer.num_buffers_to_load = 5 took effect: 4 checkpoints.
  assert 'num_buffers_to_load=5 but' in stderr


def test_tf_recipe_evaluates_in_the_datas_game(recipes):
  _, stderr, _ = recipes['tf']
  # No game is bound: the data's path, DATA/Pong/1, names it.
  assert "Evaluating in Pong, the data's game" in stderr


def test_top_level_names_import_after_the_config_is_locked(tmp_path):
  """A recipe whose gin file imports none of ours: first use comes late."""
  code = (
    'import fixed_replay, gin\n'
    "gin.parse_config('')\n"
    'gin.finalize()\n'
    'assert gin.config_is_locked()\n'
    'for name in fixed_replay.__all__:\n'
    '  getattr(fixed_replay, name)\n'
    'assert gin.config_is_locked()\n'
    "print('ok')\n"
  )
  result = subprocess.run(
    [sys.executable, '-c', code],
    cwd=tmp_path,
    env=dict(os.environ, PYTHONPATH=ROOT),
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip() == 'ok'
