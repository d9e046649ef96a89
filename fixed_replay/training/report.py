"""Results of sweeps: per game and agent tables and learning curves.

Trials are found by their directories, `BASE/<game>/<run>/<agent>/seed_<s>/`
(what `fixed-replay sweep` writes), and read with the runner's own log
reader (`plotting.load_eval_returns`). Per game and agent, over all its
trials (runs x seeds):

* final return: each trial's average evaluation return at its last
  iteration, mean and standard deviation over trials;
* best return: each trial's highest per-iteration average, likewise;
* DQN-normalized (REM paper) and human-normalized final return, in percent,
  from `reference_scores` (empty, with the reason, where a game has no
  published reference, e.g. CartPole);
* per agent, the median of the normalized scores over games.
"""

import collections
from collections.abc import Sequence
import csv
import dataclasses
import io
import math
import re
from typing import Any

from absl import logging
import numpy as np

from fixed_replay import progress
from fixed_replay.io import files as storage
from fixed_replay.store import store_inspection
from fixed_replay.training import plotting
from fixed_replay.training import reference_scores

_SEED_DIR = re.compile(r'^seed_(-?\d+)$')

TrialCurve = collections.namedtuple(
  'TrialCurve',
  ['game', 'run', 'agent', 'seed', 'directory', 'iterations', 'returns'],
)


def find_trials(directory: str) -> list[tuple[str, str, str, int, str]]:
  """Returns [(game, run, agent, seed, path)] of the trials under directory.

  Raises:
    ValueError: if directory holds no <game>/<run>/<agent>/seed_<s>/.
  """
  found = []
  for game in _subdirectories(directory):
    game_dir = storage.join(directory, game)
    for run in _subdirectories(game_dir):
      run_dir = storage.join(game_dir, run)
      for agent in _subdirectories(run_dir):
        agent_dir = storage.join(run_dir, agent)
        for name in _subdirectories(agent_dir):
          if match := _SEED_DIR.match(name):
            path = storage.join(agent_dir, name)
            found.append((game, run, agent, int(match.group(1)), path))
  if not found:
    raise ValueError(
      f'{directory}: no trial directories (<game>/<run>/<agent>/seed_<n>/); '
      'is it the --base_dir of a fixed-replay sweep?'
    )
  return sorted(found)


def _subdirectories(directory: str):
  if not storage.isdir(directory):
    return []
  return sorted(
    name
    for name in storage.listdir(directory)
    if not name.startswith('.') and storage.isdir(storage.join(directory, name))
  )


def load_curves(
  directories: Sequence[str],
) -> tuple[list[Any], list[tuple[str, str]]]:
  """Reads every trial's evaluation returns.

  Args:
    directories: list of sweep directories.

  Returns:
    (list of TrialCurve, list of (path, reason) for trials without any
    evaluation yet).
  """
  curves, skipped = [], []
  for directory in directories:
    for game, run, agent, seed, path in find_trials(directory):
      try:
        iterations, returns = plotting.load_eval_returns(path)
      except ValueError as error:
        skipped.append((path, str(error)))
        continue
      curves.append(
        TrialCurve(game, run, agent, seed, path, iterations, returns)
      )
  keys = collections.Counter(c[:4] for c in curves)
  for key, count in keys.items():
    if count > 1:
      logging.warning('Trial %s appears in %d directories', key, count)
  return curves, skipped


@dataclasses.dataclass
class Row:
  """One line of the table: a game and agent over its trials."""

  game: str
  agent: str
  trials: int
  first_iterations: int
  last_iterations: int
  final_mean: float
  final_std: float
  best_mean: float
  best_std: float
  dqn_normalized: float | None
  human_normalized: float | None
  note: str = ''


def _grouped(items, key):
  """[(key, items with that key)], sorted by key, items in their order."""
  groups = collections.defaultdict(list)
  for item in items:
    groups[key(item)].append(item)
  return sorted(groups.items())


def _mean_std(values):
  values = np.asarray(values, dtype=np.float64)
  std = float(np.std(values, ddof=1)) if len(values) > 1 else math.nan
  return float(np.mean(values)), std


