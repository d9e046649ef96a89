"""Summarises and verifies the replay checkpoints of a directory.

For every checkpoint suffix we report what a user needs before training on it:
whether all files are there, how many rows the writer held and how many of
them Dopamine would sample, the complete episodes and their returns, and how
big the files are. Only headers and the small arrays (terminal, reward,
add_count, invalid_range, episode_end_indices) are read, so summarising the
50 x 7 GB of a DQN Replay Dataset run takes seconds. `verify=True` also
decompresses every file to the end, which checks every gzip CRC.

Every problem is collected (naming its file) instead of stopping at the first,
so one run tells the user everything that is wrong with a directory.
Neither TensorFlow nor Dopamine is imported for local paths.
"""

import dataclasses
import os
import re
import sys

from absl import logging
import numpy as np

from fixed_replay.dataset import checkpoints
from fixed_replay.dataset import checks
from fixed_replay.dataset import validity
from fixed_replay.errors import CheckpointError
from fixed_replay.errors import RemoteError
from fixed_replay.io import files as storage
from fixed_replay.io import npy_stream
from fixed_replay.io.gzip_stream import GzipStream

OK = 'ok'
INCOMPLETE = 'incomplete'
DAMAGED = 'damaged'

_CHECKPOINT_FILE = re.compile(r'^(?P<name>.+)_ckpt\.(?P<suffix>\d+)\.gz$')


@dataclasses.dataclass(frozen=True)
class Problem:
  """One thing wrong with a file (or directory).

  Attributes:
    path: str, the file at fault.
    problem: str, what is wrong with it.
  """

  path: str
  problem: str

  def __str__(self):
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
  def from_returns(cls, returns):
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
  def combine(cls, stats):
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

  @property
  def status(self):
    if not self.complete:
      return INCOMPLETE
    return DAMAGED if self.problems else OK

  def to_dict(self):
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
  def all_problems(self):
    """Directory problems, then each checkpoint's, in suffix order."""
    result = list(self.problems)
    for summary in self.checkpoints:
      result += summary.problems
    return result

  @property
  def ok(self):
    """True when something is usable and nothing is damaged or missing."""
    return not self.all_problems and self.num_complete > 0

  @property
  def num_complete(self):
    return sum(s.complete for s in self.checkpoints)

  def total(self, field):
    """Sums an integer field over the checkpoints that have it."""
    values = [getattr(s, field) for s in self.checkpoints]
    return sum(v for v in values if v is not None)

  @property
  def episodes(self):
    return EpisodeStats.combine(s.episodes for s in self.checkpoints)

  def to_dict(self):
    """Returns plain JSON-serialisable data."""
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
        'disk_bytes': self.total('disk_bytes'),
        'data_bytes': self.total('data_bytes'),
      },
      'problems': [dataclasses.asdict(p) for p in self.all_problems],
    }


def episode_returns(terminal, reward, add_count, episode_end_indices=None):
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


class VerifyProgress:
  """Reports verification progress: a tqdm bar, or absl logging.

  The bar counts compressed bytes, not files: one observation file weighs as
  much as all the others of its checkpoint together.
  """

  def __init__(self, sizes, bar=None):
    """Starts reporting.

    Args:
      sizes: dict of path to compressed size, the files to verify.
      bar: bool, show a tqdm bar on stderr; None: only when stderr is a TTY.
    """
    self._sizes = sizes
    self._total = sum(sizes.values())
    self._done_files = 0
    self._done_bytes = 0
    if bar is None:
      bar = sys.stderr.isatty()
    self._bar = None
    if bar:
      import tqdm

      self._bar = tqdm.tqdm(
        total=self._total,
        unit='B',
        unit_scale=True,
        desc='verifying',
        file=sys.stderr,
      )

  @property
  def has_bar(self):
    return self._bar is not None

  def start(self, path):
    if self._bar is None:
      logging.info(
        'Verifying file %d/%d (%s of %s done): %s (%s)',
        self._done_files + 1,
        len(self._sizes),
        format_bytes(self._done_bytes),
        format_bytes(self._total),
        path,
        format_bytes(self._sizes.get(path, 0)),
      )
    else:
      self._bar.set_postfix_str(os.path.basename(path))

  def done(self, path):
    size = self._sizes.get(path, 0)
    self._done_files += 1
    self._done_bytes += size
    if self._bar is not None:
      self._bar.update(size)

  def close(self):
    if self._bar is not None:
      self._bar.close()


