"""What `import fixed_replay` provides: the public API, old module paths
(batch_rl's, Dopamine 3.x's, ours) and gin's TF names on TensorFlow 2.18."""

import importlib
import os
import subprocess
import sys
import textwrap

import pytest

import fixed_replay
from fixed_replay import module_aliases

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PUBLIC = {
  'FixedReplayBuffer': 'fixed_replay.replay.fixed_replay_buffer',
  'CompactReplayBuffer': 'fixed_replay.replay.compact_replay_buffer',
  'WrappedFixedReplayBuffer': (
    'fixed_replay.agents.tf.wrapped_fixed_replay_buffer'
  ),
  'FixedReplayRunner': 'fixed_replay.training.run_experiment',
  'CheckpointError': 'fixed_replay.errors',
  'ReplayMixture': 'fixed_replay.mixture',
}


def fresh_python(code, **env):
  """`python -c CODE` (dedented) in a fresh process, from the repository."""
  return subprocess.run(
    [sys.executable, '-c', textwrap.dedent(code)],
    cwd=ROOT,
    env=dict(os.environ, **env),
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )


def test_public_api_at_the_top():
  from fixed_replay import CheckpointError  # noqa: F401
  from fixed_replay import CompactReplayBuffer  # noqa: F401
  from fixed_replay import FixedReplayBuffer  # noqa: F401
  from fixed_replay import FixedReplayRunner  # noqa: F401
  from fixed_replay import ReplayMixture  # noqa: F401
  from fixed_replay import WrappedFixedReplayBuffer  # noqa: F401

  for name, module in PUBLIC.items():
    assert getattr(fixed_replay, name) is getattr(
      importlib.import_module(module), name
    )
    assert name in dir(fixed_replay)
  assert sorted(fixed_replay.__all__) == sorted(PUBLIC)
  with pytest.raises(AttributeError, match='no attribute'):
    fixed_replay.NoSuchThing  # noqa: B018


def test_import_is_light_in_a_fresh_process():
  # And so is the tests' conftest.py, all that the xdist master (which runs
  # no test) imports of this suite.
  result = fresh_python(
    """
    import sys
    import fixed_replay
    print('tensorflow' in sys.modules, 'jax' in sys.modules)
    from fixed_replay import CheckpointError
    print(CheckpointError.__module__)
    sys.path.insert(0, 'tests')
    import conftest
    print('tensorflow' in sys.modules, 'jax' in sys.modules)
    """
  )
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.split() == [
    'False',
    'False',
    'fixed_replay.errors',
    'False',
    'False',
  ]


@pytest.mark.parametrize(
  'old, new',
  [
    (old, new)
    for old, new in module_aliases.ALIASES.items()
    # The entry point defines absl flags: imported in test_dropin's fresh
    # processes, not in this one.
    if old.startswith(('batch_rl.', 'dopamine.'))
    and new != 'fixed_replay.train'
  ],
)
def test_old_paths_are_todays_modules(old, new):
  assert importlib.import_module(old) is importlib.import_module(new)
  # The module keeps its own identity (spec) under both names.
  assert sys.modules[new].__spec__.name == new


def test_batch_rl_names_and_packages():
  import batch_rl
  import batch_rl.fixed_replay
  from batch_rl.fixed_replay import run_experiment
  import batch_rl.fixed_replay.agents
  from batch_rl.fixed_replay.agents import dqn_agent
  from batch_rl.fixed_replay.agents import multi_head_dqn_agent
  from batch_rl.fixed_replay.agents import multi_network_dqn_agent
  from batch_rl.fixed_replay.agents import quantile_agent
  from batch_rl.fixed_replay.agents import rainbow_agent
  import batch_rl.fixed_replay.replay_memory
  from batch_rl.fixed_replay.replay_memory import fixed_replay_buffer

  for package in (
    batch_rl,
    batch_rl.fixed_replay,
    batch_rl.fixed_replay.agents,
    batch_rl.fixed_replay.replay_memory,
  ):
    assert package.__path__ == []  # Only aliases live there.
  assert fixed_replay_buffer.FixedReplayBuffer is fixed_replay.FixedReplayBuffer
  assert (
    fixed_replay_buffer.WrappedFixedReplayBuffer
    is fixed_replay.WrappedFixedReplayBuffer
  )
  assert run_experiment.FixedReplayRunner is fixed_replay.FixedReplayRunner
  assert dqn_agent.FixedReplayDQNAgent.__name__ == 'FixedReplayDQNAgent'
  assert multi_head_dqn_agent.FixedReplayMultiHeadDQNAgent
  assert multi_network_dqn_agent.FixedReplayMultiNetworkDQNAgent
  assert quantile_agent.FixedReplayQuantileAgent
  assert issubclass(
    rainbow_agent.FixedReplayRainbowAgent, rainbow_agent.FixedReplayC51Agent
  )
  with pytest.raises(ModuleNotFoundError):
    importlib.import_module('batch_rl.fixed_replay.no_such_module')


def test_dopamine_pre_4_paths():
  from dopamine.agents.dqn import dqn_agent
  from dopamine.agents.rainbow import rainbow_agent
  from dopamine.replay_memory import circular_replay_buffer
  from dopamine.replay_memory import prioritized_replay_buffer
  from dopamine.tf.agents.dqn import dqn_agent as dqn_agent_today

  assert dqn_agent.DQNAgent is dqn_agent_today.DQNAgent
  assert rainbow_agent.RainbowAgent.__module__.startswith('dopamine.tf.')
  assert circular_replay_buffer.OutOfGraphReplayBuffer
  assert prioritized_replay_buffer.WrappedPrioritizedReplayBuffer


def test_dopamine_labs_fixed_replay_runs_on_our_buffer():
  from dopamine.labs.offline_rl import fixed_replay as labs

  assert labs.__file__.startswith(
    os.path.dirname(sys.modules['dopamine'].__file__)
  )
  assert issubclass(labs.JaxFixedReplayBuffer, fixed_replay.FixedReplayBuffer)


def test_gin_tf_external_configurables_register_tf1_names():
  from gin.tf import utils
  import gin.tf.external_configurables  # noqa: F401

  for name in (
    'tf.train.AdamOptimizer',
    'tf.train.RMSPropOptimizer',
    'tf.train.GradientDescentOptimizer',
    'tf.train.MomentumOptimizer',
    'tf.train.exponential_decay',
  ):
    gin.parse_config(f'{name}.name = "x"')  # Raises if not registered.
  gin.clear_config()
  with pytest.raises(ImportError, match='tf.estimator'):
    utils.GinConfigSaverHook()


def test_a_real_module_of_the_same_name_wins(tmp_path):
  package = tmp_path / 'batch_rl' / 'fixed_replay'
  package.mkdir(parents=True)
  (tmp_path / 'batch_rl' / '__init__.py').write_text('')
  (package / '__init__.py').write_text('')
  (package / 'run_experiment.py').write_text('REAL = True\n')
  result = fresh_python(
    """
    import fixed_replay
    import batch_rl.fixed_replay.run_experiment as module
    print(module.REAL, module.__file__.endswith('run_experiment.py'))
    """,
    PYTHONPATH=f'{tmp_path}{os.pathsep}{ROOT}',
  )
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.split() == ['True', 'True']
