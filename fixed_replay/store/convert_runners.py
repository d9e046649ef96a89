"""Who converts the pending checkpoints: this process or worker processes.

A ConversionRunner (the Protocol below) is a context manager whose
`run(pending, options)` returns once every Pending checkpoint is stored, or
raises. All runners call checkpoint_commit.convert_checkpoint, so they write
the same bytes:

* `InProcess`: one by one in this process (--workers=0);
* `ProcessPool`: worker processes that die with this one (workers.py),
  unless the job is small (SMALL_JOB_ROWS) and --workers was not given;
* ray_convert.RayRunner: a Ray task per checkpoint, retried when it fails.

convert.py chooses among them; Ray's runner imports this module, never the
reverse.
"""

import concurrent.futures
import os
import time
from typing import Any
from typing import NamedTuple
from typing import Protocol

from absl import logging
import numpy as np

from fixed_replay import progress
from fixed_replay.errors import CheckpointError
from fixed_replay.store import checkpoint_commit
from fixed_replay.store import workers as worker_processes
from fixed_replay.store.checkpoint_source import CheckpointSource
from fixed_replay.store.convert_options import ConvertOptions

_LOG_EVERY_S = 30.0
# With the default --workers, a job this small (or of one checkpoint) is
# converted in this process: starting worker processes (each imports numpy,
# blosc2 and TensorFlow) costs more than the conversion itself; a small RL
# Unplugged shard took 24 s with workers and 6 s without, the same bytes.
SMALL_JOB_ROWS = 100_000


class Pending(NamedTuple):
  """One checkpoint to convert.

  Attributes:
    source: the checkpoint's rows.
    store_dir: str, the store it goes to.
    rows: int, the rows it is expected to hold (for progress).
  """

  source: CheckpointSource
  store_dir: str
  rows: int


class ConversionRunner(Protocol):
  """Converts pending checkpoints; a context manager around its resources."""

  def __enter__(self) -> 'ConversionRunner': ...

  def __exit__(self, *exc_info: Any) -> bool | None: ...

  def run(self, pending: list[Pending], options: ConvertOptions) -> None:
    """Returns once every checkpoint of `pending` is stored, or raises."""
    ...


def _format_eta(seconds: float) -> str:
  seconds = int(seconds)
  return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'


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
        _format_eta(eta) if np.isfinite(eta) else '?',
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


class InProcess:
  """Converts the pending checkpoints one by one in this process."""

  def __enter__(self) -> ConversionRunner:
    return self

  def __exit__(self, *unused_exc_info: Any) -> bool:
    return False

  def run(self, pending: list[Pending], options: ConvertOptions) -> None:
    bar = FrameProgress(sum(item.rows for item in pending))
    done = 0
    try:
      for item in pending:
        result = checkpoint_commit.convert_checkpoint(
          item.source, item.store_dir, options, os.cpu_count() or 1
        )
        done += item.rows
        bar.update(done)
        log_result(result, item.store_dir)
    finally:
      bar.close()


class ProcessPool:
  """Converts the pending checkpoints in worker processes, with progress.

  An interrupt (or any exception but a checkpoint's own failure) kills the
  workers at once; a failed checkpoint lets the others finish, so that a
  rerun has less to do.
  """

  def __init__(self, workers: int | None = None) -> None:
    self._workers = workers

  def __enter__(self) -> ConversionRunner:
    return self

  def __exit__(self, *unused_exc_info: Any) -> bool:
    return False

  def run(self, pending: list[Pending], options: ConvertOptions) -> None:
    small = sum(item.rows for item in pending) <= SMALL_JOB_ROWS
    if self._workers is None and (small or len(pending) == 1):
      logging.info(
        'Converting in this process (%s, %s rows: less than starting '
        'workers would cost; --workers=N to use N processes)',
        progress.count(len(pending), 'checkpoint'),
        f'{sum(item.rows for item in pending):,}',
      )
      return InProcess().run(pending, options)
    count = self._workers or min(len(pending), os.cpu_count() or 1)
    count = min(count, len(pending))
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
          options,
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
    except CheckpointError:
      pool.shutdown(wait=True, cancel_futures=True)
      raise
    except BaseException:
      worker_processes.kill(pool)
      pool.shutdown(wait=True, cancel_futures=True)
      raise
    finally:
      pool.shutdown(wait=True)
      bar.close()
