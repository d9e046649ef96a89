"""Finds Dopamine replay checkpoints in a directory and reads row windows.

A checkpoint with suffix N is a set of files `{name}_ckpt.N.gz` (see
file_names.py): the `$store$_` arrays, `add_count`, `invalid_range` and,
from newer Dopamine, `episode_end_indices` (a pickled set, see
checks.py). Reading raises the first problem found; audit.py reads
the same files collecting them all.
"""

from collections.abc import Iterable
import dataclasses

from absl import logging
import numpy as np
import numpy.typing as npt

from fixed_replay.errors import CheckpointError
from fixed_replay.io import files as storage
from fixed_replay.io import npy_stream
from fixed_replay.io import remote
from fixed_replay.sources.dopamine import checks
from fixed_replay.sources.dopamine import file_names
from fixed_replay.sources.dopamine.file_names import EPISODE_END_INDICES
from fixed_replay.sources.dopamine.file_names import REQUIRED_EXTRA_FILES
from fixed_replay.sources.dopamine.file_names import REQUIRED_STORE_ELEMENTS
from fixed_replay.sources.dopamine.file_names import STORE_PREFIX
from fixed_replay.sources.dopamine.file_names import checkpoint_filename

# Files Dopamine's checkpointing may leave that this reader does not use.
_IGNORED_NAMES = frozenset(['sum_tree'])


def scan_checkpoints(
  data_dir: str,
) -> tuple[dict[int, 'file_names.CheckpointFiles'], dict[int, list[str]]]:
  """Sorts the checkpoint files of a directory into complete and incomplete.

  Args:
    data_dir: str, local or remote directory, with or without trailing slash.

  Returns:
    (complete, incomplete): complete maps suffix (int) to CheckpointFiles in
    increasing suffix order; incomplete maps suffix to the sorted list of
    missing file names.

  Raises:
    CheckpointError: if the directory does not exist.
  """
  data_dir = str(data_dir)
  if not storage.isdir(data_dir):
    raise CheckpointError(
      data_dir,
      'replay directory does not exist' + remote.closed_bucket_hint(data_dir),
    )
  names_by_suffix = {}
  for entry in storage.listdir(data_dir):
    parsed = file_names.parse(entry)
    if parsed and parsed[0] not in _IGNORED_NAMES:
      names_by_suffix.setdefault(parsed[1], set()).add(parsed[0])
  required = [STORE_PREFIX + e for e in REQUIRED_STORE_ELEMENTS]
  required += list(REQUIRED_EXTRA_FILES)

  complete, incomplete = {}, {}
  for suffix in sorted(names_by_suffix):
    names = names_by_suffix[suffix]
    missing = [n for n in required if n not in names]
    if missing:
      incomplete[suffix] = [file_names.file_name(n, suffix) for n in missing]
      continue
    path = lambda name, s=suffix: checkpoint_filename(data_dir, name, s)
    store_paths = {
      n[len(STORE_PREFIX) :]: path(n)
      for n in sorted(names)
      if n.startswith(STORE_PREFIX)
    }
    complete[suffix] = file_names.CheckpointFiles(
      directory=data_dir,
      suffix=suffix,
      store_paths=store_paths,
      add_count_path=path('add_count'),
      invalid_range_path=path('invalid_range'),
      episode_end_indices_path=(
        path(EPISODE_END_INDICES) if EPISODE_END_INDICES in names else None
      ),
    )
  return complete, incomplete