def summarize(curves: Sequence[Any]) -> list['Row']:
  """Returns one Row per (game, agent), sorted by game then agent."""
  rows = []
  for (game, agent), group in _grouped(curves, lambda c: (c.game, c.agent)):
    final_mean, final_std = _mean_std([c.returns[-1] for c in group])
    best_mean, best_std = _mean_std([c.returns.max() for c in group])
    lengths = [int(c.iterations[-1]) + 1 for c in group]
    dqn, dqn_reason = reference_scores.dqn_normalized(game, final_mean)
    human, human_reason = reference_scores.human_normalized(game, final_mean)
    notes = list(dict.fromkeys([dqn_reason, human_reason]))
    if min(lengths) != max(lengths):
      notes.append('trials reached different iterations')
    rows.append(
      Row(
        game,
        agent,
        len(group),
        min(lengths),
        max(lengths),
        final_mean,
        final_std,
        best_mean,
        best_std,
        dqn,
        human,
        '; '.join(n for n in notes if n),
      )
    )
  return rows


def medians(rows: Sequence['Row']) -> list[tuple]:
  """Per agent: (agent, games, median DQN-normalized, median human-norm.)."""
  return [
    (
      agent,
      len(group),
      *_median(r.dqn_normalized for r in group),
      *_median(r.human_normalized for r in group),
    )
    for agent, group in _grouped(rows, lambda r: r.agent)
  ]


def _median(values):
  """(median of the values that are not None, or None; how many there are)."""
  kept = [v for v in values if v is not None]
  return (float(np.median(kept)) if kept else None), len(kept)


def _number(value, digits: int = 1) -> str:
  if value is None or (isinstance(value, float) and math.isnan(value)):
    return ''
  return f'{value:.{digits}f}'


def _spread(mean, std):
  return _number(mean, 2) + ('' if math.isnan(std) else f' ± {std:.2f}')


def _iterations(row):
  if row.first_iterations == row.last_iterations:
    return str(row.last_iterations)
  return f'{row.first_iterations}-{row.last_iterations}'


def format_markdown(
  rows: Sequence['Row'], skipped: Sequence[tuple[str, str]] = ()
) -> str:
  """The table, the medians and the notes, as Markdown."""
  lines = [
    '| game | agent | trials | iterations | final return | best return '
    '| DQN-normalized % | human-normalized % |',
    '|---|---|---:|---:|---:|---:|---:|---:|',
  ]
  for r in rows:
    lines.append(
      f'| {r.game} | {r.agent} | {r.trials} | {_iterations(r)} | '
      f'{_spread(r.final_mean, r.final_std)} | '
      f'{_spread(r.best_mean, r.best_std)} | {_number(r.dqn_normalized)} | '
      f'{_number(r.human_normalized)} |'
    )
  lines += [
    '',
    'Returns: mean ± standard deviation over trials (runs x seeds) of the '
    'average evaluation return at the last iteration (final) and at the '
    'best one (best). Normalized: the final return, 100 (agent - random) / '
    '(online DQN - random) as in the REM paper, and 100 (agent - random) / '
    '(human - random); sources in fixed_replay/training/reference_scores.py.',
    '',
    '| agent | games | median DQN-normalized % | median human-normalized % |',
    '|---|---:|---:|---:|',
  ]
  for agent, games, dqn, n_dqn, human, n_human in medians(rows):
    lines.append(
      f'| {agent} | {games} | {_number(dqn)} '
      f'({progress.count(n_dqn, "game")}) | '
      f'{_number(human)} ({progress.count(n_human, "game")}) |'
    )
  notes = [f'- {r.game} / {r.agent}: {r.note}' for r in rows if r.note]
  notes += [f'- skipped {path}: {reason}' for path, reason in skipped]
  if notes:
    lines += ['', 'Notes:'] + notes
  return '\n'.join(lines) + '\n'


CSV_COLUMNS = (
  'game',
  'agent',
  'trials',
  'iterations',
  'final_mean',
  'final_std',
  'best_mean',
  'best_std',
  'dqn_normalized_pct',
  'human_normalized_pct',
  'note',
)


