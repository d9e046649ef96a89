"""Where the rows of a checkpoint being converted come from.

convert.py writes, verifies and commits one checkpoint at a time, in a worker
process, whatever the rows come from: a CheckpointSource describes one
checkpoint and opens a SourceReader over its rows (both Protocols below, so
that a new kind of input needs no change to the converter).

Sources must pickle (they travel to worker processes). GzipSource reads a
Dopamine checkpoint, streaming its observation file; StoredSource a compact
store's checkpoint (any format version: legacy_store.py reads versions 1-5),
so an old store can be rewritten in the new layout without its original
files; RL Unplugged episodes come from
convert/rlu_source.py.
"""

from collections.abc import Iterator
from collections.abc import Sequence
import dataclasses
import os
from typing import Any
from typing import Protocol
from typing import runtime_checkable

import numpy as np

from fixed_replay.convert import legacy_store
from fixed_replay.errors import CheckpointError
from fixed_replay.io import files as storage
from fixed_replay.io import npy_stream
from fixed_replay.io.gzip_stream import GzipStream
from fixed_replay.sources.dopamine import checkpoints
from fixed_replay.sources.dopamine import checks
from fixed_replay.sources.dopamine import file_names
from fixed_replay.store import checkpoint_tables
from fixed_replay.store import compact_store
from fixed_replay.store import manifest as manifest_lib

# The unit index a checkpoint's units come with (checkpoint_tables.py).
UNIT_INDEX = (
  checkpoint_tables.UNIT_SIZES,
  checkpoint_tables.UNIT_ANCHORS,
  checkpoint_tables.UNIT_CRC32,
)


@dataclasses.dataclass
class SourceRows:
  """Everything but the frames of a checkpoint, known once they are read.

  Attributes:
    arrays: dict of element name to array, every `$store$_` element but the
      observations (action, reward, terminal, ...), one entry per row.
    add_count: int, rows ever added by the writer.
    invalid_range: int64 array, Dopamine's rows invalid around the cursor.
    episode_end_indices: sorted int64 array of rows, or None.
    description: dict, manifest['source'].
  """

  arrays: dict
  add_count: int
  invalid_range: np.ndarray
  episode_end_indices: np.ndarray
  description: dict


class SourceReader(Protocol):
  """The rows of one checkpoint, read once, frames first.

  Used as `with source.open(threads) as reader:`; `row_shape` and `dtype`
  describe one frame. `written_rows` counts the rows the writer filled, or
  is None where it filled every row: a Dopamine buffer that is not full
  saves the rest as they were allocated (np.empty), converted as they are
  but no basis for a dictionary.
  """

  row_shape: tuple[int, ...]
  dtype: np.dtype
  written_rows: int | None

  def __enter__(self) -> 'SourceReader': ...

  def __exit__(self, *exc_info: Any) -> Any: ...

  def frame_slices(self, slice_rows: int) -> Iterator[np.ndarray]:
    """Yields up to `slice_rows` frames at a time (one reused array)."""
    ...

  def finish(self, num_rows: int) -> SourceRows:
    """Everything but the frames, after the last slice was consumed."""
    ...


@runtime_checkable
class CheckpointSource(Protocol):
  """One checkpoint to convert, from whatever files hold it.

  Attributes:
    suffix: int, the checkpoint's suffix in the output.
  """

  suffix: int

  def description(self) -> dict | None:
    """manifest['source'], compared before a finished checkpoint is skipped.

    None when only reading the source tells (the reader's `finish` then
    returns it).
    """
    ...

  def expected_rows(self) -> int:
    """Rows expected, for the progress bar."""
    ...

  def source_files(self) -> dict[str, int]:
    """{name: bytes} of the files (or parts) it reads."""
    ...

  def open(self, threads: int = 1) -> SourceReader:
    """A reader over the rows, decoding with up to `threads` threads."""
    ...


def file_sizes(paths: Sequence[str]) -> dict[str, int]:
  """{base name: bytes} of files, the way manifests record their source."""
  return {path.rstrip('/').split('/')[-1]: storage.size(path) for path in paths}


@dataclasses.dataclass(frozen=True)
class GzipSource:
  """A checkpoint of Dopamine gzip files (file_names.CheckpointFiles)."""

  files: file_names.CheckpointFiles

  @property
  def suffix(self) -> int:
    return self.files.suffix

  def description(self) -> dict:
    return {'files': file_sizes(self.files.all_paths())}

  def expected_rows(self) -> int:
    return checkpoints.read_store_headers(self.files)['observation'].num_rows

  def source_files(self) -> dict[str, int]:
    return self.description()['files']

  def open(self, threads: int = 1) -> SourceReader:
    del threads  # Inflating one gzip stream is sequential.
    return _GzipReader(self.files)


@dataclasses.dataclass(frozen=True)
class StoredSource:
  """A checkpoint of a compact store, read back to be stored anew.

  The new checkpoint records the original source (manifest['source']), so
  it describes the same data as the checkpoint it was rewritten from.
  """

  directory: str
  suffix: int

  def _manifest(self) -> dict:
    return manifest_lib.read_manifest(self.directory, manifest_lib.ALL_VERSIONS)

  def description(self) -> dict:
    return self._manifest()['source']

  def expected_rows(self) -> int:
    return self._manifest()['num_rows']

  def source_files(self) -> dict[str, int]:
    files = self._manifest()['files']
    return {name: entry['bytes'] for name, entry in sorted(files.items())}

  def open(self, threads: int = 1) -> SourceReader:
    del threads  # Frames are decoded as they are read, one by one.
    return _StoredReader(self.directory)


