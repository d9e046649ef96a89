"""Evaluation return per iteration of training runs, read from their logs.

The runner (like Dopamine's) pickles its whole log, {'iteration_N':
{statistic: [values]}}, to `logs/log_N` after every iteration and keeps the
last few files. Every readable file is merged, newest last, so a file cut
short by a crash costs nothing but its own iteration.
"""

import collections
from collections.abc import Sequence
import io
import os
import pickle
import re
from typing import Any

from absl import logging
import numpy as np

from fixed_replay import compat
from fixed_replay.io import files as storage

_LOG_FILE = re.compile(r'^log_(\d+)$')
_ITERATION_KEY = re.compile(r'^iteration_(\d+)$')

Curve = collections.namedtuple('Curve', ['label', 'iterations', 'returns'])


def _logs_dir(run_dir: str):
  """Returns the folder of log_N files: run_dir/logs or run_dir itself."""
  run_dir = str(run_dir)
  for candidate in (storage.join(run_dir, 'logs'), run_dir):
    if storage.isdir(candidate) and any(
      _LOG_FILE.match(name) for name in storage.listdir(candidate)
    ):
      return candidate
  raise ValueError(
    f'{run_dir}: no log files (logs/log_N) found; is it the --base_dir of a '
    'training run that has finished at least one iteration?'
  )


def load_statistics(run_dir: str) -> dict[int, dict[str, list]]:
  """Returns {iteration: {statistic: [values]}} logged by a run.

  Args:
    run_dir: str, a run's base directory (or its logs/ folder).

  Returns:
    dict, iteration number -> that iteration's statistics.

  Raises:
    ValueError: if no log file exists or none can be read.
  """
  directory = _logs_dir(run_dir)
  numbered = sorted(
    (int(m.group(1)), name)
    for name in storage.listdir(directory)
    if (m := _LOG_FILE.match(name))
  )
  merged = {}
  problems = []
  for _, name in numbered:
    path = storage.join(directory, name)
    try:
      with storage.open_read(path) as f:
        data = pickle.load(f)
    except (EOFError, pickle.UnpicklingError, ValueError) as error:
      problems.append(f'{path}: {str(error) or type(error).__name__}')
      continue
    if not isinstance(data, dict):
      problems.append(f'{path}: holds a {type(data).__name__}, not a dict')
      continue
    merged.update(data)
  for problem in problems:
    logging.warning('Skipping unreadable log file %s', problem)
  if not merged and problems:
    raise ValueError(f'No readable log file in {directory}: {problems}')
  statistics = {}
  for key, value in merged.items():
    match = _ITERATION_KEY.match(key)
    if match:
      statistics[int(match.group(1))] = value
  return dict(sorted(statistics.items()))


def _eval_return(statistics):
  """Average evaluation return of one iteration, or None if not evaluated."""
  if statistics.get('eval_average_return'):
    return float(statistics['eval_average_return'][-1])
  if statistics.get('eval_episode_returns'):
    return float(np.mean(statistics['eval_episode_returns']))
  return None


def load_eval_returns(run_dir: str) -> tuple[np.ndarray, np.ndarray]:
  """Returns (iterations, average evaluation returns) of a run, as arrays.

  Raises:
    ValueError: if the run's logs hold no evaluation.
  """
  pairs = [
    (iteration, value)
    for iteration, stats in load_statistics(run_dir).items()
    if (value := _eval_return(stats)) is not None
  ]
  if not pairs:
    raise ValueError(f'{run_dir}: the logs hold no evaluation return')
  iterations, returns = zip(*pairs, strict=True)
  return np.array(iterations), np.array(returns, dtype=np.float64)


def _labels(run_dirs):
  """Directory names, or the paths as given where names would clash."""
  names = [os.path.basename(os.path.normpath(str(d))) for d in run_dirs]
  counts = collections.Counter(names)
  return [
    name if counts[name] == 1 else str(d)
    for name, d in zip(names, run_dirs, strict=True)
  ]


