"""Conversion worker processes that never outlive the converting process.

A worker is started with `spawn`, imports for about a second, then runs
`initialize`. Linux kills it (SIGKILL) when its parent dies once
`PR_SET_PDEATHSIG` is set; a parent that died before that is caught by
comparing the parent's pid. Each worker also holds the store's workers' lock
(see destination.py) until it dies, and checks its parent once more before
renaming a finished checkpoint into place. On an interrupt the converting
process kills its workers itself (`kill`).
"""

from collections.abc import Sequence
import concurrent.futures
import ctypes
import multiprocessing
import os
import signal
import sys
from typing import Any

from absl import logging

from fixed_replay.convert import destination

_PR_SET_PDEATHSIG = 1  # From <linux/prctl.h>.

# Set in each worker by `initialize`.
_progress_rows = None  # Rows compressed so far by all workers (shared).
_parent_pid = None
_workers_lock = None


def _die_with_parent(parent_pid) -> None:
  """Asks Linux to kill this process when its parent dies; exits if it has."""
  if sys.platform.startswith('linux'):
    try:
      libc = ctypes.CDLL(None, use_errno=True)
      libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
      logging.warning('Cannot tie conversion workers to their parent')
  # The parent may have died before the request took effect: then we were
  # handed to another parent and must not write anything.
  if os.getppid() != parent_pid:
    os._exit(1)


def initialize(
  counter: Any, parent_pid: int, store_dirs: Sequence[str]
) -> None:
  """Runs first in every worker: ties it to its parent, takes the locks."""
  global _progress_rows, _parent_pid, _workers_lock
  _die_with_parent(parent_pid)
  _parent_pid = parent_pid
  _progress_rows = counter
  _workers_lock = [destination.hold_workers_lock(d) for d in store_dirs]


def parent_alive() -> bool:
  """False in a worker whose converting process is gone."""
  return _parent_pid is None or os.getppid() == _parent_pid


def count_progress(rows: int) -> None:
  """Adds to the rows-converted counter shared with the parent."""
  if _progress_rows is not None:
    with _progress_rows.get_lock():
      _progress_rows.value += rows


def start_pool(
  num_workers: int, store_dirs: Sequence[str]
) -> tuple[concurrent.futures.ProcessPoolExecutor, Any]:
  """Starts a process pool of workers and the counter they share.

  Args:
    num_workers: int.
    store_dirs: list of str, the stores they write (each worker holds each
      store's workers' lock for its whole life).

  Returns:
    (pool, counter): a ProcessPoolExecutor and a multiprocessing Value.
  """
  context = multiprocessing.get_context('spawn')
  counter = context.Value('q', 0)
  pool = concurrent.futures.ProcessPoolExecutor(
    num_workers,
    mp_context=context,
    initializer=initialize,
    initargs=(counter, os.getpid(), list(store_dirs)),
  )
  return pool, counter


def kill(pool: concurrent.futures.ProcessPoolExecutor) -> None:
  """Kills a pool's worker processes now (they may be mid-checkpoint)."""
  processes = list((getattr(pool, '_processes', None) or {}).values())
  for process in processes:
    if process.is_alive():
      process.kill()
  for process in processes:
    process.join(5)