def stored_sources(store_dir: str) -> list[StoredSource]:
  """StoredSource of every checkpoint of a local compact store.

  Raises:
    CheckpointError: if `store_dir` holds no checkpoint_<N>/.
  """
  found = manifest_lib.find_stored_checkpoints(str(store_dir))
  return [StoredSource(path, suffix) for suffix, path in found.items()]


class _StoredReader:
  """Decodes a stored checkpoint's frames slice by slice, checked."""

  def __init__(self, directory: str) -> None:
    version = manifest_lib.read_manifest(directory, manifest_lib.ALL_VERSIONS)[
      'version'
    ]
    if version in manifest_lib.LEGACY_VERSIONS:
      self._stored = legacy_store.LegacyCheckpoint(directory)
    else:
      self._stored = compact_store.StoredCheckpoint(directory)
    self._directory = directory
    self._version = version
    self._frames = self._stored.frames
    self.row_shape = self._frames.row_shape
    self.dtype = self._frames.dtype
    self.written_rows = min(self._stored.add_count, self._stored.num_rows)
    self._crc = 0
    self._units_kept = False

  def keep_units(self, block_rows: int, clevel: int, dictionary: dict):
    """The units a new checkpoint may keep as they are, without decoding
    them here: those of version 5 on (encoded as the newest are), written
    with these `block_rows` and `clevel` against the run dictionary whose
    bytes and CRC-32 are `dictionary`.

    Returns:
      None, or (units file, unit index tables, manifest['observation'],
      rows): the frames are then checked where the units are kept, against the
      same frames_crc32 (compact_output.py decodes every unit it writes).
    """
    spec = self._stored.manifest['observation']
    if self._version < legacy_store.PLAIN_VERSION or (
      spec['block_rows'],
      spec['clevel'],
      spec['run_dictionary'],
    ) != (block_rows, clevel, dictionary):
      return None
    if self._version in manifest_lib.LEGACY_VERSIONS:
      index = legacy_store.unit_index(self._directory)  # Checked at open.
    else:
      self._stored.frames.check_index()
      tables = self._stored.tables
      index = {name: np.array(tables[name]) for name in UNIT_INDEX}
    self._units_kept = True
    units = os.path.join(self._directory, spec['file'])
    return units, index, spec, self._stored.num_rows

  def __enter__(self) -> '_StoredReader':
    return self

  def __exit__(self, *unused_exc_info: Any) -> None:
    self._stored.close()

  def frame_slices(self, slice_rows: int) -> Iterator[np.ndarray]:
    num_rows = self._stored.num_rows
    for start in range(0, num_rows, slice_rows):
      part = self._frames.read_rows(start, min(slice_rows, num_rows - start))
      self._crc = manifest_lib.crc32(part, self._crc)
      yield part

  def finish(self, num_rows: int) -> SourceRows:
    stored = self._stored
    expected = stored.manifest['observation']['frames_crc32']
    if num_rows != stored.num_rows or (
      self._crc != expected and not self._units_kept
    ):
      raise CheckpointError(
        self._frames.path,
        f'checkpoint {stored.suffix}: frames read back have CRC-32 '
        f'{self._crc:#010x}, its manifest says {expected:#010x}',
      )
    return SourceRows(
      arrays={name: np.array(a) for name, a in stored.arrays.items()},
      add_count=stored.add_count,
      invalid_range=stored.invalid_range,
      episode_end_indices=stored.episode_end_indices,
      description=stored.manifest['source'],
    )


class _GzipReader:
  """Streams the observation file; reads the small arrays at the end."""

  def __init__(self, files: file_names.CheckpointFiles) -> None:
    self._files = files
    self._path = files.store_paths['observation']
    # Reads (and checks) the headers, add_count, invalid_range and
    # episode_end_indices before any frame.
    rows = checks.store_headers(files, checkpoints.read_store_headers(files))
    self._bookkeeping = checkpoints.read_bookkeeping(files, rows)
    self._stream = GzipStream(self._path)
    try:
      self._header = npy_stream.read_header(self._stream)
      if len(self._header.shape) < 1:
        raise CheckpointError(self._path, 'observations must have a row axis')
    except BaseException:
      self._stream.close()
      raise
    self.row_shape = self._header.row_shape
    self.dtype = self._header.dtype
    self.written_rows = min(self._bookkeeping[0], self._header.shape[0])

  def __enter__(self) -> '_GzipReader':
    return self

  def __exit__(self, *unused_exc_info: Any) -> None:
    self._stream.close()

  def frame_slices(self, slice_rows: int) -> Iterator[np.ndarray]:
    num_rows = self._header.shape[0]
    buffer = np.empty((min(slice_rows, num_rows),) + self.row_shape, self.dtype)
    for start in range(0, num_rows, slice_rows):
      part = buffer[: min(slice_rows, num_rows - start)]
      self._stream.readinto(part.reshape(-1).view(np.uint8))
      yield part

  def finish(self, num_rows: int) -> SourceRows:
    # Reading to the end checks the source's gzip CRC-32 and length.
    if self._stream.read_to_end():
      raise CheckpointError(
        self._path, 'more data after the rows its header lists'
      )
    # Positional, in SourceRows' field order: (add_count, invalid_range,
    # episode_end_indices) is read_bookkeeping's tuple.
    return SourceRows(
      _read_small_arrays(self._files, num_rows),
      *self._bookkeeping,
      GzipSource(self._files).description(),
    )


def _read_small_arrays(files, num_rows: int):
  """Reads every `$store$_` array but the observations, checking its gzip."""
  arrays = {}
  for name, path in sorted(files.store_paths.items()):
    if name == 'observation':
      continue
    arrays[name] = npy_stream.read_rows(path)  # Whole: CRC-32 checked.
    if len(arrays[name]) != num_rows:
      raise CheckpointError(path, f'{len(arrays[name])} rows, not {num_rows}')
  return arrays
