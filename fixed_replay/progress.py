"""Progress for people at a terminal; log lines in logs and CI."""

import os
import sys
import time
from typing import Any

from absl import logging
import tqdm

# Least time between two TaskBoard log lines with the same counts.
_LOG_EVERY_S = 60.0


def bar(
  total: int | None,
  desc: str,
  unit: str = 'it',
  unit_scale: bool = False,
  show: bool | None = None,
  **options: Any,
) -> Any:
  """Returns a tqdm bar on stderr.

  Args:
    total: number of units the job has (None: unknown).
    desc: str, what is being done.
    unit: str, what is counted.
    unit_scale: bool, show 12.3k instead of 12345.
    show: bool, whether to draw it; None: only when stderr is a terminal
      (a bar in a log file is noise: callers log lines instead).
    **options: further tqdm arguments (bar_format, ...).
  """
  return tqdm.tqdm(
    total=total,
    desc=desc,
    unit=unit,
    unit_scale=unit_scale,
    disable=not (sys.stderr.isatty() if show is None else show),
    dynamic_ncols=True,
    leave=False,
    **options,
  )


def format_bytes(num_bytes: int | None) -> str:
  """Formats a byte count in decimal units: '512 B', '49.00 kB', '7.06 GB'.

  Decimal, as disk sizes are quoted; None (unknown) is '-'.
  """
  if num_bytes is None:
    return '-'
  value = float(num_bytes)
  for unit in ('B', 'kB', 'MB', 'GB', 'TB'):
    if abs(value) < 1000 or unit == 'TB':
      break
    value /= 1000
  return f'{int(value)} B' if unit == 'B' else f'{value:.2f} {unit}'


def count(number: int, noun: str) -> str:
  """'1 game', '2 games': a count and its noun, plural when not one."""
  return f'{number} {noun}' if number == 1 else f'{number} {noun}s'


def format_duration(seconds: float) -> str:
  """Formats seconds as e.g. '2d 03h 04m', '3h 04m 05s' or '4m 05s'."""
  seconds = int(round(seconds))
  days, seconds = divmod(seconds, 86_400)
  hours, seconds = divmod(seconds, 3_600)
  minutes, seconds = divmod(seconds, 60)
  if days:
    return f'{days}d {hours:02d}h {minutes:02d}m'
  if hours:
    return f'{hours}h {minutes:02d}m {seconds:02d}s'
  return f'{minutes}m {seconds:02d}s'


class TaskBoard:
  """Done / running / failed counts and an ETA for a job of many tasks.

  At a terminal it is one bar; otherwise (logs, CI) it logs a line whenever
  the counts change and once a minute while work progresses. The ETA
  extrapolates the work done since the board was created, so tasks finished
  by an earlier invocation do not make it optimistic.
  """

  def __init__(self, total: int, desc: str, unit: str = 'task') -> None:
    """Creates the board.

    Args:
      total: int, tasks in the whole job (finished ones included).
      desc: str, what the job is, e.g. 'sweep'.
      unit: str, what a task is, e.g. 'trial'.
    """
    self._total = total
    self._desc = desc
    self._unit = unit
    self._began = time.monotonic()
    self._first_fraction = None
    self._last_counts = None
    self._last_log = -float('inf')
    self._bar = bar(total, desc, bar_format='{percentage:3.0f}%|{bar}| {desc}')

  def update(
    self,
    done: int,
    running: int,
    failed: int,
    fraction: float,
    retrying: int = 0,
  ) -> None:
    """Shows the current state of the job.

    Args:
      done: int, tasks finished (in this or an earlier invocation).
      running: int, tasks in flight.
      failed: int, tasks that failed for good.
      fraction: float in [0, 1], share of the whole job's work done,
        counting partial progress of running tasks.
      retrying: int, running tasks that are a retry of a failed attempt.
    """
    if self._first_fraction is None:
      self._first_fraction = fraction
    pending = self._total - done - running - failed
    eta = self.eta_seconds(fraction)
    text = (
      f'{done}/{self._total} {self._unit}s done, {running} running'
      f'{f" ({retrying} retrying)" if retrying else ""}, {failed} failed, '
      f'{pending} pending; ETA {"?" if eta is None else format_duration(eta)}'
    )
    counts = (done, running, failed, retrying)
    if not self._bar.disable:
      self._bar.n = fraction * self._total
      self._bar.set_description_str(f'{self._desc}: {text}', refresh=True)
      return
    now = time.monotonic()
    if counts != self._last_counts or (
      now - self._last_log >= _LOG_EVERY_S and fraction > self._first_fraction
    ):
      logging.info('%s: %s', self._desc, text)
      self._last_counts = counts
      self._last_log = now

  def eta_seconds(self, fraction: float) -> float | None:
    """Seconds left at the rate of this invocation, or None if unknown."""
    if fraction >= 1.0:
      return 0.0
    if self._first_fraction is None:
      return None
    progressed = fraction - self._first_fraction
    if progressed <= 0:
      return None
    elapsed = time.monotonic() - self._began
    return elapsed * (1.0 - fraction) / progressed

  def close(self) -> None:
    self._bar.close()


class FilesProgress:
  """Progress through a list of files: a bar, or a log line per file.

  The bar counts bytes, not files: one observation file weighs as much as
  all the others of its checkpoint together.
  """

  def __init__(
    self,
    sizes: dict[str, int],
    desc: str = 'verifying',
    show: bool | None = None,
  ) -> None:
    """Starts reporting.

    Args:
      sizes: dict of path to size in bytes, the files to go through.
      desc: str, what is done to each file, e.g. 'verifying'.
      show: bool, draw a bar on stderr; None: only when stderr is a
        terminal (otherwise each file is logged).
    """
    self._sizes = sizes
    self._desc = desc
    self._total = sum(sizes.values())
    self._done_files = 0
    self._done_bytes = 0
    self._bar = bar(self._total, desc, unit='B', unit_scale=True, show=show)

  @property
  def has_bar(self) -> bool:
    """Whether a bar is drawn (log lines would break it)."""
    return not self._bar.disable

  def start(self, path: str) -> None:
    """Reports that work on `path` begins."""
    if self.has_bar:
      self._bar.set_postfix_str(os.path.basename(path))
      return
    logging.info(
      '%s file %d/%d (%s of %s done): %s (%s)',
      self._desc.capitalize(),
      self._done_files + 1,
      len(self._sizes),
      format_bytes(self._done_bytes),
      format_bytes(self._total),
      path,
      format_bytes(self._sizes.get(path, 0)),
    )

  def done(self, path: str) -> None:
    """Reports that `path` is done."""
    size = self._sizes.get(path, 0)
    self._done_files += 1
    self._done_bytes += size
    self._bar.update(size)

  def close(self) -> None:
    self._bar.close()
