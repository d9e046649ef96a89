"""What a replay directory holds, as `inspect` reports it.

Plain dataclasses (one per checkpoint, one per directory) filled by
inspection.py for Dopamine directories and by store_inspection.py for
compact stores, rendered by `fixed-replay inspect`, plus the episode returns
they report.
"""

from collections.abc import Iterable
from collections.abc import Sequence
import dataclasses

import numpy as np

OK = 'ok'
INCOMPLETE = 'incomplete'
DAMAGED = 'damaged'
# A compact store checkpoint of a format this library only upgrades.
OUTDATED = 'old format'


@dataclasses.dataclass(frozen=True)
class Problem:
  """One thing wrong with a file (or directory).

  Attributes:
    path: str, the file at fault.
    problem: str, what is wrong with it.
  """

  path: str
  problem: str

  def __str__(self) -> str:
    return f'{self.path}: {self.problem}'


@dataclasses.dataclass
class EpisodeStats:
  """Returns of the complete episodes of a checkpoint (None when count is 0).

  Attributes:
    count: int, complete episodes.
    min_return: float or None.
    mean_return: float or None.
    max_return: float or None.
  """

  count: int = 0
  min_return: float = None
  mean_return: float = None
  max_return: float = None

  @classmethod
  def from_returns(cls, returns: Sequence[float]) -> 'EpisodeStats':
    returns = np.asarray(returns, np.float64)
    if not len(returns):
      return cls()
    return cls(
      count=len(returns),
      min_return=float(returns.min()),
      mean_return=float(returns.mean()),
      max_return=float(returns.max()),
    )

  @classmethod
  def combine(cls, stats: Iterable['EpisodeStats']) -> 'EpisodeStats':
    """Pools the statistics of several checkpoints."""
    stats = [s for s in stats if s is not None and s.count]
    if not stats:
      return cls()
    count = sum(s.count for s in stats)
    return cls(
      count=count,
      min_return=min(s.min_return for s in stats),
      mean_return=sum(s.mean_return * s.count for s in stats) / count,
      max_return=max(s.max_return for s in stats),
    )


@dataclasses.dataclass
class CheckpointSummary:
  """What one checkpoint suffix holds; fields are None where unreadable.

  Attributes:
    suffix: int.
    complete: bool, whether every required file exists.
    missing: list of missing file names (empty when complete).
    rows: int, rows per array (the writer's capacity).
    add_count: int, rows ever added by the writer, padding included.
    cursor: int, add_count % rows: the writer's next slot.
    is_full: bool, add_count >= rows.
    num_valid: int, rows Dopamine would sample for the summary's stack_size
      and update_horizon.
    episodes: EpisodeStats of the episodes whose start and terminal both lie
      in the file.
    observation_shape: tuple, shape of one observation.
    observation_dtype: str.
    disk_bytes: int, size of all the suffix's files (compressed).
    data_bytes: int, bytes of the arrays once decompressed (headers
      excluded; the pickled episode_end_indices not counted).
    verified: bool, whether every file was decompressed and checked.
    problems: list of Problem.
    format_version: int, a compact store's format version, else None.
    outdated: bool, a store's checkpoint of a format no longer sampled (its
      problem names the command that upgrades it).
    compression: str, how a compact store's frames were written (layout,
      codec, clevel, frames a unit or block), else None.
    game_episodes: EpisodeStats of the same episodes' game-score returns
      (sums of the `unclipped_reward` element), or None when the data does
      not record the game's reward.
  """

  suffix: int
  complete: bool = True
  missing: list = dataclasses.field(default_factory=list)
  rows: int = None
  add_count: int = None
  cursor: int = None
  is_full: bool = None
  num_valid: int = None
  episodes: EpisodeStats = None
  observation_shape: tuple = None
  observation_dtype: str = None
  disk_bytes: int = 0
  data_bytes: int = None
  verified: bool = False
  problems: list = dataclasses.field(default_factory=list)
  # A compact store's format version (manifest.py); None for other data.
  format_version: int = None
  outdated: bool = False
  compression: str = None
  game_episodes: EpisodeStats = None

  @property
  def status(self) -> str:
    if not self.complete:
      return INCOMPLETE
    if self.outdated:
      return OUTDATED
    return DAMAGED if self.problems else OK

  def to_dict(self) -> dict:
    result = dataclasses.asdict(self)
    result['status'] = self.status
    return result