def find_checkpoints(
  data_dir: str, wanted: int | None = None
) -> dict[int, 'file_names.CheckpointFiles']:
  """Finds the complete checkpoints in a directory.

  Unrelated files are ignored; suffixes missing a required file are skipped
  with a warning that names the missing files.

  Args:
    data_dir: str, local or remote directory, with or without trailing slash.
    wanted: int or None, a suffix the caller asks for by name: if it is
      incomplete, that is an error naming its missing files.

  Returns:
    dict of suffix (int) to CheckpointFiles, in increasing suffix order.

  Raises:
    CheckpointError: if the directory does not exist or holds no complete
      checkpoint, or if `wanted` is incomplete.
  """
  complete, incomplete = scan_checkpoints(data_dir)
  if wanted in incomplete:
    raise CheckpointError(
      storage.join(data_dir, incomplete[wanted][0]),
      f'checkpoint {wanted} is incomplete: missing '
      f'{", ".join(incomplete[wanted])} in {data_dir}',
    )
  for suffix, missing in incomplete.items():
    logging.warning(
      'Skipping incomplete checkpoint %d in %s: missing %s',
      suffix,
      data_dir,
      ', '.join(missing),
    )
  if not complete:
    raise CheckpointError(
      str(data_dir),
      'no complete replay checkpoint (needs $store$_observation, '
      '$store$_action, $store$_reward, $store$_terminal, add_count and '
      'invalid_range _ckpt.N.gz files)',
    )
  return complete


def checkpoint_suffixes(data_dir: str) -> list[int]:
  """Returns the sorted suffixes of the complete checkpoints in data_dir."""
  return list(find_checkpoints(data_dir))


@dataclasses.dataclass
class CheckpointWindow:
  """Rows [start, start + len) of one checkpoint plus its bookkeeping.

  Attributes:
    suffix: int.
    start: int, file row of the first row held.
    num_file_rows: int, rows in the whole file (the writer's capacity).
    store: dict of element name to array of the window's rows.
    add_count: int, rows ever added by the writer.
    invalid_range: np.ndarray of int64 file rows.
    episode_end_indices: sorted int64 np.ndarray of file rows, or None when
      the checkpoint has no such file.
  """

  suffix: int
  start: int
  num_file_rows: int
  store: dict
  add_count: int
  invalid_range: np.ndarray
  episode_end_indices: np.ndarray = None

  @property
  def num_rows(self) -> int:
    return len(self.store['terminal'])

  @property
  def cursor(self) -> int:
    """Next write slot of the writer: add_count modulo the file's rows."""
    return self.add_count % self.num_file_rows

  @property
  def is_full(self) -> bool:
    return self.add_count >= self.num_file_rows

  @property
  def nbytes(self) -> int:
    return sum(a.nbytes for a in self.store.values())


def read_store_headers(
  files: file_names.CheckpointFiles,
) -> dict[str, npy_stream.ArrayHeader]:
  """Reads the headers of all `$store$_` arrays and checks their lengths.

  Args:
    files: file_names.CheckpointFiles.

  Returns:
    dict of element name to npy_stream.ArrayHeader.

  Raises:
    CheckpointError: if a header is bad or the arrays differ in length.
  """
  headers = {
    name: npy_stream.read_npy_header(path)
    for name, path in files.store_paths.items()
  }
  checks.store_headers(files, headers)
  return headers


def read_bookkeeping(
  files: file_names.CheckpointFiles, num_rows: int
) -> tuple[int, np.ndarray, np.ndarray | None]:
  """Reads and checks add_count, invalid_range and episode_end_indices.

  Args:
    files: file_names.CheckpointFiles.
    num_rows: int, rows of the checkpoint's arrays.

  Returns:
    (add_count, invalid_range, episode_end_indices or None).

  Raises:
    CheckpointError: naming the first damaged or inconsistent file.
  """
  count = checks.add_count(
    files.add_count_path, npy_stream.read_rows(files.add_count_path)
  )
  invalid_range = checks.invalid_range(
    files.invalid_range_path,
    npy_stream.read_rows(files.invalid_range_path),
    num_rows,
    count,
  )
  episode_ends = None
  if files.episode_end_indices_path:
    episode_ends = checks.read_episode_end_indices(
      files.episode_end_indices_path, num_rows
    )
  return count, invalid_range, episode_ends


def window_rows(num_file_rows: int, start: int, count: int | None) -> int:
  """Rows of [start, start + count) that lie inside a file of given rows."""
  end = num_file_rows if count is None else min(start + count, num_file_rows)
  return max(end - start, 0)


