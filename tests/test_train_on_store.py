"""`fixed-replay train` on a compact store, in fresh processes, no binding.

A store converted with `fixed-replay convert` trains exactly as Dopamine's
files do: our TF and JAX configs and a batch_rl config, unchanged, with only
the bindings that make the run tiny. The runs the session selected start
together, two at a time (each starts TensorFlow or JAX), and each test waits
for its own.
"""

import concurrent.futures
import os
import re

import pytest
from test_dropin import ATARI_TINY
from test_dropin import CLI
from test_dropin import CONFIGS
from test_dropin import ROOT
from test_dropin import _assert_trained_evaluated_checkpointed
from test_dropin import _batch_rl
from test_dropin import _run_job
from test_dropin import _train


def _jobs(tmp, store):
  return {
    'dqn': [
      _train(
        CLI,
        f'{tmp}/dqn',
        store,
        'dqn',
        os.path.join(CONFIGS, 'dqn.gin'),
        ATARI_TINY,
      )
    ],
    'jax_dqn': [
      _train(
        CLI,
        f'{tmp}/jax_dqn',
        store,
        'jax_dqn',
        os.path.join(CONFIGS, 'jax_dqn.gin'),
        ATARI_TINY + ['FixedReplayJaxDQNAgent.min_replay_history = 0'],
      )
    ],
    # batch_rl's own file, with fewer checkpoints per iteration than the
    # store holds: two iterations, so a reload draws a new set.
    'batch_rl_dqn': [
      _train(
        CLI,
        f'{tmp}/batch_rl_dqn',
        store,
        'dqn',
        _batch_rl('dqn'),
        ATARI_TINY
        + [
          'FixedReplayRunner.num_iterations = 2',
          'FixedReplayBuffer.num_buffers_to_load = 2',
        ],
      )
    ],
  }


def _job(item):
  """The run a test of this module checks."""
  if hasattr(item, 'callspec'):
    return item.callspec.params['job']
  return 'batch_rl_dqn'


@pytest.fixture(scope='module')
def runs(request, store, tmp_path_factory):
  """Starts the runs this session selected (two at a time); get(name) waits
  for one (the core tier selects the TF one only)."""
  tmp = tmp_path_factory.mktemp('train_on_store')
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join([ROOT, env.get('PYTHONPATH', '')])
  selected = {
    _job(item)
    for item in request.session.items
    if item.module is request.module
  }
  pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
  futures = {
    name: pool.submit(_run_job, commands, env)
    for name, commands in _jobs(tmp, str(store)).items()
    if name in selected
  }
  yield lambda name: futures[name].result()[0]
  pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize('job', ['dqn', 'jax_dqn'])
def test_our_configs_train_on_a_store(runs, job):
  run = runs(job)
  _assert_trained_evaluated_checkpointed(run, tf_agent=job == 'dqn')
  assert 'FixedReplayBuffer over compact store' in run.log
  # The configs bind num_buffers_to_load = 5; the store has 4: all of them.
  assert run.log.count('num_buffers_to_load=5 but') == 1, run.log[-3000:]
  assert re.search(r'Sampling 4 checkpoint\(s\) of', run.log), run.log[-3000:]


def test_batch_rl_config_trains_on_a_store(runs):
  run = runs('batch_rl_dqn')
  _assert_trained_evaluated_checkpointed(run, iterations=2)
  assert 'num_buffers_to_load=2: sampling 2 of the 4 checkpoints' in run.log
  assert 'num_buffers_to_load = None' in run.log  # How to sample them all.
  opened = re.findall(r'Sampling 2 checkpoint\(s\) of', run.log)
  assert len(opened) >= 2, run.log[-3000:]  # The first set and a reload.