@dataclasses.dataclass
class DirectorySummary:
  """The checkpoints of a replay directory.

  Attributes:
    directory: str.
    stack_size: int, used for num_valid.
    update_horizon: int, used for num_valid.
    verified: bool.
    checkpoints: list of CheckpointSummary in increasing suffix order.
    problems: list of Problem about the directory itself (absent, no
      complete checkpoint).
  """

  directory: str
  stack_size: int
  update_horizon: int
  verified: bool = False
  checkpoints: list = dataclasses.field(default_factory=list)
  problems: list = dataclasses.field(default_factory=list)

  @property
  def all_problems(self) -> list[str]:
    """Directory problems, then each checkpoint's, in suffix order."""
    return self.problems + [p for s in self.checkpoints for p in s.problems]

  @property
  def ok(self) -> bool:
    """True when something is usable and nothing is damaged or missing."""
    return not self.all_problems and self.num_complete > 0

  @property
  def num_complete(self) -> int:
    return sum(s.complete for s in self.checkpoints)

  def total(self, field: str) -> int:
    """Sums an integer field over the checkpoints that have it."""
    values = [getattr(s, field) for s in self.checkpoints]
    return sum(v for v in values if v is not None)

  @property
  def episodes(self) -> 'EpisodeStats':
    return EpisodeStats.combine(s.episodes for s in self.checkpoints)

  @property
  def game_episodes(self) -> 'EpisodeStats | None':
    """Pooled game-score returns; None when no checkpoint records them."""
    stats = [s.game_episodes for s in self.checkpoints]
    if all(s is None for s in stats):
      return None
    return EpisodeStats.combine(stats)

  def to_dict(self) -> dict:
    """Returns plain JSON-serialisable data."""
    game = self.game_episodes  # An EpisodeStats is always true.
    return {
      'directory': self.directory,
      'stack_size': self.stack_size,
      'update_horizon': self.update_horizon,
      'verified': self.verified,
      'ok': self.ok,
      'checkpoints': [s.to_dict() for s in self.checkpoints],
      'totals': {
        'checkpoints': len(self.checkpoints),
        'complete': self.num_complete,
        'rows': self.total('rows'),
        'num_valid': self.total('num_valid'),
        'episodes': dataclasses.asdict(self.episodes),
        'game_episodes': game and dataclasses.asdict(game),
        'disk_bytes': self.total('disk_bytes'),
        'data_bytes': self.total('data_bytes'),
      },
      'problems': [dataclasses.asdict(p) for p in self.all_problems],
    }


def format_game_scores(summary: 'DirectorySummary') -> list[str]:
  """Markdown rows of the data's own game score per checkpoint.

  One row per checkpoint: its complete episodes, their mean game-score
  return (sums of `unclipped_reward`) and mean clipped return; one row
  saying so where the data does not record the game's reward.

  Args:
    summary: DirectorySummary of a store or of Dopamine's files.

  Returns:
    list of str, rows of the table whose header is GAME_SCORE_HEADER.
  """
  if summary.game_episodes is None:
    return [
      f'| {summary.directory} | - | - | not recorded (no unclipped_reward) '
      '| - |'
    ]

  def mean(stats):
    if stats is None or not stats.count:
      return '-'
    return f'{stats.mean_return:.1f}'

  return [
    f'| {summary.directory} | {s.suffix} | '
    f'{s.episodes.count if s.episodes else 0} | {mean(s.game_episodes)} | '
    f'{mean(s.episodes)} |'
    for s in summary.checkpoints
  ]


GAME_SCORE_HEADER = [
  '| data | checkpoint | episodes | mean game score | mean clipped return |',
  '|---|---:|---:|---:|---:|',
]


def episode_returns(
  terminal: np.ndarray,
  reward: np.ndarray,
  add_count: int,
  episode_end_indices: np.ndarray | None = None,
) -> list[float]:
  """Returns of the episodes whose start and end both lie in a file.

  In chronological order the data runs rows cursor..rows-1 then 0..cursor-1
  for a full buffer, 0..cursor-1 otherwise. An episode ends at a terminal (or
  at a row of episode_end_indices: a cut without terminal) and starts right
  after the previous end, with Dopamine's zero padding rows (reward 0). The
  oldest rows of a buffer that overwrote data belong to an episode whose
  start is gone (or cannot be told apart), so they are not counted; a buffer
  that never overwrote starts with the first episode.

  Args:
    terminal: array of the file's terminal flags.
    reward: array of the file's rewards, same length.
    add_count: int, rows ever added by the writer.
    episode_end_indices: optional array of file rows where episodes ended.

  Returns:
    float64 np.ndarray of returns, oldest episode first.
  """
  rows = len(terminal)
  if not rows:
    return np.zeros(0)
  cursor = add_count % rows
  if add_count >= rows:
    order = np.roll(np.arange(rows), -cursor)
  else:
    order = np.arange(cursor)
  ends = np.asarray(terminal).astype(bool)
  if episode_end_indices is not None and len(episode_end_indices):
    ends[np.asarray(episode_end_indices, np.int64)] = True
  end_positions = np.flatnonzero(ends[order])
  if not len(end_positions):
    return np.zeros(0)
  starts = np.concatenate([[0], end_positions[:-1] + 1])
  # Select before casting: rows past a not-full writer's cursor were never
  # written (Dopamine allocates with np.empty) and may hold anything.
  rewards = np.asarray(reward)[order[: end_positions[-1] + 1]]
  rewards = rewards.astype(np.float64)
  returns = np.add.reduceat(rewards, starts)
  # Only if nothing was ever overwritten is the oldest row an episode start.
  return returns if add_count <= rows else returns[1:]
