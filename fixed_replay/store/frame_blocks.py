"""The frames of a format version 1 checkpoint: blosc2 blocks, each alone.

Version 1 is read, no longer written (frame_units.py is what is written).

`observation.blocks` holds `block_rows` frames per block, each block one
self-contained blosc2 chunk; `observation_offsets.npy` and
`observation_crc32.npy` index and check them. Reading a row decodes only its
block: a `pread` of a few KB, a CRC-32 and a zstd decompression, all outside
the GIL.
"""

import os

import blosc2
import numpy as np

from fixed_replay.errors import CheckpointError
from fixed_replay.store import manifest as manifest_lib

# Decoding runs in background threads next to training: let blosc2 drop the
# GIL while it (de)compresses. Process-wide, and harmless to other users.
blosc2.set_releasegil(True)


class StoredFrameFile:
  """What the frame files of both layouts share.

  The manifest's description of the frames, the rows each unit of storage
  holds (a blosc2 block here, a zstd unit in frame_units.StoredUnits),
  errors naming checkpoint, unit and rows, and the descriptor reads go
  through (`os.pread`, so reads are thread-safe).
  """

  UNIT = 'block'  # What the errors call one unit of storage.

  def __init__(self, directory: str, manifest: dict) -> None:
    self.directory = directory
    self.suffix = manifest['suffix']
    spec = manifest['observation']
    self.path = os.path.join(directory, spec['file'])
    self.block_rows = spec['block_rows']
    self.num_rows = manifest['num_rows']
    self.row_shape = tuple(spec['row_shape'])
    self.dtype = np.dtype(spec['dtype'])
    self.num_blocks = spec['num_blocks']
    self._fd = None
    self._files = manifest['files']
    # The files it checked against the manifest as it opened (its index):
    # StoredCheckpoint's verification skips them.
    self.checked_files = set()

  def _load_checked(self, name, read=None):
    """The file `name`, checked against the manifest, then read (None: an
    array, mapped where plain)."""
    path = os.path.join(self.directory, name)
    manifest_lib.check_file(
      path, self._files.get(name), f'checkpoint {self.suffix}: '
    )
    self.checked_files.add(name)
    return read(path) if read else manifest_lib.load_npy(path, mmap=True)

  def _check_index(self, offsets: np.ndarray, crcs: np.ndarray) -> None:
    """Raises unless the index has one offset and CRC per unit (+1 end)."""
    if len(offsets) != self.num_blocks + 1 or len(crcs) != self.num_blocks:
      raise CheckpointError(
        self.directory,
        f'{self.UNIT} index of {len(offsets) - 1} {self.UNIT}s and '
        f'{len(crcs)} checksums, manifest says {self.num_blocks}',
      )

  def _open(self) -> None:
    self._fd = os.open(self.path, os.O_RDONLY)

  def block_rows_of(self, block: int) -> tuple[int, int]:
    """File rows [first, end) held by `block`."""
    first = block * self.block_rows
    return first, min(first + self.block_rows, self.num_rows)

  def _damaged(self, block: int, problem: str) -> CheckpointError:
    first, end = self.block_rows_of(block)
    return CheckpointError(
      self.path,
      f'checkpoint {self.suffix}: {self.UNIT} {block} (rows {first}-'
      f'{end - 1}) is damaged: {problem}',
    )

  def close(self) -> None:
    if self._fd is not None:
      os.close(self._fd)
      self._fd = None


class StoredFrames(StoredFrameFile):
  """The compressed frames of one stored checkpoint, decoded per block."""

  def __init__(self, directory: str, manifest: dict) -> None:
    super().__init__(directory, manifest)
    self.offsets = self._load_checked(manifest_lib.OFFSETS_FILE)
    self.crcs = self._load_checked(manifest_lib.CRC_FILE)
    self._check_index(self.offsets, self.crcs)
    self._open()

  @property
  def nbytes(self) -> int:
    """Bytes held in memory: the block index."""
    return self.offsets.nbytes + self.crcs.nbytes

  def read_block(self, block: int, out: np.ndarray) -> int:
    """Decodes `block` into `out[:rows]`; returns the number of rows.

    Args:
      block: int, block number.
      out: writable C-contiguous array (block_rows, *row_shape) of the
        frames' dtype.

    Returns:
      int, rows of the block (block_rows except maybe for the last).

    Raises:
      CheckpointError: naming checkpoint, block and rows when the block's
        bytes do not match their checksum or do not decode.
    """
    start, stop = self.offsets[block : block + 2].tolist()
    data = os.pread(self._fd, stop - start, start)
    if len(data) != stop - start:
      raise self._damaged(block, f'file ends at byte {start + len(data)}')
    actual, expected = manifest_lib.crc32(data), int(self.crcs[block])
    if actual != expected:
      raise self._damaged(
        block, f'CRC-32 {actual:#010x}, expected {expected:#010x}'
      )
    rows = min(self.block_rows, self.num_rows - block * self.block_rows)
    try:
      blosc2.decompress2(data, dst=out[:rows], nthreads=1)
    except (RuntimeError, ValueError) as error:
      raise self._damaged(block, f'blosc2 cannot decode it: {error}') from error
    return rows

  def read_rows(self, start: int, count: int) -> np.ndarray:
    """Returns frames [start, start + count) as a new array (not hot path)."""
    result = np.empty((count,) + self.row_shape, self.dtype)
    scratch = np.empty((self.block_rows,) + self.row_shape, self.dtype)
    row = start
    while row < start + count:
      block = row // self.block_rows
      first, _ = self.block_rows_of(block)
      rows = self.read_block(block, scratch)
      take = min(first + rows, start + count) - row
      result[row - start : row - start + take] = scratch[
        row - first : row - first + take
      ]
      row += take
    return result


class UnheldFrames:
  """Stands for a window's frames that stay compressed on disk.

  Sits in a CheckpointWindow's `store['observation']`, where only the length
  (rows of the window) is used; frames come from StoredFrames instead.
  """

  nbytes = 0

  def __init__(self, num_rows: int) -> None:
    self._num_rows = num_rows

  def __len__(self) -> int:
    return self._num_rows
