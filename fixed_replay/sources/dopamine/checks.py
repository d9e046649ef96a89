"""Consistency checks of a replay checkpoint, shared by every reader.

The gzip CRC tells that a file is what its writer wrote; these checks tell
that what was written makes sense together: `add_count`, `invalid_range` and
`episode_end_indices` against the rows of the `$store$_` arrays, array
lengths and shapes, the type and size of the pickled set, integer ranges.
Each check raises a `CheckpointError` naming the file; the reader
(checkpoints.py) lets the first one through, while `convert` and `inspect`
collect them all with `Collector` (audit.py).

Newer Dopamine saves the rows where episodes were cut (without a terminal)
as a pickled set of numpy int64 scalars. A dataset may come from anywhere,
so `read_episode_end_indices` unpickles integers and sets only, and bounds
the file's inflated size before anything is unpickled.
"""

from collections.abc import Callable
import io
import pickle
from typing import Any

import numpy as np

from fixed_replay.errors import CheckpointError
from fixed_replay.errors import RemoteError
from fixed_replay.io.gzip_stream import GzipStream
from fixed_replay.sources.dopamine import file_names

# Dopamine's transition signature returns indices as int32.
MAX_ROWS = 2**31 - 1
_INT64_MAX = 2**63 - 1
# Bytes of pickle allowed per row for episode_end_indices: Dopamine pickles a
# set of numpy int64 scalars, about 20 bytes each after the first; a file
# inflating to more than this is refused before it is unpickled.
_PICKLE_BYTES_PER_ROW = 64
_PICKLE_BYTES_BASE = 4096


def store_header_errors(
  files: file_names.CheckpointFiles,
  headers: dict,
  reference: str = 'observation',
) -> list[CheckpointError]:
  """Checks the `$store$_` headers of one checkpoint against each other.

  Args:
    files: file_names.CheckpointFiles.
    headers: dict of element name to npy_stream.ArrayHeader (the readable
      ones).
    reference: str, the element whose rows the others must have.

  Returns:
    list of CheckpointError: arrays that are 0-d, empty, too long or of
    another length than the reference.
  """
  errors = [
    CheckpointError(
      files.store_paths[name], 'a 0-d array, expected one row per transition'
    )
    for name, header in sorted(headers.items())
    if not header.shape
  ]
  if reference not in headers or not headers[reference].shape:
    return errors
  rows = headers[reference].num_rows
  for name, header in sorted(headers.items()):
    if header.shape and header.num_rows != rows:
      errors.append(
        CheckpointError(
          files.store_paths[name],
          f'{header.num_rows} rows, but {files.store_paths[reference]} has '
          f'{rows}: the $store$ arrays of checkpoint {files.suffix} differ in '
          'length',
        )
      )
  try:
    num_rows(files.store_paths[reference], rows)
  except CheckpointError as error:
    errors.append(error)
  return errors


def store_headers(files: file_names.CheckpointFiles, headers: dict) -> int:
  """Returns the rows all `$store$_` arrays share; raises the first problem.

  Raises:
    CheckpointError: see store_header_errors.
  """
  errors = store_header_errors(files, headers)
  if errors:
    raise errors[0]
  return headers['observation'].num_rows


def num_rows(path: str, rows: int) -> None:
  """Raises unless 0 < rows <= MAX_ROWS."""
  if rows <= 0:
    raise CheckpointError(path, 'the arrays have no rows')
  if rows > MAX_ROWS:
    raise CheckpointError(
      path, f'{rows} rows: more than the {MAX_ROWS} int32 indices can name'
    )


def add_count(path: str, array: np.ndarray) -> int:
  """Returns add_count as an int after checking it.

  Raises:
    CheckpointError: unless a 0-d integer array in [0, 2**63).
  """
  if array.shape or array.dtype.kind not in 'iu':
    raise CheckpointError(
      path,
      f'expected a 0-d integer array, got {array.dtype} of shape '
      f'{array.shape}',
    )
  value = int(array)
  if value < 0:
    raise CheckpointError(path, f'negative add_count {value}')
  if value > _INT64_MAX:
    raise CheckpointError(path, f'add_count {value} does not fit int64')
  return value


