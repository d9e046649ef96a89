"""Drop-in, in fresh processes, the way users run it.

batch_rl's five gin files and Dopamine's labs/offline_rl jax_dqn.gin, byte
for byte (tests/data/), every agent, and batch_rl's --init_checkpoint_dir,
each through `fixed-replay train` (`python -m fixed_replay.cli train`) or
`python -m fixed_replay.train`, or as batch_rl's own end-to-end test calls
it (the flags set in code, then `main([])`), with bindings that only make
the run tiny. Every run trains, evaluates in the real game and checkpoints.
(The docs' own-agent recipes run as the guide prints them:
tests/test_docs.py.)

Each run takes seconds but starts TensorFlow and JAX (about 10 s of CPU):
the runs this session selected are started together, two at a time, and
each test waits for its own. All are in the slow tier.
"""

import concurrent.futures
import os
import pickle
import re
import shutil
import subprocess
import sys

import pytest

from fixed_replay.generate import generate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, 'tests', 'data')
CONFIGS = os.path.join(ROOT, 'configs')
CLI = ['-m', 'fixed_replay.cli', 'train']  # `fixed-replay train`
TRAIN_MODULE = ['-m', 'fixed_replay.train']  # batch_rl's entry point
GPU_FALLBACK = "tf_device='/gpu:0' but TensorFlow sees no GPU"

# One xdist worker runs this module: the `runs` fixture starts every job the
# session selected, so on two workers each would run all of them.
pytestmark = pytest.mark.xdist_group('dropin')

ATARI_TINY = [
  'FixedReplayRunner.num_iterations = 1',
  'FixedReplayRunner.training_steps = 8',
  'FixedReplayRunner.evaluation_steps = 20',
  'FixedReplayRunner.max_steps_per_episode = 20',
]
CARTPOLE_TINY = [
  'FixedReplayRunner.num_iterations = 1',
  'FixedReplayRunner.training_steps = 20',
  'FixedReplayRunner.evaluation_steps = 20',
  'FixedReplayBuffer.batch_size = 32',
]
# The method each agent's run log names.
METHODS = {
  'dqn': 'DQN',
  'c51': 'C51',
  'multi_head_dqn': 'Ensemble-DQN',
  'quantile': 'QR-DQN',
  'rem': 'REM',
  'multi_network_dqn': 'REM over 4 separate networks',
  'jax_dqn': 'DQN',
  'jax_quantile': 'QR-DQN',
  'jax_rem': 'REM',
  'jax_cql': 'CQL(H) on DQN',
  'jax_quantile_cql': 'CQL(H) on QR-DQN',
}


def _batch_rl(name):
  return os.path.join(DATA, 'batch_rl_configs', f'{name}.gin')


def _ours(agent):
  return os.path.join(CONFIGS, 'cartpole', f'{agent}.gin')


def _train(entry, base, data, agent, gin_file, bindings, *flags):
  """One training command: (argv after python, base_dir)."""
  argv = entry + [
    f'--base_dir={base}',
    f'--replay_dir={data}',
    f'--agent_name={agent}',
    f'--gin_files={gin_file}',
  ]
  argv += [f'--gin_bindings={b}' for b in bindings] + list(flags)
  return argv, base


# batch_rl's end-to-end test (batch_rl/tests/fixed_replay_runner_test.py)
# as it runs from a batch_rl checkout after `import fixed_replay`: it imports
# batch_rl's train module, sets the flags in code, then calls main([]); only
# --replay_dir comes from the command line, which absl parses first.
_FLAGS_SET_IN_CODE = """
import os
os.chdir({checkout!r})
import fixed_replay
from absl import app
from absl import flags
from batch_rl.fixed_replay import train

def set_the_flags_and_train(argv):
  flags.FLAGS.base_dir = {base!r}
  flags.FLAGS.agent_name = 'multi_head_dqn'
  flags.FLAGS.gin_files = ['batch_rl/fixed_replay/configs/rem.gin']
  flags.FLAGS.gin_bindings = {bindings!r}
  train.main([])

app.run(set_the_flags_and_train)
"""


def _flags_set_in_code(tmp, pong):
  """The batch_rl runner test's path: (argv after python, base_dir)."""
  checkout = tmp / 'batch_rl_checkout'
  configs = checkout / 'batch_rl' / 'fixed_replay' / 'configs'
  configs.mkdir(parents=True)
  shutil.copy(_batch_rl('rem'), configs / 'rem.gin')
  base = f'{tmp}/flags_set_in_code'
  bindings = [
    "create_runner.schedule='continuous_train_and_eval'",
    *ATARI_TINY,
  ]
  script = _FLAGS_SET_IN_CODE.format(
    checkout=str(checkout), base=base, bindings=bindings
  )
  return ['-c', script, f'--replay_dir={pong}'], base


