"""Who converts the pending checkpoints: this process, workers or Ray.

A ConversionRunner (the Protocol below) is a context manager whose
`run(pending)` returns once every Pending checkpoint is stored, or
raises. All runners call checkpoint_commit.convert_checkpoint, so they write
the same bytes (into a partial directory, verified, renamed into place):

* `InProcess`: one by one in this process (--workers=0);
* `ProcessPool`: worker processes that die with this one (workers.py),
  unless the job is small (SMALL_JOB_ROWS) and --workers was not given;
* `RayRunner` (`--ray`): a Ray task per checkpoint, reserving one CPU.
  distributed.run_tasks keeps as many in flight as the cluster has CPUs,
  retries a failed or lost attempt (a worker or node that died) and shows
  one progress display for the job.

Ray's tasks write into the store themselves. On a cluster the store must be
a directory every node mounts at the same path (NFS, a parallel file
system): before the tasks start, the converting process writes a token
into `DST/.convert.job`, and a task that does not find it there fails with
that message rather than filling a directory of its own node. A task holds
the store's workers' lock (destination.py) while it runs, so that a new
conversion never works beside a task of a killed one.

convert.py chooses among them.
"""

import concurrent.futures
import contextlib
import os
import socket
import time
from typing import Any
from typing import NamedTuple
from typing import Protocol
import uuid

from absl import logging
import numpy as np

from fixed_replay import distributed
from fixed_replay import progress
from fixed_replay.convert import checkpoint_commit
from fixed_replay.convert import destination
from fixed_replay.convert import workers as worker_processes
from fixed_replay.convert.checkpoint_source import CheckpointSource
from fixed_replay.convert.convert_options import ConvertOptions
from fixed_replay.errors import CheckpointError
from fixed_replay.errors import CheckpointProblems

_LOG_EVERY_S = 30.0
# With the default --workers, a job this small (or of one checkpoint) is
# converted in this process: starting worker processes (each imports numpy,
# zstandard and TensorFlow) costs more than the conversion itself; a small RL
# Unplugged shard took 24 s with workers and 6 s without, the same bytes.
SMALL_JOB_ROWS = 100_000
JOB_FILE = '.convert.job'
MAX_RAY_ATTEMPTS = 3


class Pending(NamedTuple):
  """One checkpoint to convert.

  Attributes:
    source: the checkpoint's rows.
    store_dir: str, the store it goes to.
    rows: int, the rows it is expected to hold (for progress).
    options: ConvertOptions, its store's (the game is each store's own).
  """

  source: CheckpointSource
  store_dir: str
  rows: int
  options: ConvertOptions


class ConversionRunner(Protocol):
  """Converts pending checkpoints; a context manager around its resources."""

  def __enter__(self) -> 'ConversionRunner': ...

  def __exit__(self, *exc_info: Any) -> bool | None: ...

  def run(self, pending: list[Pending]) -> None:
    """Returns once every checkpoint of `pending` is stored, or raises."""
    ...


class FrameProgress:
  """A tqdm bar at a terminal, a log line every 30 s otherwise."""

  def __init__(self, total: int) -> None:
    self._total = total
    self._bar = progress.bar(total, 'converting', unit='frame', unit_scale=True)
    self._began = time.perf_counter()
    self._last_log = self._began
    self._shown = 0

  def update(self, done: int) -> None:
    self._bar.update(done - self._shown)
    self._shown = done
    now = time.perf_counter()
    if self._bar.disable and now - self._last_log >= _LOG_EVERY_S:
      self._last_log = now
      rate = done / max(now - self._began, 1e-9)
      eta = (self._total - done) / rate if rate else float('inf')
      logging.info(
        'Converted %d of %d frames (%.0f%%), %.0f frames/s, ETA %s',
        done,
        self._total,
        100 * done / max(self._total, 1),
        rate,
        progress.format_duration(eta) if np.isfinite(eta) else '?',
      )

  def close(self) -> None:
    self._bar.close()


