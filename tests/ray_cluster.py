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

# Processes the cluster started when it came up (its servers): theirs, such
# as Ray's workers, are its processes too.
_roots = set()


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
  """Live processes of the shared cluster: those it started, and theirs.

  Other children of this process (another test's pool, multiprocessing's
  resource tracker) are not the cluster's, however long they live.
  """
  found = []
  for process in live_children():
    try:
      lineage = {process.pid} | {parent.pid for parent in process.parents()}
    except psutil.NoSuchProcess:
      continue
    if lineage & _roots:
      found.append(process)
  return found


def _alive(process):
  try:
    return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
  except psutil.NoSuchProcess:
    return False


@contextlib.contextmanager
def running(num_cpus=2, grace_seconds=20.0):
  """Runs the cluster; on exit asserts that none of its processes is left."""
  before = {p.pid for p in live_children()}
  with distributed.cluster(num_cpus=num_cpus) as info:
    _roots.update(p.pid for p in live_children() if p.pid not in before)
    yield info
    started = ray_processes()
  deadline = time.monotonic() + grace_seconds
  while any(map(_alive, started)) and time.monotonic() < deadline:
    time.sleep(0.2)
  left = []
  for process in started:
    try:
      if _alive(process):
        left.append(' '.join(process.cmdline()))
        process.kill()
    except psutil.NoSuchProcess:
      continue
  assert not left, left
