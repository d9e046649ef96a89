"""fixed_replay.distributed on a real local Ray: loopback, retries, workers."""

import os
import subprocess
import sys

import psutil
import pytest
from ray_cluster import ray_processes

from fixed_replay import distributed

# One local Ray cluster at a time: these tests share one xdist worker.
pytestmark = pytest.mark.xdist_group('ray')


# local_ray (conftest) is the session's shared cluster; ray_processes() are
# the processes it started.


def test_local_cluster_listens_on_the_loopback_only(local_ray):
  assert local_ray.local
  assert local_ray.address.startswith('127.0.0.1:')
  assert (local_ray.num_cpus, local_ray.num_gpus) == (2, 0)
  listening = set()
  for process in ray_processes():
    try:
      connections = process.net_connections('inet')
    except psutil.NoSuchProcess:
      continue
    listening |= {
      c.laddr.ip for c in connections if c.status == psutil.CONN_LISTEN
    }
  assert listening  # The GCS and the raylet at least.
  assert listening <= {'127.0.0.1', '::ffff:127.0.0.1'}, listening


def test_failed_attempts_are_retried_and_reported(local_ray, tmp_path):
  # Defined here so that Ray ships them by value to its workers.
  def fails_once(marker):
    if not os.path.exists(marker):
      open(marker, 'w').close()
      raise RuntimeError('first attempt fails')
    return 'second attempt'

  def always_fails():
    raise ValueError('always fails')

  seen = []
  outcome = distributed.run_tasks(
    [
      distributed.Task('flaky', fails_once, (str(tmp_path / 'marker'),)),
      distributed.Task('broken', always_fails),
      distributed.Task('fine', os.getpid),
    ],
    max_attempts=2,
    on_failed_attempt=lambda task, attempt, error, retry: seen.append(
      (task.key, attempt, retry, error.splitlines()[0])
    ),
    poll_seconds=0.5,
  )
  assert outcome.results['flaky'] == 'second attempt'
  assert isinstance(outcome.results['fine'], int)
  assert list(outcome.failures) == ['broken']
  assert len(outcome.failures['broken']) == 2
  assert outcome.failures['broken'][-1].startswith('ValueError: always fails')
  assert outcome.retried['flaky'][0].startswith(
    'RuntimeError: first attempt fails'
  )
  assert sorted(seen) == [
    ('broken', 1, True, 'ValueError: always fails'),
    ('broken', 2, False, 'ValueError: always fails'),
    ('flaky', 1, True, 'RuntimeError: first attempt fails'),
  ]


def test_every_attempt_gets_a_fresh_process(local_ray):
  outcome = distributed.run_tasks(
    [distributed.Task(f'task{i}', os.getpid) for i in range(4)],
    poll_seconds=0.5,
  )
  pids = list(outcome.results.values())
  assert len(set(pids)) == 4
  assert os.getpid() not in pids


def test_resources_no_node_has_are_refused(local_ray):
  with pytest.raises(ValueError, match='needs 1 CPUs and 1 GPUs but no node'):
    distributed.check_feasible(
      local_ray, [distributed.Task('t', os.getpid, num_gpus=1)]
    )


def test_ray_is_imported_only_by_commands_that_use_it():
  code = (
    'import sys\n'
    'import fixed_replay, fixed_replay.distributed\n'
    'import fixed_replay.cli.sweep, fixed_replay.cli.report\n'
    'import fixed_replay.training.sweep, fixed_replay.training.report\n'
    'assert "ray" not in sys.modules, "ray imported"\n'
    'assert "tensorflow" not in sys.modules, "tensorflow imported"\n'
  )
  result = subprocess.run(
    [sys.executable, '-c', code], capture_output=True, text=True, check=False
  )
  assert result.returncode == 0, result.stderr