def invalid_range(
  path: str, array: np.ndarray, rows: int | None, count: int | None
) -> np.ndarray:
  """Returns invalid_range as int64 rows after checking it.

  Dopamine writes `[(cursor - n + k) % rows for k in range(stack_size + n)]`
  with cursor = add_count % rows: consecutive rows (modulo rows) around the
  cursor. A buffer saved before its first add still holds its initial
  `np.zeros(stack_size)` (floats).

  Args:
    path: str, the invalid_range file.
    array: its np.ndarray.
    rows: int or None, rows of the checkpoint's arrays (None: unknown, only
      the type is checked).
    count: int or None, the checkpoint's add_count (None: unknown).

  Raises:
    CheckpointError: if it is not such an array.
  """
  initial = count in (0, None) and array.ndim == 1 and not np.any(array)
  if array.ndim != 1 or (array.dtype.kind not in 'iu' and not initial):
    raise CheckpointError(
      path,
      f'expected a 1-d integer array, got {array.dtype} of shape '
      f'{array.shape}',
    )
  if initial:
    return np.zeros(len(array), np.int64)
  shown = array[:10].tolist()
  if rows is None or count is None:
    return array.astype(np.int64)
  if not len(array):
    raise CheckpointError(path, 'empty, expected the rows around the cursor')
  if np.any((array < 0) | (array >= rows)):
    raise CheckpointError(path, f'rows {shown} are not all in [0, {rows})')
  rows_array = array.astype(np.int64)
  cursor = count % rows
  consecutive = len(array) > rows or np.all(np.diff(rows_array) % rows == 1)
  if not consecutive or cursor not in rows_array:
    raise CheckpointError(
      path,
      f'rows {shown} are not the consecutive rows around the cursor '
      f'{cursor} (add_count {count} % {rows} rows) that Dopamine writes',
    )
  return rows_array


def episode_ends_byte_limit(rows: int | None) -> int:
  """Most bytes a pickled episode_end_indices of a `rows`-row file needs."""
  return _PICKLE_BYTES_BASE + _PICKLE_BYTES_PER_ROW * rows


def episode_ends(path: str, values: Any, rows: int | None) -> np.ndarray:
  """Returns the unpickled episode_end_indices as sorted int64 rows.

  Args:
    path: str, the episode_end_indices file.
    values: what was unpickled from it.
    rows: int or None, rows of the checkpoint's arrays (None: not known).

  Raises:
    CheckpointError: unless a set of ints, each a row of the arrays.
  """
  if not isinstance(values, set | frozenset):
    raise CheckpointError(
      path,
      f'episode_end_indices is not a pickled set of ints (a '
      f'{type(values).__name__})',
    )
  bad = [
    v
    for v in values
    if isinstance(v, bool) or not isinstance(v, int | np.integer)
  ]
  if bad:
    raise CheckpointError(
      path,
      f'episode_end_indices is not a pickled set of ints: holds '
      f'{type(bad[0]).__name__} {bad[0]!r:.40}',
    )
  limit = _INT64_MAX if rows is None else rows - 1
  outside = [int(v) for v in values if not 0 <= int(v) <= limit]
  if outside:
    shown = ', '.join(_short(v) for v in sorted(outside)[:10])
    raise CheckpointError(path, f'holds rows outside [0, {limit + 1}): {shown}')
  return np.array(sorted(int(v) for v in values), dtype=np.int64)


def _short(value):
  text = str(value)
  return text if len(text) <= 20 else f'{text[:8]}...({len(text)} digits)'