def read_checkpoint(
  files: file_names.CheckpointFiles,
  start: int = 0,
  count: int | None = None,
  observation_shape: tuple[int, ...] | None = None,
  observation_dtype: npt.DTypeLike | None = None,
  elements: Iterable[str] | None = None,
  verify: bool = True,
) -> CheckpointWindow:
  """Reads rows [start, start + count) of every array of one checkpoint.

  Nothing is returned before every file read passed its checks (gzip CRC-32
  and length, consistency, see checks.py).

  Args:
    files: file_names.CheckpointFiles.
    start: int, first file row.
    count: int or None, number of rows at most (None: to the end of the
      file); a window reaching past the file ends with it.
    observation_shape: optional tuple, expected shape of one observation.
    observation_dtype: optional expected observation dtype.
    elements: optional iterable of the other store elements to read (None:
      all of them; the four required ones are always read).
    verify: bool; False skips inflating what follows a window that ends
      before its file does (data verified once). Whole files are always
      checked: that costs nothing.

  Returns:
    CheckpointWindow.

  Raises:
    CheckpointError: naming the file, on damage, mismatched lengths, an
      unexpected observation shape or dtype, or a window starting outside
      the file (one that ends past it is clipped to the file's rows).
  """
  wanted = set(REQUIRED_STORE_ELEMENTS).union(
    files.store_paths if elements is None else elements
  )
  unknown = wanted - set(files.store_paths)
  if unknown:
    raise CheckpointError(
      files.directory,
      f'checkpoint {files.suffix} has no element(s) {sorted(unknown)}',
    )
  return _read_window(
    files,
    start,
    count,
    sorted(wanted),
    verify,
    observation_shape,
    observation_dtype,
  )


def read_terminal_window(
  files: file_names.CheckpointFiles,
  start: int = 0,
  count: int | None = None,
  verify: bool = True,
) -> CheckpointWindow:
  """Reads only the terminal flags and bookkeeping of rows [start, +count).

  What deciding which rows and episodes to use needs (1 byte per row),
  without decompressing the frames.

  Args:
    files: file_names.CheckpointFiles.
    start: int, first file row.
    count: int or None, number of rows at most (None: to the end of the
      file); a window reaching past the file ends with it.
    verify: bool, as in read_checkpoint.

  Returns:
    CheckpointWindow whose store holds 'terminal' only.

  Raises:
    CheckpointError: naming the file, on damage or a window starting
      outside it.
  """
  return _read_window(files, start, count, ['terminal'], verify)


def _read_window(
  files, start, count, names, verify, observation_shape=None, dtype=None
):
  """The CheckpointWindow of rows [start, +count) of the arrays `names`."""
  headers = read_store_headers(files)
  num_file_rows = headers['observation'].num_rows
  npy_stream.check_header(
    files.store_paths['observation'],
    headers['observation'],
    dtype,
    observation_shape,
  )
  if start < 0 or (count is not None and count < 0) or start > num_file_rows:
    raise CheckpointError(
      files.store_paths['observation'],
      f'rows [{start}, {"end" if count is None else start + count}) asked, '
      f'but checkpoint {files.suffix} has {num_file_rows} rows',
    )
  # A window reaching past the file is clipped to it, as the buffers clip
  # a replay_capacity larger than a checkpoint (and log it, once).
  count = window_rows(num_file_rows, start, count)
  # The small files first: damage there fails before the frames are read.
  add_count, invalid_range, episode_ends = read_bookkeeping(
    files, num_file_rows
  )
  return CheckpointWindow(
    suffix=files.suffix,
    start=start,
    num_file_rows=num_file_rows,
    store={
      name: npy_stream.read_rows(
        files.store_paths[name], start, count, verify=verify
      )
      for name in names
    },
    add_count=add_count,
    invalid_range=invalid_range,
    episode_end_indices=episode_ends,
  )
