"""The compact store: replay checkpoints as independently decodable units.

`fixed-replay convert` (see convert.py) writes one directory per run:

  STORE/
    observation.dict            the run's zstd dictionary, trained on frames
                                of all its checkpoints (frame_units.py)
    checkpoint_<suffix>/        one per converted checkpoint, complete only
      manifest.json             what the directory holds; written last
      observation.units         the frames, `block_rows` (default 1) per
                                unit, each unit one zstd frame against the
                                run's dictionary, stored without the 6 bytes
                                they all begin with (frame_units.py)
      tables                    every other array, each at a page of its
                                own, checked in blocks (checkpoint_tables.py):
        action, reward, terminal, <element>
                                the other `$store$_` arrays, each in the
                                narrowest dtype that gives back its bytes
                                (the manifest's dtype is the element's)
        valid_mask              one bit per file row (np.packbits, little
                                bit order): may Dopamine sample it, for the
                                manifest's stack_size and update_horizon
        unit_sizes, unit_anchors, unit_crc32
                                each unit's bytes (u1, u2 or u4: the
                                narrowest that holds the largest), the int64
                                offset of every anchor_units-th unit (a
                                unit's offset: its anchor's plus the sizes
                                between), and each unit's CRC-32
        invalid_range           as in the checkpoint
        episode_end_indices     sorted int64 rows, when the checkpoint had it
    .checkpoint_<suffix>.partial-<pid>/   being written: never read

That is format version 6 (manifest.py): a buffer maps the tables where they
lie, one map a checkpoint, and reads the units it samples with `pread`
(replay/compact_windows.py). Stores of versions 1-5 are upgraded by
`fixed-replay convert OLD NEW` (convert/legacy_store.py).

A checkpoint directory only ever appears by renaming a verified partial one,
so its presence means it is complete. The manifest records the format and
version, the codec, the block size, the rows, the source files, the size
and CRC-32 of every file and the CRC-32s of the tables' blocks, and the
CRC-32 of its own content (`manifest_crc32`), so a store describes and
checks itself.

Reading a row decodes only its unit: a frame costs a `pread` of a few
hundred bytes, a CRC-32 and a zstd decompression against the dictionary.
"""

from collections.abc import Collection
from collections.abc import Mapping
import dataclasses

import numpy as np

from fixed_replay.errors import CheckpointError
from fixed_replay.io import npy_stream
from fixed_replay.sources.dopamine import checkpoints
from fixed_replay.store import checkpoint_tables
from fixed_replay.store import frame_units
from fixed_replay.store import manifest as manifest_lib
from fixed_replay.store import run_dictionary

# Frames decoded at a time when every frame is checked.
_VERIFY_ROWS = 4096
# The arrays every sampler reads (the frames are opened apart).
_ALWAYS_OPENED = ('action', 'reward', 'terminal')


def pack_valid_rows(rows: np.ndarray, num_rows: int) -> np.ndarray:
  """Packs sorted valid file rows into one bit per row (little bit order)."""
  mask = np.zeros(num_rows, dtype=bool)
  mask[rows] = True
  return np.packbits(mask, bitorder='little')


def unpack_valid_rows(packed: np.ndarray, num_rows: int) -> np.ndarray:
  """Inverse of pack_valid_rows: sorted int32 file rows."""
  mask = np.unpackbits(packed, count=num_rows, bitorder='little')
  return np.flatnonzero(mask).astype(np.int32)