class _IndexSetUnpickler(pickle.Unpickler):
  """Unpickles a set of integers and nothing else.

  Dopamine pickles `episode_end_indices` (a set of numpy int64 scalars); a
  dataset may come from anywhere, so no other object may be constructed.
  """

  _ALLOWED = {
    ('builtins', 'set'),
    ('builtins', 'frozenset'),
    ('builtins', 'int'),
    ('numpy', 'dtype'),
    ('numpy.core.multiarray', 'scalar'),
    ('numpy._core.multiarray', 'scalar'),
    ('numpy', 'int64'),
  }

  def find_class(self, module, name):
    if (module, name) in self._ALLOWED:
      return super().find_class(module, name)
    raise pickle.UnpicklingError(f'{module}.{name} is not allowed')


def read_episode_end_indices(
  path: str, num_rows: int | None = None
) -> np.ndarray:
  """Reads Dopamine's pickled episode_end_indices set as sorted int64 rows.

  Args:
    path: str.
    num_rows: int or None, rows of the checkpoint's arrays: bounds what the
      file may inflate to (checked before unpickling) and the rows it names.

  Raises:
    CheckpointError: if the file is damaged, too big, or not a set of ints
      naming rows of the arrays.
  """
  limit = episode_ends_byte_limit(MAX_ROWS if num_rows is None else num_rows)
  with GzipStream(path) as stream:
    data = stream.read_remaining(limit)
  try:
    values = _IndexSetUnpickler(io.BytesIO(data)).load()
  except Exception as error:  # noqa: BLE001 - any damage in the pickle.
    raise CheckpointError(
      path,
      f'episode_end_indices is not a pickled set of ints: '
      f'{type(error).__name__}: {error}'[:300],
    ) from error
  return episode_ends(path, values, num_rows)


def same_layout(
  paths_by_suffix: dict[int, dict[str, str]],
  layouts: dict[int, dict[str, tuple]],
) -> list[CheckpointError]:
  """Finds the checkpoints of a run whose arrays differ from the majority.

  Args:
    paths_by_suffix: dict of suffix to dict of element name to path.
    layouts: dict of suffix to dict of element name to (row_shape, dtype).

  Returns:
    list of CheckpointError, one per array that differs in row shape or
    dtype from what most checkpoints of the run have.
  """
  errors = []
  names = sorted({name for layout in layouts.values() for name in layout})
  for name in names:
    seen = {s: layout[name] for s, layout in layouts.items() if name in layout}
    if len(set(seen.values())) <= 1:
      continue
    values = list(seen.values())
    common = max(set(values), key=lambda v: (values.count(v), str(v)))
    agreeing = sorted(s for s, v in seen.items() if v == common)
    for suffix, (row_shape, dtype) in sorted(seen.items()):
      if (row_shape, dtype) != common:
        errors.append(
          CheckpointError(
            paths_by_suffix[suffix][name],
            f'{name} rows of shape {tuple(row_shape)} {dtype}, but checkpoints '
            f'{agreeing[:10]} of the run have {tuple(common[0])} {common[1]}',
          )
        )
  return errors


class Collector:
  """Runs checks and collects their CheckpointErrors instead of raising.

  Attributes:
    errors: list of CheckpointError, in the order found.
  """

  def __init__(self, stop_on_remote: bool = False) -> None:
    """Creates an empty collector.

    Args:
      stop_on_remote: bool, let a RemoteError through: when the storage is
        unreachable, trying every other file only repeats that.
    """
    self.errors = []
    self._failed = set()
    self._stop_on_remote = stop_on_remote

  def add(self, error: CheckpointError) -> None:
    self.errors.append(error)
    self._failed.add(str(error.path))

  def failed(self, path: str) -> bool:
    """Whether a problem was already recorded for `path`."""
    return str(path) in self._failed

  def attempt(self, path: str, function: Callable[..., Any], *args: Any) -> Any:
    """Returns function(*args), or None after recording its CheckpointError.

    A path that already failed is not tried again.
    """
    if self.failed(path):
      return None
    try:
      return function(*args)
    except CheckpointError as error:
      if self._stop_on_remote and isinstance(error, RemoteError):
        raise
      self.add(error)
      self._failed.add(str(path))
      return None
