"""The one local Ray cluster that the tests of xdist_group('ray') share.

Starting Ray costs seconds of CPU on every start (its servers and idle
workers import Ray), so the in-process Ray tests (test_distributed,
test_ray_convert) share one cluster that lives for the session, on the
xdist worker that runs the 'ray' group. Commands that start their own
cluster, as a user's `fixed-replay sweep` or `convert --ray` does, still do.
"""

import contextlib
import time

import psutil

from fixed_replay import distributed

# Descendants of this process that existed before the cluster started.
_before = set()


def live_children():
  """Live descendants of this test process."""
  found = []
  for process in psutil.Process().children(recursive=True):
    try:
      if process.status() != psutil.STATUS_ZOMBIE:
        found.append(process)
    except psutil.NoSuchProcess:
      continue
  return found


def ray_processes():
  """Live processes the shared cluster started for this test process."""
  return [p for p in live_children() if p.pid not in _before]


@contextlib.contextmanager
def running(num_cpus=2, grace_seconds=20.0):
  """Runs the cluster; on exit asserts that none of its processes is left."""
  _before.update(p.pid for p in live_children())
  with distributed.cluster(num_cpus=num_cpus) as info:
    yield info
  deadline = time.monotonic() + grace_seconds
  while ray_processes() and time.monotonic() < deadline:
    time.sleep(0.2)
  left = ray_processes()
  for process in left:
    process.kill()
  assert not left, [p.cmdline() for p in left]