def _jobs(tmp, pong, cartpole):
  """{job name: [(argv, base_dir), ...]} run in order in one worker."""
  labs = os.path.join(DATA, 'dopamine_offline_rl_configs', 'jax_dqn.gin')
  jobs = {
    # batch_rl's configs, agent names and both entry points. Each binds
    # the 5 checkpoints of batch_rl's buffer; the data has 4.
    'dqn': [
      _train(
        CLI,
        f'{tmp}/dqn',
        pong,
        'dqn',
        _batch_rl('dqn'),
        ATARI_TINY + ['FixedReplayRunner.num_iterations = 2'],
      )
    ],
    'c51': [
      _train(
        TRAIN_MODULE,
        f'{tmp}/c51',
        pong,
        'c51',
        _batch_rl('c51'),
        ATARI_TINY + ['WrappedFixedReplayBuffer.replay_suffix = 1'],
        '--verbose',  # As `fixed-replay train` takes it.
      )
    ],
    'multi_head_dqn': [
      _train(
        CLI,
        f'{tmp}/multi_head_dqn',
        pong,
        'multi_head_dqn',
        _batch_rl('multi_head_dqn'),
        ATARI_TINY + ['FixedReplayMultiHeadDQNAgent.replay_suffix = 3'],
      )
    ],
    'quantile': [
      _train(
        TRAIN_MODULE,
        f'{tmp}/quantile',
        pong,
        'quantile',
        _batch_rl('quantile'),
        ATARI_TINY + ['FixedReplayBuffer.replay_suffix = 7'],
      )
    ],
    # batch_rl's rem.gin: the "Coming from batch_rl" guide's own command
    # trains with it (tests/test_docs.py, test_batch_rl_rem_config_...).
    # Dopamine's labs config: its Runner.* and JaxFixedReplayBuffer.*.
    'jax_dqn': [
      _train(
        CLI,
        f'{tmp}/jax_dqn',
        pong,
        'jax_dqn',
        labs,
        [
          'Runner.num_iterations = 1',
          'Runner.training_steps = 10',
          'Runner.evaluation_steps = 20',
          'Runner.max_steps_per_episode = 20',
          'JaxFixedReplayBuffer.replay_capacity = 900',
          'JaxFixedReplayBuffer.batch_size = 8',
        ],
        # Dopamine's own parameter dump: the evidence that its bindings
        # reached Dopamine's class (hidden by default).
        '--verbose',
      )
    ],
    # Then batch_rl's --init_checkpoint_dir continues this run elsewhere.
    'rem': [
      _train(CLI, f'{tmp}/rem', cartpole, 'rem', _ours('rem'), CARTPOLE_TINY),
      _train(
        TRAIN_MODULE,
        f'{tmp}/rem_continued',
        cartpole,
        'rem',
        _ours('rem'),
        CARTPOLE_TINY + ['FixedReplayRunner.num_iterations = 2'],
        f'--init_checkpoint_dir={tmp}/rem',
      ),
    ],
    'multi_network_dqn': [
      _train(
        TRAIN_MODULE,
        f'{tmp}/multi_network_dqn',
        cartpole,
        'multi_network_dqn',
        _ours('multi_network_dqn'),
        CARTPOLE_TINY
        + [
          "FixedReplayBuffer.subsample = 'random_episodes'",
          'FixedReplayBuffer.subsample_fraction = 0.5',
        ],
      )
    ],
  }
  jobs['flags_set_in_code'] = [_flags_set_in_code(tmp, pong)]
  for agent in ('jax_quantile', 'jax_rem', 'jax_cql', 'jax_quantile_cql'):
    bindings = list(CARTPOLE_TINY)
    if agent == 'jax_rem':
      bindings += [
        "FixedReplayBuffer.subsample = 'first_episodes'",
        'FixedReplayBuffer.subsample_fraction = 0.5',
      ]
    entry = CLI if agent in ('jax_quantile', 'jax_cql') else TRAIN_MODULE
    jobs[agent] = [
      _train(entry, f'{tmp}/{agent}', cartpole, agent, _ours(agent), bindings)
    ]
  return jobs