class StoredCheckpoint:
  """One checkpoint of a compact store, opened for sampling.

  Attributes:
    directory: str.
    manifest: dict.
    suffix: int.
    num_rows: int, rows of the file (the writer's capacity).
    add_count: int.
    arrays: mapping of element name to its array, read when asked for and
      not held (the `$store$_` elements but observation: all, or those
      asked for); `arrays.row_type(name)` and `arrays.row_bytes(names)` give
      dtype, row shape and bytes from the manifest without reading.
    frames: frame_units.StoredUnits.
    invalid_range: int64 array.
    episode_end_indices: int64 array or None.
  """

  def __init__(
    self,
    directory: str,
    elements: Collection[str] | None = None,
    manifest: dict | None = None,
  ) -> None:
    """Opens a stored checkpoint.

    Args:
      directory: str, a checkpoint_<suffix> directory.
      elements: optional names of the arrays to offer beyond action,
        reward and terminal (None: every array).
      manifest: its manifest, where the caller has read it already
        (read_manifest; a set's manifests are read once, to be compared).

    The tables are checked against their blocks' CRC-32s (the units are
    checked one by one as they are decoded), then read where they lie.

    Raises:
      CheckpointError: on a bad manifest or a damaged file, or a store of
        an earlier format version (naming the command that upgrades it).
    """
    self.directory = str(directory)
    if manifest is None:
      manifest = manifest_lib.read_manifest(self.directory)
    self.manifest = manifest
    specs = manifest['arrays']
    if elements is not None:
      wanted = set(elements) | set(_ALWAYS_OPENED)
      specs = {name: spec for name, spec in specs.items() if name in wanted}
    self.tables = checkpoint_tables.CheckpointTables(self.directory, manifest)
    self.suffix = manifest['suffix']
    self.num_rows = manifest['num_rows']
    self.add_count = manifest['add_count']
    self.arrays = _StoredArrays(self.tables, specs, self.num_rows)
    self.invalid_range = self.tables[checkpoint_tables.INVALID_RANGE].astype(
      np.int64
    )
    self.episode_end_indices = None
    if checkpoint_tables.EPISODE_ENDS in self.tables:
      self.episode_end_indices = self.tables[checkpoint_tables.EPISODE_ENDS]
    # Last: it opens the units, which close() closes.
    self.frames = frame_units.StoredUnits(self.directory, manifest, self.tables)

  def valid_rows_mask(
    self, stack_size: int, update_horizon: int
  ) -> np.ndarray | None:
    """The precomputed valid rows of the whole file as bits, or None.

    Returns:
      uint8 array, one bit a file row (pack_valid_rows), mapped, when it
      was computed for this stack_size and update_horizon, else None.
    """
    spec = self.manifest['valid_rows']
    if (spec['stack_size'], spec['update_horizon']) != (
      stack_size,
      update_horizon,
    ):
      return None
    mask = self.tables[checkpoint_tables.VALID_MASK]
    if mask.shape != (-(-self.num_rows // 8),) or mask.dtype != np.uint8:
      raise CheckpointError(
        self.tables.path,
        f'valid_mask: {mask.shape} {mask.dtype}, not a bit a row of '
        f'{self.num_rows}',
      )
    return mask

  def valid_rows_table(
    self, stack_size: int, update_horizon: int
  ) -> np.ndarray | None:
    """valid_rows_mask as a sorted int32 array of file rows, or None."""
    mask = self.valid_rows_mask(stack_size, update_horizon)
    return None if mask is None else unpack_valid_rows(mask, self.num_rows)

  def window(
    self, start: int, count: int, arrays: dict[str, np.ndarray]
  ) -> checkpoints.CheckpointWindow:
    """A CheckpointWindow of rows [start, start + count), frames not held.

    Args:
      start: int, first file row.
      count: int, rows.
      arrays: dict of element name to arrays holding the window's rows.

    Returns:
      checkpoints.CheckpointWindow whose store['observation'] is
      UnheldFrames.
    """
    if start < 0 or count <= 0 or start + count > self.num_rows:
      raise CheckpointError(
        self.directory,
        f'rows [{start}, {start + count}) asked, but checkpoint '
        f'{self.suffix} has {self.num_rows} rows',
      )
    store = dict(arrays)
    store['observation'] = UnheldFrames(count)
    return checkpoints.CheckpointWindow(
      suffix=self.suffix,
      start=start,
      num_file_rows=self.num_rows,
      store=store,
      add_count=self.add_count,
      invalid_range=self.invalid_range,
      episode_end_indices=self.episode_end_indices,
    )

  def close(self) -> None:
    self.frames.close()


class UnheldFrames:
  """Stands for a window's frames that stay compressed on disk.

  Sits in a CheckpointWindow's `store['observation']`, where only the length
  (rows of the window) is used; frames come from StoredUnits instead.
  """

  nbytes = 0

  def __init__(self, num_rows: int) -> None:
    self._num_rows = num_rows

  def __len__(self) -> int:
    return self._num_rows


class _StoredArrays(Mapping):
  """A stored checkpoint's small arrays by name, read where they lie.

  In its element's dtype (the manifest's) by `[name]`, or as stored, in the
  narrowest dtype that holds its values, by `stored`. Nothing is held
  between uses: a buffer copies the rows it samples from.
  """

  def __init__(self, tables, specs, num_rows):
    self._tables = tables
    self._specs = specs
    self._num_rows = num_rows

  def stored(self, name: str) -> np.ndarray:
    """Array `name` as stored: mapped, maybe narrower, its blocks checked."""
    self._tables.check_range(name, 0, self._num_rows)
    return self.unchecked(name)

  def unchecked(self, name: str) -> np.ndarray:
    """`stored(name)` for a reader that checks the blocks it reads first
    (checkpoint_tables.CheckpointTables)."""
    array = self._tables.unchecked(name)
    dtype, row_shape = self.row_type(name)
    if len(array) != self._num_rows or array.shape[1:] != row_shape:
      raise CheckpointError(
        self._tables.path,
        f'{name}: {array.shape} {array.dtype}, manifest says '
        f'{self._num_rows} rows of {row_shape} {dtype}',
      )
    if not np.can_cast(array.dtype, dtype):
      raise CheckpointError(
        self._tables.path, f'{name}: {array.dtype} does not hold {dtype}'
      )
    return array

  def __getitem__(self, name: str) -> np.ndarray:
    array = self.stored(name)
    return array.astype(self.row_type(name)[0], copy=False)

  def __iter__(self):
    return iter(self._specs)

  def __len__(self):
    return len(self._specs)

  def row_type(self, name: str) -> tuple[np.dtype, tuple[int, ...]]:
    """(dtype, shape of a row) of an array, from the manifest (not read)."""
    spec = self._specs[name]
    return np.dtype(spec['dtype']), tuple(spec['row_shape'])

  def row_bytes(self, names: Collection[str] | None = None) -> int:
    """Bytes of a row of the named arrays (default: all), from the manifest."""
    total = 0
    for name in self if names is None else names:
      dtype, row_shape = self.row_type(name)
      total += npy_stream.row_bytes(row_shape, dtype)
    return total


@dataclasses.dataclass(frozen=True)
class VerifiedCheckpoint:
  """What `verify_checkpoint` found: the manifest and the frames' CRC-32."""

  manifest: dict
  frames_crc32: int


def verify_checkpoint(
  directory: str, decode: bool = False
) -> 'VerifiedCheckpoint':
  """Checks a stored checkpoint against its manifest.

  Args:
    directory: str.
    decode: bool, also decode every block and check the CRC-32 of all the
      frames against the one the manifest took from the source file.

  Returns:
    VerifiedCheckpoint.

  Raises:
    CheckpointError: naming the file (and for frames, block and rows).
  """
  manifest = manifest_lib.read_manifest(directory)
  manifest_lib.verify_files(directory, manifest)
  spec = manifest['observation']
  run_dictionary.load(directory, spec['run_dictionary'])
  if not decode:
    return VerifiedCheckpoint(manifest, spec['frames_crc32'])
  frames = frame_units.StoredUnits(
    directory, manifest, checkpoint_tables.CheckpointTables(directory, manifest)
  )
  try:
    value = 0
    # Thousands of rows a call: one compiled call each for units (a call a
    # unit spent 40x zstd's time on calls, half a conversion's CPU).
    for start in range(0, frames.num_rows, _VERIFY_ROWS):
      count = min(_VERIFY_ROWS, frames.num_rows - start)
      value = manifest_lib.crc32(frames.read_rows(start, count), value)
  finally:
    frames.close()
  if value != spec['frames_crc32']:
    raise CheckpointError(
      frames.path,
      f'checkpoint {manifest["suffix"]}: decoded frames have CRC-32 '
      f'{value:#010x}, the source had {spec["frames_crc32"]:#010x}',
    )
  return VerifiedCheckpoint(manifest, value)