def format_csv(rows: Sequence['Row']) -> str:
  """The table as CSV; per agent a 'median' row holds the medians."""
  buffer = io.StringIO()
  writer = csv.writer(buffer, lineterminator='\n')
  writer.writerow(CSV_COLUMNS)
  for r in rows:
    writer.writerow(
      [
        r.game,
        r.agent,
        r.trials,
        _iterations(r),
        repr(r.final_mean),
        '' if math.isnan(r.final_std) else repr(r.final_std),
        repr(r.best_mean),
        '' if math.isnan(r.best_std) else repr(r.best_std),
        '' if r.dqn_normalized is None else repr(r.dqn_normalized),
        '' if r.human_normalized is None else repr(r.human_normalized),
        r.note,
      ]
    )
  for agent, games, dqn, n_dqn, human, n_human in medians(rows):
    writer.writerow(
      ['median', agent, games, '', '', '', '', '']
      + ['' if dqn is None else repr(dqn), '' if human is None else repr(human)]
      + [
        f'median over {n_dqn} and {progress.count(n_human, "game")} with '
        'reference scores'
      ]
    )
  return buffer.getvalue()


def mean_curve(
  curves: Sequence[Any],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(iterations, mean, std, count) over curves, per iteration any reached."""
  by_iteration = collections.defaultdict(list)
  for curve in curves:
    for iteration, value in zip(curve.iterations, curve.returns, strict=True):
      by_iteration[int(iteration)].append(float(value))
  iterations = np.array(sorted(by_iteration))
  values = [by_iteration[i] for i in iterations]
  mean = np.array([np.mean(v) for v in values])
  std = np.array([np.std(v, ddof=1) if len(v) > 1 else 0.0 for v in values])
  count = np.array([len(v) for v in values])
  return iterations, mean, std, count


def make_game_figure(game: str, curves: Sequence[Any]) -> Any:
  """One game's learning curves: per agent the mean over trials, ± 1 std."""
  figure = plotting.new_figure('fixed-replay report', 8)
  axes = figure.add_subplot()
  for agent, group in _grouped(curves, lambda c: c.agent):
    iterations, mean, std, _ = mean_curve(group)
    (line,) = axes.plot(
      iterations, mean, label=f'{agent} ({len(group)} trials)'
    )
    axes.fill_between(
      iterations, mean - std, mean + std, color=line.get_color(), alpha=0.2
    )
  axes.set_title(f'{game}: mean over trials, shaded ± 1 standard deviation')
  plotting.finish_axes(axes)
  return figure


def write_report(
  directories: Sequence[str],
  output: str | None = None,
  overwrite: bool = False,
  data_dirs: Sequence[str] = (),
) -> tuple[str, list[str]]:
  """Reads sweeps, returns the Markdown table; writes files under output.

  Args:
    directories: list of sweep directories (may be empty with data_dirs).
    output: str or None, prefix of the files to write: PREFIX.md,
      PREFIX.csv and PREFIX_<game>.png. None writes nothing.
    overwrite: bool, replace existing files.
    data_dirs: datasets whose own game score per checkpoint the report
      states (store_inspection.data_scores).

  Returns:
    (markdown text, list of paths written).

  Raises:
    ValueError: if no trial has an evaluation yet.
    FileExistsError: if an output file exists and overwrite is False.
    CheckpointError: if a data_dirs entry is not a dataset.
  """
  scores = store_inspection.data_scores(data_dirs) if data_dirs else ''
  if not directories:
    return scores.lstrip('\n'), []
  curves, skipped = load_curves(directories)
  if not curves:
    raise ValueError(
      'No trial has finished an iteration yet: '
      + '; '.join(f'{p}: {r}' for p, r in skipped)
    )
  rows = summarize(curves)
  markdown = format_markdown(rows, skipped) + scores
  if not output:
    return markdown, []
  paths = {f'{output}.md': markdown, f'{output}.csv': format_csv(rows)}
  for game, group in _grouped(curves, lambda c: c.game):
    paths[f'{output}_{game}.png'] = (game, group)
  existing = [p for p in paths if storage.exists(p)]
  if existing and not overwrite:
    raise FileExistsError(
      f'{", ".join(existing)} exist(s); pass --overwrite to replace, or '
      'choose another --output'
    )
  for path, content in paths.items():
    if isinstance(content, tuple):  # A game's (name, curves): drawn now.
      content = make_game_figure(*content)
    plotting.write_file(path, content)
    logging.info('Wrote %s', path)
  return markdown, list(paths)