class Run:
  """What one command left: its return code, logs and base_dir."""

  def __init__(self, result, base_dir):
    self.returncode = result.returncode
    self.stdout = result.stdout
    self.log = result.stderr  # absl logs to stderr.
    self.base_dir = base_dir

  def explain(self):
    return f'exit {self.returncode}:\n{self.log[-4000:]}'

  def files(self, *parts):
    directory = os.path.join(self.base_dir, *parts)
    return set(os.listdir(directory)) if os.path.isdir(directory) else set()

  def logged(self, iteration):
    """The statistics pickle of the run's log at `iteration`."""
    path = os.path.join(self.base_dir, 'logs', f'log_{iteration}')
    with open(path, 'rb') as f:
      return pickle.load(f)


def _run_job(commands, env):
  runs = []
  for argv, base_dir in commands:
    result = subprocess.run(
      [sys.executable] + argv,
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
      check=False,
    )
    runs.append(Run(result, base_dir))
    if result.returncode:
      break
  return runs


@pytest.fixture(scope='module')
def runs(request, dopamine_dir, tmp_path_factory):
  """Starts every selected job (two at a time); get(name) waits for one."""
  tmp = tmp_path_factory.mktemp('dropin')
  cartpole = tmp / 'cartpole'
  generate.generate_dataset(
    str(cartpole / 'replay_logs'),
    environment='cartpole',
    num_checkpoints=2,
    checkpoint_rows=1000,
    policy='scripted',
    epsilon=0.4,
    seed=0,
    progress=False,
  )
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join([ROOT, env.get('PYTHONPATH', '')])
  # Quiet by default, as users run them; the jobs that need Dopamine's own
  # output pass --verbose.
  env.pop('FIXED_REPLAY_VERBOSE', None)
  jobs = _jobs(tmp, str(dopamine_dir[0]), str(cartpole))
  selected = {
    item.callspec.params['job']
    for item in request.session.items
    if item.module is request.module and hasattr(item, 'callspec')
  }
  pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
  futures = {
    name: pool.submit(_run_job, jobs[name], env)
    for name in jobs
    if name in selected
  }
  yield lambda name: futures[name].result()
  pool.shutdown(wait=True, cancel_futures=True)


def _assert_trained_evaluated_checkpointed(run, iterations=1, tf_agent=True):
  assert run.returncode == 0, run.explain()
  last = iterations - 1
  assert f'Iteration {last} ({iterations}/{iterations}) done' in run.log
  assert 'eval return' in run.log and 'ETA' in run.log
  checkpoints = run.files('checkpoints')
  assert {f'ckpt.{last}', f'sentinel_checkpoint_complete.{last}'} <= (
    checkpoints
  ), checkpoints
  if tf_agent:
    assert f'tf_ckpt-{last}.index' in checkpoints
  stats = run.logged(last)[f'iteration_{last}']
  assert stats['eval_episode_returns']
  assert stats['train_average_steps_per_second'][0] > 0


def _loaded_checkpoints(run):
  loaded = re.findall(r'Loaded checkpoint (\d+) of \S+ rows', run.log)
  return {int(s) for s in loaded}


# ------------------------------------------------------- every agent, CLI


@pytest.mark.slow
@pytest.mark.parametrize('job', list(METHODS))
def test_every_agent_trains_evaluates_and_checkpoints(runs, job):
  run = runs(job)[0]
  _assert_trained_evaluated_checkpointed(
    run,
    iterations=2 if job == 'dqn' else 1,
    tf_agent=not job.startswith('jax_'),
  )
  assert f'Training {METHODS[job]} (' in run.log


# --------------------------------------------------- batch_rl's gin files


@pytest.mark.slow
@pytest.mark.parametrize(
  'job, method',
  [
    ('dqn', 'DQN (FixedReplayDQNAgent)'),
    ('c51', 'C51 (FixedReplayRainbowAgent)'),
    ('multi_head_dqn', 'Ensemble-DQN (FixedReplayMultiHeadDQNAgent)'),
    ('quantile', 'QR-DQN (FixedReplayQuantileAgent)'),
  ],
)
def test_batch_rl_configs_run_unchanged(runs, job, method):
  # (rem.gin, through `python -m fixed_replay.train`: test_docs.py.)
  run = runs(job)[0]
  _assert_trained_evaluated_checkpointed(
    run, iterations=2 if job == 'dqn' else 1
  )
  # batch_rl's transform_strategy chooses the method; the log says which.
  assert f'Training {method} offline' in run.log
  # tf_device='/gpu:0' on this CPU machine: built on the CPU, said once.
  assert run.log.count(GPU_FALLBACK) == 1, run.log[-3000:]


