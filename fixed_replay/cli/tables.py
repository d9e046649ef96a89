"""The text tables `fixed-replay inspect` (and `demo`) print.

One table per kind of summary: a Dopamine replay directory or a compact store
(summaries.DirectorySummary: one line per checkpoint suffix) and an RL
Unplugged run (rlu_inspection.RunSummary: one line per checkpoint_idx), each
closed by a line of totals, then the list of problems, each naming its file.
No flags here: any command may print these.
"""

from fixed_replay.progress import format_bytes
from fixed_replay.sources import summaries

_DIRECTORY_COLUMNS = (
  'suffix',
  'status',
  'rows',
  'add_count',
  'cursor',
  'full',
  'valid',
  'episodes',
  'return min / mean / max',
  'observation',
  'disk',
  'data',
)
# What the columns rows .. valid show of a checkpoint.
_CHECKPOINT_VALUES = ('rows', 'add_count', 'cursor', 'is_full', 'num_valid')
_RUN_COLUMNS = (
  'checkpoint',
  'episodes',
  'steps',
  'terminal',
  'return min / mean / max',
  'parts',
)


def _aligned(columns, rows, left):
  """Lines of a table: numbers right-aligned, the columns in `left` left."""
  table = [columns] + rows
  widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
  return [
    '  '.join(
      c.ljust(w) if i in left else c.rjust(w)
      for i, (c, w) in enumerate(zip(r, widths, strict=True))
    ).rstrip()
    for r in table
  ]


def _returns(episodes):
  if episodes is None or not episodes.count:
    return '-'
  return (
    f'{episodes.min_return:.4g} / {episodes.mean_return:.4g} / '
    f'{episodes.max_return:.4g}'
  )


def _value(value):
  if value is None:
    return '-'
  if isinstance(value, bool):
    return 'yes' if value else 'no'
  return str(value)


def _observation(summary):
  if summary.observation_shape is None:
    return '-'
  shape = 'x'.join(str(n) for n in summary.observation_shape) or 'scalar'
  return f'{shape} {summary.observation_dtype}'


def _checkpoint_row(summary):
  episodes = summary.episodes
  return (
    str(summary.suffix),
    summary.status,
    *(_value(getattr(summary, name)) for name in _CHECKPOINT_VALUES),
    _value(episodes.count if episodes else None),
    _returns(episodes),
    _observation(summary),
    format_bytes(summary.disk_bytes),
    format_bytes(summary.data_bytes),
  )


_GAME_COLUMN = 'game score min / mean / max'
_NO_GAME_SCORE = (
  '; game score: not recorded (no unclipped_reward element; conversions of '
  'RL Unplugged data keep it)'
)


def _with_game_scores(columns, rows, stats, total):
  """Inserts the game-score column after the returns, or says it is absent.

  Args:
    columns: the table's column names.
    rows: its rows, the totals last.
    stats: EpisodeStats (or None) of each row but the totals.
    total: the totals' EpisodeStats, or None when nothing records it.

  Returns:
    (columns, rows, note): note is '' or what the title says of its
    absence.
  """
  if total is None:
    return columns, rows, _NO_GAME_SCORE
  at = columns.index('return min / mean / max') + 1
  cells = [_returns(s) for s in stats] + [_returns(total)]
  rows = [r[:at] + (c,) + r[at:] for r, c in zip(rows, cells, strict=True)]
  return columns[:at] + (_GAME_COLUMN,) + columns[at:], rows, ''


def format_table(summary):
  """A DirectorySummary: one line per suffix, then the totals."""
  rows = [_checkpoint_row(s) for s in summary.checkpoints]
  episodes = summary.episodes
  rows.append(
    (
      'total',
      f'{summary.num_complete}/{len(summary.checkpoints)} complete',
      str(summary.total('rows')),
      '',
      '',
      '',
      str(summary.total('num_valid')),
      str(episodes.count),
      _returns(episodes),
      '',
      format_bytes(summary.total('disk_bytes')),
      format_bytes(summary.total('data_bytes')),
    )
  )
  mode = 'verified' if summary.verified else 'headers only, not verified'
  formats = sorted(
    {
      f'{s.format_version} ({s.compression})'
      for s in summary.checkpoints
      if s.format_version
    }
  )
  if formats:
    mode += ', compact store format version ' + ', '.join(formats)
  columns, rows, note = _with_game_scores(
    _DIRECTORY_COLUMNS,
    rows,
    [s.game_episodes for s in summary.checkpoints],
    summary.game_episodes,
  )
  title = (
    f'{summary.directory} (stack_size={summary.stack_size}, '
    f'update_horizon={summary.update_horizon}, {mode}; episodes: the '
    f"complete ones within each checkpoint's rows{note})"
  )
  left = {1} | set(range(8, len(columns)))
  return '\n'.join([title] + _aligned(columns, rows, left))


def format_run_table(summary):
  """An RL Unplugged RunSummary: one line per checkpoint, then the totals."""
  checkpoints = summary.checkpoints
  counts = ('episodes', 'steps', 'terminal')
  rows = [
    (
      str(e.checkpoint),
      *(str(getattr(e, name)) for name in counts),
      _returns(e.returns),
      ', '.join(e.parts),
    )
    for e in checkpoints
  ]
  rows.append(
    (
      'total',
      *(str(sum(getattr(e, name) for e in checkpoints)) for name in counts),
      _returns(summaries.EpisodeStats.combine(e.returns for e in checkpoints)),
      f'{len(summary.parts)} read, '
      f'{sum(not p.ok for p in summary.parts)} damaged',
    )
  )
  game = [e.game_returns for e in checkpoints]
  columns, rows, note = _with_game_scores(
    _RUN_COLUMNS,
    rows,
    game,
    None if None in game or not game else summaries.EpisodeStats.combine(game),
  )
  mode = 'every frame decoded' if summary.verified else 'frames not decoded'
  size = format_bytes(sum(p.num_bytes for p in summary.parts))
  title = (
    f'{summary.location} (RL Unplugged {summary.kind}, {size}, {mode}; '
    f'terminal: episodes ending with discount 0{note})'
  )
  left = set(range(4, len(columns)))
  return '\n'.join([title] + _aligned(columns, rows, left))


def format_problems(summary):
  """One line per problem of a summary, each naming its file ('' if none)."""
  problems = summary.all_problems
  if not problems:
    return ''
  lines = [f'{len(problems)} problem(s):']
  return '\n'.join(lines + [f'  {p}' for p in problems])
