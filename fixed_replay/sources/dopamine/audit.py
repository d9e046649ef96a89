"""Reads a checkpoint's headers and small files, collecting every problem.

The reader (checkpoints.py) stops at the first problem; `inspect` and
`convert` want them all, each naming its file, in one run. The functions
here run the same checks (checks.py) through a `checks.Collector`: a file
that failed once is not read again, and what could be read is returned.
"""

from collections.abc import Callable
from collections.abc import Iterable
from typing import Any

import numpy as np

from fixed_replay.errors import CheckpointError
from fixed_replay.io import files as storage
from fixed_replay.io import npy_stream
from fixed_replay.io.gzip_stream import GzipStream
from fixed_replay.sources.dopamine import checks
from fixed_replay.sources.dopamine import file_names


def verify_file(
  path: str,
  collector: checks.Collector,
  progress: Any,
  function: Callable[[str], object],
) -> None:
  """Runs a full-decompression check of one file, reporting progress.

  Args:
    path: str.
    collector: checks.Collector.
    progress: progress.FilesProgress or None.
    function: callable(path) that reads the file to its end.
  """
  if progress is not None:
    progress.start(path)
  try:
    return collector.attempt(path, function, path)
  finally:
    if progress is not None:
      progress.done(path)


def verify_gzip(path: str) -> None:
  """Checks a gzip file that is not an array (e.g. a prioritized sum tree)."""
  with GzipStream(path) as stream:
    stream.read_to_end()


def store_headers(
  files: file_names.CheckpointFiles,
  collector: checks.Collector,
  verify: bool = False,
  progress: Any = None,
) -> dict:
  """Returns {element: ArrayHeader} of the readable `$store$_` arrays."""
  headers = {}
  for name, path in files.store_paths.items():
    header = collector.attempt(path, npy_stream.read_npy_header, path)
    if verify:
      # A damaged payload leaves the header usable for the length checks.
      verify_file(path, collector, progress, npy_stream.verify)
    if header is not None:
      headers[name] = header
  return headers


def common_rows(
  files: file_names.CheckpointFiles,
  headers: dict,
  collector: checks.Collector,
) -> int | None:
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
    collector.add(error)
  if reference is None or any(
    error.path == files.store_paths[reference] for error in errors
  ):
    return None
  return usable[reference].num_rows


def _small_array(path: str, collector, verify, progress):
  """Reads a small `.npy` file whole, fully verified when asked."""
  if (
    verify and verify_file(path, collector, progress, npy_stream.verify) is None
  ):
    return None
  return collector.attempt(path, npy_stream.read_rows, path)


def bookkeeping(
  files: file_names.CheckpointFiles,
  rows: int | None,
  collector: checks.Collector,
  verify: bool = False,
  progress: Any = None,
) -> tuple:
  """Reads and checks add_count, invalid_range and episode_end_indices.

  Args:
    files: file_names.CheckpointFiles.
    rows: int or None, rows of the `$store$_` arrays (None: unknown).
    collector: checks.Collector.
    verify: bool, decompress each file to its end first.
    progress: progress.FilesProgress or None.

  Returns:
    (add_count array, add_count, invalid_range, episode ends), each None
    where unreadable (episode ends also where the checkpoint has none).
  """
  path = files.add_count_path
  array = _small_array(path, collector, verify, progress)
  count = None
  if array is not None:
    count = collector.attempt(path, checks.add_count, path, array)
    array = None if count is None else array
  path = files.invalid_range_path
  invalid_range = _small_array(path, collector, verify, progress)
  if invalid_range is not None:
    invalid_range = collector.attempt(
      path, checks.invalid_range, path, invalid_range, rows, count
    )
  episode_ends = None
  if files.episode_end_indices_path:
    # Unpickling reads to the end, so this is a full verification anyway.
    episode_ends = verify_file(
      files.episode_end_indices_path,
      collector,
      progress,
      lambda p: checks.read_episode_end_indices(p, rows),
    )
  return array, count, invalid_range, episode_ends


def column(
  files: file_names.CheckpointFiles,
  name: str,
  rows: int | None,
  collector: checks.Collector,
) -> np.ndarray | None:
  """Reads a whole per-row scalar array (terminal or reward), or None."""
  path = files.store_paths[name]
  return collector.attempt(path, npy_stream.read_rows, path, 0, rows, None, ())


def disk_bytes(paths: Iterable[str], collector: checks.Collector) -> int:
  """Returns the summed size of `paths`, reporting those it cannot stat."""
  total = 0
  for path in paths:
    try:
      total += storage.size(path)
    except OSError as error:
      collector.add(CheckpointError(str(path), f'cannot stat: {error}'))
  return total


def check_run(
  found: dict[int, file_names.CheckpointFiles],
) -> tuple[dict[int, int], list[CheckpointError]]:
  """Checks the headers and bookkeeping of every checkpoint of a run.

  Reads only headers and the small files; collects every problem instead of
  stopping at the first (convert reports them all before converting).

  Args:
    found: dict of suffix to CheckpointFiles.

  Returns:
    (rows, errors): dict of suffix to rows of the checkpoints that passed,
    and the list of CheckpointError found (each naming its file).
  """
  collector = checks.Collector()
  rows_by_suffix, layouts = {}, {}
  for suffix, files in found.items():
    headers = store_headers(files, collector)
    rows = common_rows(files, headers, collector)
    if rows is None or any(map(collector.failed, files.store_paths.values())):
      continue
    layouts[suffix] = {
      n: (h.row_shape, str(h.dtype)) for n, h in headers.items()
    }
    bookkeeping(files, rows, collector)
    if not any(map(collector.failed, files.all_paths())):
      rows_by_suffix[suffix] = rows
  paths = {suffix: found[suffix].store_paths for suffix in layouts}
  for error in checks.same_layout(paths, layouts):
    collector.add(error)
  bad = {str(error.path) for error in collector.errors}
  rows_by_suffix = {
    suffix: rows
    for suffix, rows in rows_by_suffix.items()
    if not bad & set(map(str, found[suffix].all_paths()))
  }
  return rows_by_suffix, collector.errors