@pytest.mark.slow
def test_batch_rl_default_buffer_count_uses_all_of_fewer_silently(runs):
  # batch_rl's dqn.gin binds no count: its 5, of the 4 there are, unasked.
  run = runs('dqn')[0]  # Two iterations: one reload.
  assert _loaded_checkpoints(run) == {0, 1, 3, 7}
  assert 'num_buffers_to_load=' not in run.log


@pytest.mark.slow
@pytest.mark.parametrize(
  'job, suffix, bound_on',
  [
    ('c51', 1, 'WrappedFixedReplayBuffer'),
    ('multi_head_dqn', 3, 'the agent'),
    ('quantile', 7, 'FixedReplayBuffer'),
  ],
)
def test_replay_suffix_binding_trains_on_one_checkpoint(
  runs, job, suffix, bound_on
):
  run = runs(job)[0]
  assert run.returncode == 0, run.explain()
  assert _loaded_checkpoints(run) == {suffix}, bound_on
  assert 'num_buffers_to_load=5 but' not in run.log


@pytest.mark.slow
@pytest.mark.parametrize('job', ['flags_set_in_code'])
def test_batch_rl_runner_test_sets_the_flags_in_code(runs, job):
  # Only --replay_dir is on the command line: --base_dir, required at the
  # command line, is set in code after absl has parsed it.
  run = runs(job)[0]
  _assert_trained_evaluated_checkpointed(run)
  # The files batch_rl's test checks, TF's checkpoint index among them.
  assert 'checkpoint' in run.files('checkpoints')
  assert 'log_0' in run.files('logs')
  assert 'Training REM (FixedReplayMultiHeadDQNAgent) offline' in run.log


# ------------------------------------------------ Dopamine's labs config


@pytest.mark.slow
@pytest.mark.parametrize('job', ['jax_dqn'])
def test_dopamine_labs_config_runs_unchanged(runs, job):
  run = runs(job)[0]
  assert run.returncode == 0, run.explain()
  # Its JaxFixedReplayBuffer.* bindings reached Dopamine's class, which runs
  # on our buffer, and its Runner.* bindings reached the runner.
  assert 'Creating JaxFixedReplayBuffer' in run.log
  assert 'replay_capacity: 900' in run.log
  assert re.search(r'Loaded checkpoint \d+ of \S+ rows \[0, 900\)', run.log)
  assert 'Iteration 0: 10 training steps' in run.log


# ---------------------------------------------------------- --verbose


@pytest.mark.slow
@pytest.mark.parametrize('job, verbose', [('c51', True), ('quantile', False)])
def test_train_module_shows_third_party_output_with_verbose_only(
  runs, job, verbose
):
  # Both through `python -m fixed_replay.train`; only c51's has --verbose.
  run = runs(job)[0]
  assert run.returncode == 0, run.explain()
  dump = 'agent with the following parameters'
  assert (dump in run.log) == verbose, run.log[-3000:]


# ------------------------------------------ batch_rl's init_checkpoint_dir


@pytest.mark.slow
@pytest.mark.parametrize('job', ['rem'])
def test_init_checkpoint_dir_continues_the_run(runs, job):
  first, second = runs(job)
  _assert_trained_evaluated_checkpointed(second, iterations=2)
  assert 'Continuing from checkpoint 0 of' in second.log
  assert 'starting at iteration 1' in second.log
  assert 'Iteration 0 (' not in second.log  # Only iteration 1 trained.
  assert 'ckpt.0' not in second.files('checkpoints')
  # The first run's history came along.
  assert set(second.logged(1)) == {'iteration_0', 'iteration_1'}
  assert second.logged(1)['iteration_0'] == first.logged(0)['iteration_0']


# ------------------------------------------------------------- subsets


@pytest.mark.slow
@pytest.mark.parametrize(
  'job, method',
  [('jax_rem', 'first_episodes'), ('multi_network_dqn', 'random_episodes')],
)
def test_subsample_binding_takes_effect(runs, job, method):
  run = runs(job)[0]
  assert run.returncode == 0, run.explain()
  kept = re.findall(
    rf"subsample='{method}' keeps (\d+) of (\d+) episodes", run.log
  )
  assert len(kept) == 2, run.log[-3000:]  # Both checkpoints.
  for count, total in kept:
    assert int(count) == int(0.5 * int(total)) >= 1