class _Problems:
  """Collects problems; a file that failed once is not read again."""

  def __init__(self, items):
    self.items = items
    self._bad = set()

  def add(self, path, problem):
    self.items.append(Problem(str(path), problem))
    self._bad.add(str(path))

  def attempt(self, path, function, *args):
    """Returns function(*args), or None after recording its CheckpointError."""
    if path in self._bad:
      return None
    try:
      return function(*args)
    except RemoteError:
      raise  # The storage is unreachable: stop, do not try every file.
    except CheckpointError as error:
      self.add(error.path, error.problem)
      self._bad.add(str(path))
      return None


def _verify_file(path, problems, progress, function):
  """Runs a full-decompression check of one file, reporting progress."""
  if progress is not None:
    progress.start(path)
  try:
    return problems.attempt(path, function, path)
  finally:
    if progress is not None:
      progress.done(path)


def _verify_gzip(path):
  """Checks a gzip file that is not an array (e.g. a prioritized sum tree)."""
  with GzipStream(path) as stream:
    stream.read_to_end()


def _store_headers(files, verify, problems, progress):
  """Returns {element: ArrayHeader} of the readable `$store$_` arrays."""
  headers = {}
  for name, path in files.store_paths.items():
    header = problems.attempt(path, npy_stream.read_npy_header, path)
    if verify:
      # A damaged payload leaves the header usable for the length checks.
      _verify_file(path, problems, progress, npy_stream.verify)
    if header is not None:
      headers[name] = header
  return headers


def _common_rows(files, headers, problems):
  """Returns the row count all `$store$_` arrays share, reporting others.

  The observation file sets the count (as it does for every reader); when its
  header is unreadable, the count most arrays agree on does.
  """
  usable = {name: h for name, h in headers.items() if h.shape}
  if not usable:
    reference = None
  elif 'observation' in usable:
    reference = 'observation'
  else:
    counts = [h.num_rows for h in usable.values()]
    common = max(set(counts), key=counts.count)
    reference = next(n for n, h in usable.items() if h.num_rows == common)
  errors = checks.store_header_errors(files, headers, reference)
  for error in errors:
    problems.add(error.path, error.problem)
  if reference is None or any(
    error.path == files.store_paths[reference] for error in errors
  ):
    return None
  return usable[reference].num_rows


def _read_small_array(path, verify, problems, progress):
  """Reads a small `.npy` file whole, fully verified when asked."""
  if (
    verify and _verify_file(path, problems, progress, npy_stream.verify) is None
  ):
    return None
  return problems.attempt(path, npy_stream.read_rows, path)


def _read_add_count(files, verify, problems, progress):
  """Returns (array, checked int value) of add_count, or (None, None)."""
  path = files.add_count_path
  array = _read_small_array(path, verify, problems, progress)
  if array is None:
    return None, None
  value = problems.attempt(path, checks.add_count, path, array)
  return (None, None) if value is None else (array, value)


def _read_invalid_range(files, rows, add_count, verify, problems, progress):
  path = files.invalid_range_path
  array = _read_small_array(path, verify, problems, progress)
  if array is None:
    return None
  return problems.attempt(
    path, checks.invalid_range, path, array, rows, add_count
  )


def _read_episode_ends(files, rows, problems, progress):
  """Reads episode_end_indices (always whole: it is small), or None."""
  path = files.episode_end_indices_path
  if not path:
    return None
  # Unpickling reads to the end, so this is a full verification anyway.
  return _verify_file(
    path,
    problems,
    progress,
    lambda p: checkpoints.read_episode_end_indices(p, rows),
  )


def _read_column(files, name, rows, problems):
  """Reads a whole per-row scalar array (terminal or reward)."""
  path = files.store_paths[name]
  return problems.attempt(path, npy_stream.read_rows, path, 0, rows, None, ())


def _disk_bytes(paths, problems):
  total = 0
  for path in paths:
    try:
      total += storage.size(path)
    except OSError as error:
      problems.add(path, f'cannot stat: {error}')
  return total


def summarize_checkpoint(
  files,
  stack_size=4,
  update_horizon=1,
  verify=False,
  other_paths=(),
  progress=None,
):
  """Summarises (and optionally verifies) one complete checkpoint.

  Args:
    files: checkpoints.CheckpointFiles.
    stack_size: int, frames per state, for the valid row count.
    update_horizon: int, n of the n-step return, for the valid row count.
    verify: bool, decompress every file to the end and check it.
    other_paths: paths of further files of the suffix (e.g. a sum tree):
      counted in disk_bytes and, with verify, checked as gzip.
    progress: optional VerifyProgress, told about each verified file.

  Returns:
    CheckpointSummary; damage is reported in its problems, never raised.
  """
  return _summarize_checkpoint(
    files, stack_size, update_horizon, verify, other_paths, progress
  )[0]