def load_curves(run_dirs, labels=None):
  """Returns one Curve (label, iterations, returns) per run directory.

  Args:
    run_dirs: list of run base directories.
    labels: optional list of labels (default: the directory names).
  """
  labels = labels or _labels(run_dirs)
  return [
    Curve(label, *load_eval_returns(run_dir))
    for label, run_dir in zip(labels, run_dirs, strict=True)
  ]


def make_figure(
  curves: Sequence[Any],
  title: str | None = None,
  panels: bool = False,
  references: Any = None,
) -> Any:
  """Returns a matplotlib Figure with one line per curve.

  Uses the object-oriented API (no pyplot), so it needs no display and
  leaves no global state behind.

  Args:
    curves: list of Curve.
    title: str or None.
    panels: bool, one panel per curve, side by side, each with its own
      return scale (for runs on different games); False draws every curve
      in one panel.
    references: optional list, per curve, of (label, return) drawn as a
      dashed horizontal line (e.g. the dataset's own average), or None.
  """
  groups = [[c] for c in curves] if panels else [curves]
  figure = new_figure('fixed-replay plot', 5 * len(groups) if panels else 8)
  references = references or [None] * len(curves)
  lines = dict(zip([c.label for c in curves], references, strict=True))
  for index, group in enumerate(groups):
    axes = figure.add_subplot(1, len(groups), index + 1)
    for curve in group:
      drawn = axes.plot(
        curve.iterations,
        curve.returns,
        label=curve.label,
        marker='o' if len(curve.iterations) <= 30 else None,
        markersize=4,
      )[0]
      if lines[curve.label] is not None:
        label, value = lines[curve.label]
        axes.axhline(
          value, linestyle='--', color=drawn.get_color(), label=label
        )
    finish_axes(axes)
  if title:
    figure.suptitle(title)
  return figure


def new_figure(purpose: str, width: float) -> Any:
  """A matplotlib Figure, width x 5 inches, once matplotlib is installed."""
  compat.require('matplotlib', purpose=purpose)
  from matplotlib.figure import Figure

  return Figure(figsize=(width, 5), dpi=100, layout='constrained')


def finish_axes(axes: Any) -> None:
  """Axes of evaluation return per iteration: labels, grid and legend."""
  from matplotlib.ticker import MaxNLocator

  axes.set_xlabel('Iteration')
  axes.xaxis.set_major_locator(MaxNLocator(integer=True))
  axes.set_ylabel('Average evaluation return')
  axes.grid(alpha=0.3)
  axes.legend()


def write_file(path: str, content: Any) -> None:
  """Writes a str (as UTF-8) or a matplotlib Figure (as PNG) to path."""
  if isinstance(content, str):
    data = content.encode('utf-8')
  else:
    buffer = io.BytesIO()
    content.savefig(buffer, format='png')
    data = buffer.getvalue()
  with storage.open_write(path) as f:
    f.write(data)


def plot_eval_returns(
  run_dirs,
  output,
  title=None,
  overwrite: bool = False,
  panels: bool = False,
  labels=None,
  references=None,
):
  """Plots evaluation return per iteration of runs into a PNG file.

  Args:
    run_dirs: list of run base directories.
    output: str, the PNG to write (local or gs://).
    title: str or None.
    overwrite: bool, replace output if it exists.
    panels: bool, one panel per run (see make_figure).
    labels: optional list of labels, one per run (default: directory
      names).
    references: optional list of (label, return) or None per run, drawn as
      dashed lines (see make_figure).

  Returns:
    list of the Curves plotted.

  Raises:
    FileExistsError: if output exists and overwrite is False.
    ValueError: if a run has no readable evaluation.
  """
  output = str(output)
  if storage.exists(output) and not overwrite:
    raise FileExistsError(
      f'{output} exists; pass --overwrite to replace it or choose another '
      '--output'
    )
  curves = load_curves(run_dirs, labels)
  write_file(output, make_figure(curves, title, panels, references))
  logging.info('Wrote %s (%d runs)', output, len(curves))
  return curves
