"""A fresh interpreter imports Dopamine's whole stack after fixed_replay."""

import os
import subprocess
import sys

_IMPORTS = """
import fixed_replay
import os
assert os.environ['TF_USE_LEGACY_KERAS'] == '1'
from dopamine.discrete_domains import atari_lib, run_experiment, gym_lib
from dopamine.tf.agents.dqn import dqn_agent
from dopamine.tf.agents.rainbow import rainbow_agent
from dopamine.tf.agents.implicit_quantile import implicit_quantile_agent
from dopamine.jax.agents.dqn import dqn_agent as jax_dqn_agent
from dopamine.jax.agents.quantile import quantile_agent
env = atari_lib.create_atari_environment('Pong')
print('frame', env.reset().shape)
try:
  atari_lib.create_atari_environment('Pong', use_ppo_preprocessing=True)
except ImportError as error:
  print('ppo:', error)
"""


def test_dopamine_imports_in_fresh_process():
  env = {k: v for k, v in os.environ.items() if k != 'TF_USE_LEGACY_KERAS'}
  result = subprocess.run(
    [sys.executable, '-c', _IMPORTS],
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'frame (84, 84, 1)' in result.stdout
  # The one path that needs OpenAI baselines says what to install.
  assert 'ppo:' in result.stdout and 'pip install' in result.stdout


def test_require_names_the_package():
  from fixed_replay import compat

  try:
    compat.require('no_such_module_xyz', 'no-such-dist', 'testing')
  except ImportError as error:
    assert 'pip install no-such-dist' in str(error)
    assert 'testing' in str(error)
  else:
    raise AssertionError('require() did not raise')