def _summarize_checkpoint(
  files, stack_size, update_horizon, verify, other_paths, progress
):
  """summarize_checkpoint, also returning the readable `$store$_` headers."""
  summary = CheckpointSummary(suffix=files.suffix, verified=verify)
  problems = _Problems(summary.problems)
  progress = progress if verify else None
  summary.disk_bytes = _disk_bytes(
    files.all_paths() + list(other_paths), problems
  )

  headers = _store_headers(files, verify, problems, progress)
  rows = _common_rows(files, headers, problems)
  if 'observation' in headers:
    summary.observation_shape = tuple(headers['observation'].row_shape)
    summary.observation_dtype = str(headers['observation'].dtype)
  add_count_array, add_count = _read_add_count(
    files, verify, problems, progress
  )
  invalid_range = _read_invalid_range(
    files, rows, add_count, verify, problems, progress
  )
  episode_ends = _read_episode_ends(files, rows, problems, progress)
  if verify:
    for path in other_paths:
      _verify_file(path, problems, progress, _verify_gzip)
  small = (add_count_array, invalid_range)
  if len(headers) == len(files.store_paths) and all(
    a is not None for a in small
  ):
    summary.data_bytes = int(
      sum(h.nbytes for h in headers.values()) + sum(a.nbytes for a in small)
    )
  if rows is None or add_count is None:
    return summary, headers

  summary.rows = rows
  summary.add_count = add_count
  summary.cursor = add_count % rows
  summary.is_full = add_count >= rows
  if files.episode_end_indices_path and episode_ends is None:
    # Unreadable: neither validity nor episodes are known.
    return summary, headers
  terminal = _read_column(files, 'terminal', rows, problems)
  if terminal is None:
    return summary, headers
  if invalid_range is not None:
    summary.num_valid = len(
      validity.valid_rows(
        terminal,
        0,
        rows,
        add_count,
        invalid_range,
        episode_ends,
        stack_size,
        update_horizon,
      )
    )
  reward = _read_column(files, 'reward', rows, problems)
  if reward is not None:
    summary.episodes = EpisodeStats.from_returns(
      episode_returns(terminal, reward, add_count, episode_ends)
    )
  return summary, headers


def _files_by_suffix(directory):
  """Returns {suffix: [paths of its `*_ckpt.N.gz` files]}."""
  result = {}
  for entry in sorted(storage.listdir(directory)):
    match = _CHECKPOINT_FILE.match(entry)
    if match:
      result.setdefault(int(match['suffix']), []).append(
        storage.join(directory, entry)
      )
  return result


def summarize_directory(
  directory, stack_size=4, update_horizon=1, verify=False, progress_bar=None
):
  """Summarises (and optionally verifies) every checkpoint of a directory.

  Args:
    directory: str, local or gs:// replay directory.
    stack_size: int, frames per state, for the valid row counts.
    update_horizon: int, n of the n-step return, for the valid row counts.
    verify: bool, decompress every file fully (gzip CRC, header, payload
      length) on top of the consistency checks.
    progress_bar: bool, show a tqdm bar while verifying; None: only when
      stderr is a TTY (otherwise each file is logged).

  Returns:
    DirectorySummary; problems are collected in it, never raised.
  """
  directory = str(directory)
  summary = DirectorySummary(
    directory=directory,
    stack_size=stack_size,
    update_horizon=update_horizon,
    verified=verify,
  )
  try:
    _summarize_all(summary, progress_bar)
  except CheckpointError as error:  # No listing, or the storage is gone.
    summary.problems.append(Problem(error.path, error.problem))
  return summary