def log_result(result: dict, store_dir: str) -> None:
  """Logs one converted checkpoint (convert_checkpoint's result)."""
  logging.info(
    'Converted checkpoint %d (%d rows) into %s in %.1f s',
    result['suffix'],
    result['rows'],
    store_dir,
    result['seconds'],
  )


class _NothingToRelease:
  """A runner with nothing to set up or release around its runs."""

  def __enter__(self) -> ConversionRunner:
    return self

  def __exit__(self, *unused_exc_info: Any) -> bool:
    return False


class InProcess(_NothingToRelease):
  """Converts the pending checkpoints one by one in this process."""

  def run(self, pending: list[Pending]) -> None:
    bar = FrameProgress(sum(item.rows for item in pending))
    done = 0
    try:
      for item in pending:
        result = checkpoint_commit.convert_checkpoint(
          item.source, item.store_dir, item.options, os.cpu_count() or 1
        )
        done += item.rows
        bar.update(done)
        log_result(result, item.store_dir)
    finally:
      bar.close()


class ProcessPool(_NothingToRelease):
  """Converts the pending checkpoints in worker processes, with progress.

  An interrupt (or any exception but a checkpoint's own failure) kills the
  workers at once; a failed checkpoint lets the others finish, so that a
  rerun has less to do.
  """

  def __init__(self, workers: int | None = None) -> None:
    self._workers = workers

  def run(self, pending: list[Pending]) -> None:
    small = sum(item.rows for item in pending) <= SMALL_JOB_ROWS
    if self._workers is None and (small or len(pending) == 1):
      logging.info(
        'Converting in this process (%s, %s rows: less than starting '
        'workers would cost; --workers=N to use N processes)',
        progress.count(len(pending), 'checkpoint'),
        f'{sum(item.rows for item in pending):,}',
      )
      return InProcess().run(pending)
    count = min(self._workers or os.cpu_count() or 1, len(pending))
    threads = max(1, (os.cpu_count() or 1) // count)
    bar = FrameProgress(sum(item.rows for item in pending))
    stores = sorted({item.store_dir for item in pending})
    pool, counter = worker_processes.start_pool(count, stores)
    try:
      futures = {
        pool.submit(
          checkpoint_commit.convert_checkpoint,
          item.source,
          item.store_dir,
          item.options,
          threads,
        ): item
        for item in pending
      }
      waiting = set(futures)
      while waiting:
        done, waiting = concurrent.futures.wait(
          waiting, timeout=1.0, return_when=concurrent.futures.FIRST_COMPLETED
        )
        bar.update(counter.value)
        for future in done:
          log_result(future.result(), futures[future].store_dir)
    except BaseException as error:
      if not isinstance(error, CheckpointError):
        worker_processes.kill(pool)
      pool.shutdown(wait=True, cancel_futures=True)
      raise
    finally:
      pool.shutdown(wait=True)
      bar.close()


def check_shared(store_dir: str, token: str) -> None:
  """Raises CheckpointError unless `store_dir` holds this job's token."""
  path = os.path.join(store_dir, JOB_FILE)
  try:
    with open(path) as stream:
      found = stream.read()
  except FileNotFoundError:
    found = None
  if found != token:
    raise CheckpointError(
      store_dir,
      f'the node {socket.gethostname()} does not see the store the '
      f'converting process writes ({JOB_FILE} is '
      f'{"missing" if found is None else "another job`s"} there): with a '
      'Ray cluster DST must be a directory every node mounts at the same '
      'path (a shared file system)',
    )


def convert_task(
  source: CheckpointSource, store_dir: str, options: ConvertOptions, token: str
) -> dict:
  """A Ray task: converts one checkpoint into the shared store."""
  check_shared(store_dir, token)
  lock = destination.hold_workers_lock(store_dir)
  try:
    return checkpoint_commit.convert_checkpoint(
      source, store_dir, options, threads=1
    )
  finally:
    lock.close()


def _write_job_file(store_dir: str, token):
  try:
    destination.write_bytes(store_dir, JOB_FILE, token.encode())
  except OSError as error:
    path = os.path.join(store_dir, JOB_FILE)
    raise destination.error(path, error) from error


def task_key(item: Pending) -> str:
  """A task's name in logs: the checkpoint it writes."""
  return f'{item.store_dir}/checkpoint_{item.source.suffix}'


class RayRunner:
  """A ConversionRunner: one Ray task per checkpoint.

  The cluster is started (or joined) at the first `run` and left at exit.
  """

  def __init__(
    self, ray: bool | str | distributed.ClusterInfo, workers: int | None = None
  ) -> None:
    """Takes the Ray to use.

    Args:
      ray: True (a private local Ray on 127.0.0.1), a str (the address of a
        cluster: 'auto', 'HOST:PORT', 'ray://HOST:PORT') or a
        distributed.ClusterInfo (Ray already connected in this process).
      workers: int or None, CPUs of the local Ray (None: all); must be None
        with a cluster, whose CPUs decide.

    Raises:
      ValueError: for workers=0, or workers with a cluster.
    """
    if workers == 0:
      raise ValueError('workers=0 converts in this process: not with Ray')
    if workers is not None and ray is not True:
      raise ValueError(
        'workers sets the CPUs of a local Ray; on a cluster its CPUs decide'
      )
    self._ray = ray
    self._workers = workers
    self._stack = contextlib.ExitStack()
    self._info = ray if isinstance(ray, distributed.ClusterInfo) else None

  def __enter__(self) -> 'RayRunner':
    return self

  def __exit__(self, *exc_info: Any) -> bool | None:
    return self._stack.__exit__(*exc_info)

  def _cluster(self):
    if self._info is None:
      address = None if self._ray is True else self._ray
      self._info = self._stack.enter_context(
        distributed.cluster(address, num_cpus=self._workers)
      )
    return self._info

  def run(self, pending: list[Pending]) -> None:
    """Converts `pending` (Pending) as Ray tasks.

    Raises:
      CheckpointError: the checkpoint's own error after its last attempt
        (CheckpointProblems if several failed); the others are stored.
    """
    info = self._cluster()
    token = uuid.uuid4().hex
    stores = sorted({item.store_dir for item in pending})
    tasks = {task_key(item): item for item in pending}
    jobs = [
      distributed.Task(
        key, convert_task, (item.source, item.store_dir, item.options, token)
      )
      for key, item in tasks.items()
    ]
    distributed.check_feasible(info, jobs)
    try:
      for store_dir in stores:
        _write_job_file(store_dir, token)
      # One worker process serves many tasks: no import per checkpoint.
      outcome = distributed.run_tasks(
        jobs,
        max_attempts=MAX_RAY_ATTEMPTS,
        fresh_process=False,
        desc='converting',
        unit='checkpoint',
      )
    finally:
      for store_dir in stores:
        with contextlib.suppress(FileNotFoundError):
          os.remove(os.path.join(store_dir, JOB_FILE))
    for key, result in sorted(outcome.results.items()):
      log_result(result, tasks[key].store_dir)
    if outcome.failures:
      raise _failure(outcome, tasks)


def _failure(outcome, tasks):
  """The CheckpointError to raise for the tasks that failed for good."""
  errors = []
  for key in sorted(outcome.failures):
    cause = outcome.causes.get(key)
    if not isinstance(cause, CheckpointError):
      cause = CheckpointError(
        key,
        f'failed {MAX_RAY_ATTEMPTS} times on Ray; last: '
        f'{outcome.failures[key][-1].splitlines()[0]}',
      )
    errors.append(cause)
  logging.error(
    '%d checkpoint(s) failed after %d attempts each; the others are stored',
    len(errors),
    MAX_RAY_ATTEMPTS,
  )
  if len(errors) == 1:
    return errors[0]
  store = os.path.commonpath([tasks[key].store_dir for key in outcome.failures])
  return CheckpointProblems(store, errors)
