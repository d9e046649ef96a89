"""Converts checkpoints as Ray tasks (`fixed-replay convert --ray`).

Each pending checkpoint is one task that reserves one CPU and calls
checkpoint_commit.convert_checkpoint, as a worker process does, so the
stored bytes are the same: written into a partial directory, verified,
renamed into place. distributed.run_tasks keeps as many tasks in flight as
the cluster has CPUs, retries a failed or lost attempt (a worker or node
that died) and shows one progress display for the job.

The tasks write into the store themselves. On a cluster the store must be
a directory every node mounts at the same path (NFS, a parallel file
system): before the tasks start, the converting process writes a token
into `DST/.convert.job`, and a task that does not find it there fails with
that message rather than filling a directory of its own node. A task holds
the store's workers' lock (destination.py) while it runs, so that a new
conversion never works beside a task of a killed one.
"""

import contextlib
import os
import socket
from typing import Any
import uuid

from absl import logging

from fixed_replay import distributed
from fixed_replay.errors import CheckpointError
from fixed_replay.errors import CheckpointProblems
from fixed_replay.store import checkpoint_commit
from fixed_replay.store import convert_runners
from fixed_replay.store import destination
from fixed_replay.store.checkpoint_source import CheckpointSource
from fixed_replay.store.convert_options import ConvertOptions

JOB_FILE = '.convert.job'
MAX_ATTEMPTS = 3


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
  path = os.path.join(store_dir, JOB_FILE)
  try:
    with open(path, 'w') as stream:
      stream.write(token)
      stream.flush()
      os.fsync(stream.fileno())
  except OSError as error:
    raise destination.error(path, error) from error


def _remove_job_file(store_dir: str) -> None:
  with contextlib.suppress(FileNotFoundError):
    os.remove(os.path.join(store_dir, JOB_FILE))


def task_key(item: convert_runners.Pending) -> str:
  """A task's name in logs: the checkpoint it writes."""
  return f'{item.store_dir}/checkpoint_{item.source.suffix}'


class RayRunner:
  """A convert_runners.ConversionRunner: one Ray task per checkpoint.

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
    self._info = None

  def __enter__(self) -> 'RayRunner':
    return self

  def __exit__(self, *exc_info: Any) -> bool | None:
    return self._stack.__exit__(*exc_info)

  def _cluster(self):
    if self._info is None:
      if isinstance(self._ray, distributed.ClusterInfo):
        self._info = self._ray
      else:
        address = None if self._ray is True else self._ray
        self._info = self._stack.enter_context(
          distributed.cluster(address, num_cpus=self._workers)
        )
    return self._info

  def run(
    self, pending: list[convert_runners.Pending], options: ConvertOptions
  ) -> None:
    """Converts `pending` (convert_runners.Pending) as Ray tasks.

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
        key, convert_task, (item.source, item.store_dir, options, token)
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
        max_attempts=MAX_ATTEMPTS,
        fresh_process=False,
        desc='converting',
        unit='checkpoint',
      )
    finally:
      for store_dir in stores:
        _remove_job_file(store_dir)
    for key, result in sorted(outcome.results.items()):
      convert_runners.log_result(result, tasks[key].store_dir)
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
        f'failed {MAX_ATTEMPTS} times on Ray; last: '
        f'{outcome.failures[key][-1].splitlines()[0]}',
      )
    errors.append(cause)
  logging.error(
    '%d checkpoint(s) failed after %d attempts each; the others are stored',
    len(errors),
    MAX_ATTEMPTS,
  )
  if len(errors) == 1:
    return errors[0]
  store = os.path.commonpath([tasks[key].store_dir for key in outcome.failures])
  return CheckpointProblems(store, errors)