def _summarize_all(summary, progress_bar):
  """Fills summary.checkpoints; raises RemoteError if storage fails."""
  directory, verify = summary.directory, summary.verified
  complete, incomplete = checkpoints.scan_checkpoints(directory)
  paths_by_suffix = _files_by_suffix(directory)

  progress = None
  if verify:
    to_verify = [p for s in complete for p in paths_by_suffix.get(s, [])]
    sizes = {}
    for path in to_verify:
      try:
        sizes[path] = storage.size(path)
      except OSError:
        sizes[path] = 0  # Reported by summarize_checkpoint.
    progress = VerifyProgress(sizes, progress_bar)
  layouts = {}
  try:
    for suffix in sorted(set(complete) | set(incomplete)):
      if suffix in incomplete:
        summary.checkpoints.append(
          _incomplete_summary(
            directory, suffix, incomplete[suffix], paths_by_suffix
          )
        )
        continue
      files = complete[suffix]
      if progress is None or not progress.has_bar:  # Logs would break a bar.
        logging.info('Summarising checkpoint %d of %s', suffix, directory)
      others = sorted(
        set(paths_by_suffix.get(suffix, [])) - set(files.all_paths())
      )
      checkpoint, headers = _summarize_checkpoint(
        files,
        summary.stack_size,
        summary.update_horizon,
        verify,
        others,
        progress,
      )
      summary.checkpoints.append(checkpoint)
      layouts[suffix] = {
        name: (h.row_shape, str(h.dtype)) for name, h in headers.items()
      }
  finally:
    if progress is not None:
      progress.close()
  _report_layouts(summary, complete, layouts)
  if not complete:
    summary.problems.append(Problem(directory, 'no complete replay checkpoint'))


def _report_layouts(summary, complete, layouts):
  """Flags arrays whose row shape or dtype differ from the rest of the run."""
  by_suffix = {s.suffix: s for s in summary.checkpoints}
  paths = {suffix: complete[suffix].store_paths for suffix in layouts}
  for error in checks.same_layout(paths, layouts):
    suffix = next(s for s, p in paths.items() if error.path in p.values())
    by_suffix[suffix].problems.append(Problem(error.path, error.problem))


def _incomplete_summary(directory, suffix, missing, paths_by_suffix):
  summary = CheckpointSummary(suffix=suffix, complete=False, missing=missing)
  problems = _Problems(summary.problems)
  for name in missing:
    problems.add(
      storage.join(directory, name),
      f'missing: checkpoint {suffix} is incomplete',
    )
  summary.disk_bytes = _disk_bytes(paths_by_suffix.get(suffix, []), problems)
  return summary


def format_bytes(num_bytes):
  """Formats a byte count with decimal units: '512 B', '49.0 kB', '7.06 GB'."""
  if num_bytes is None:
    return '-'
  value = float(num_bytes)
  for unit in ('B', 'kB', 'MB', 'GB', 'TB'):
    if abs(value) < 1000 or unit == 'TB':
      break
    value /= 1000
  if unit == 'B':
    return f'{int(value)} B'
  decimals = 2 if value < 10 else 1 if value < 100 else 0
  return f'{value:.{decimals}f} {unit}'


def _format_returns(episodes):
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


_COLUMNS = (
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


def _row(summary):
  episodes = summary.episodes
  return (
    str(summary.suffix),
    summary.status,
    _value(summary.rows),
    _value(summary.add_count),
    _value(summary.cursor),
    _value(summary.is_full),
    _value(summary.num_valid),
    _value(episodes.count if episodes else None),
    _format_returns(episodes),
    _observation(summary),
    format_bytes(summary.disk_bytes),
    format_bytes(summary.data_bytes),
  )


def format_table(summary):
  """Returns a text table: one line per suffix, then the totals."""
  lines = [_row(s) for s in summary.checkpoints]
  episodes = summary.episodes
  lines.append(
    (
      'total',
      f'{summary.num_complete}/{len(summary.checkpoints)} complete',
      str(summary.total('rows')),
      '',
      '',
      '',
      str(summary.total('num_valid')),
      str(episodes.count),
      _format_returns(episodes),
      '',
      format_bytes(summary.total('disk_bytes')),
      format_bytes(summary.total('data_bytes')),
    )
  )
  table = [_COLUMNS] + lines
  widths = [max(len(r[i]) for r in table) for i in range(len(_COLUMNS))]
  text = [
    '  '.join(
      c.ljust(w) if i == 1 or i >= 8 else c.rjust(w)
      for i, (c, w) in enumerate(zip(r, widths, strict=True))
    ).rstrip()
    for r in table
  ]
  mode = 'verified' if summary.verified else 'headers only, not verified'
  title = (
    f'{summary.directory} (stack_size={summary.stack_size}, '
    f'update_horizon={summary.update_horizon}, {mode})'
  )
  return '\n'.join([title] + text)


def format_problems(summary):
  """Returns one line per problem, each naming its file ('' when none)."""
  problems = summary.all_problems
  if not problems:
    return ''
  lines = [f'{len(problems)} problem(s):']
  lines += [f'  {p}' for p in problems]
  return '\n'.join(lines)
