"""The frames of a stored checkpoint as zstd units with a trained dictionary.

A sampled transition uses five frames (two overlapping stacks of four), so
decoding whole blocks of many frames throws most decoded bytes away. Here
`observation.units` holds `block_rows` frames per unit (1 by default), each
unit one zstd frame (no content size, checksum or dictionary id: those bytes
repeat in every unit) compressed against the run's trained dictionary
(`observation.dict` beside the checkpoints: run_dictionary.py). The
dictionary is what keeps single frames small: Atari screens share their
background, score digits and sprites. The unit sizes, anchors and CRC-32s
among the checkpoint's tables (checkpoint_tables.py) index and check the
units, and every unit is checked against its CRC-32 before it is decoded.

A batch reads the units it needs with one `pread` per run of consecutive
units, then checks and decodes each, all in one compiled call outside the
GIL (unit_decoding.py), so sampling threads decode in parallel.
"""

import os

import numpy as np

from fixed_replay.errors import CheckpointError
from fixed_replay.io import npy_stream
from fixed_replay.store import checkpoint_tables
from fixed_replay.store import run_dictionary
from fixed_replay.store import unit_decoding

LAYOUT = 'units'
# The widths the decoder reads unit sizes in.
_SIZE_DTYPES = tuple(map(np.dtype, ('u1', 'u2', 'u4')))


class StoredUnits:
  """The compressed frames of one stored checkpoint, decoded per unit.

  Thread-safe: units are read with `pread` on one descriptor and decoded
  with a zstd context per thread, in compiled code (unit_decoding.py).
  """

  def __init__(self, directory, manifest, tables):
    """Opens the units and checks their index against the manifest.

    Args:
      directory: str, the checkpoint.
      manifest: dict, its manifest.
      tables: checkpoint_tables.CheckpointTables, its checked tables (unit
        sizes, anchors and CRC-32s stay there, mapped: file-backed pages
        that every process shares and the kernel may drop, not memory of
        the process's own).

    Raises:
      CheckpointError: if the index or the dictionary is damaged.
    """
    self.directory = directory
    self.suffix = manifest['suffix']
    spec = manifest['observation']
    self.path = os.path.join(directory, spec['file'])
    self.block_rows = spec['block_rows']
    self.num_rows = manifest['num_rows']
    self.row_shape = tuple(spec['row_shape'])
    self.dtype = np.dtype(spec['dtype'])
    self.num_blocks = spec['num_blocks']
    self.frame_bytes = npy_stream.row_bytes(self.row_shape, self.dtype)
    self._header = spec['unit_header']
    self.anchor_units = spec['anchor_units']
    self.tables = tables
    # Their blocks are checked as they are read (`check_index`, or a
    # sampler's checks: replay/block_checks.py); the compiled decoder reads
    # them through their addresses.
    self._sizes = tables.unchecked(checkpoint_tables.UNIT_SIZES)
    self.crcs = tables.unchecked(checkpoint_tables.UNIT_CRC32)
    self.anchors = self._check_index(
      tables.unchecked(checkpoint_tables.UNIT_ANCHORS),
      manifest['files'][spec['file']]['bytes'],
    )
    # The run's is mapped from the store and shared: no checkpoint's memory.
    self._dictionary = run_dictionary.load(directory, spec['run_dictionary'])
    self._fd = os.open(self.path, os.O_RDONLY)

  def block_rows_of(self, block: int) -> tuple[int, int]:
    """File rows [first, end) held by unit `block`."""
    first = block * self.block_rows
    return first, min(first + self.block_rows, self.num_rows)

  def _damaged(self, block: int, problem: str) -> CheckpointError:
    first, end = self.block_rows_of(block)
    return CheckpointError(
      self.path,
      f'checkpoint {self.suffix}: unit {block} (rows {first}-{end - 1}) is '
      f'damaged: {problem}',
    )

  def close(self) -> None:
    if self._fd is not None:
      os.close(self._fd)
      self._fd = None

  def _check_index(self, anchors, units_bytes):
    """Raises unless sizes, anchors and CRCs index the units file whole.

    Their bytes are checked against their blocks' CRC-32s; what is left is
    that they agree.
    """
    every, sizes = self.anchor_units, self._sizes
    last = (len(sizes) - 1) // every * every
    # What is read here: the first and last anchors, the last sizes.
    self.tables.check_range(checkpoint_tables.UNIT_ANCHORS, 0, 1)
    self.tables.check_range(
      checkpoint_tables.UNIT_ANCHORS, len(anchors) - 1, len(anchors)
    )
    self.tables.check_range(checkpoint_tables.UNIT_SIZES, last, len(sizes))
    problem = None
    if len(sizes) != self.num_blocks or len(self.crcs) != self.num_blocks:
      problem = (
        f'{len(sizes)} unit sizes and {len(self.crcs)} checksums, manifest '
        f'says {self.num_blocks} units'
      )
    elif (
      sizes.dtype not in _SIZE_DTYPES
      or anchors.dtype != np.int64
      or self.crcs.dtype != np.uint32
    ):
      problem = f'sizes of {sizes.dtype}, anchors of {anchors.dtype}'
    elif len(anchors) != -(-len(sizes) // every) or anchors[:1].any():
      problem = f'{len(anchors)} anchors for {len(sizes)} units of {every}'
    elif anchors[-1] + int(sizes[last:].sum()) != units_bytes:
      problem = "the units' sizes do not add up to the units file"
    if problem:
      raise CheckpointError(
        self.tables.path, f'checkpoint {self.suffix}: {problem}'
      )
    return anchors

  def unit_spans(self, units) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends): where `units` lie in the units file, int64 arrays."""
    units = np.asarray(units, np.int64)
    every, sizes = self.anchor_units, self._sizes
    ends = np.empty(len(units), np.int64)
    for anchor in np.unique(units // every):
      members = units // every == anchor
      span = np.cumsum(
        sizes[anchor * every : (anchor + 1) * every], dtype=np.int64
      )
      ends[members] = self.anchors[anchor] + span[units[members] % every]
    return ends - sizes[units], ends

  @property
  def nbytes(self) -> int:
    """Bytes of the unit index (mapped, shared with every process)."""
    return self.crcs.nbytes + self.anchors.nbytes + self._sizes.nbytes

  def table_row(self):
    """This checkpoint's row of a unit_decoding table (descriptor -1 once
    closed)."""
    last_rows = self.num_rows - (self.num_blocks - 1) * self.block_rows
    row = np.zeros(unit_decoding.COLUMNS, np.int64)
    row[unit_decoding.FD] = -1 if self._fd is None else self._fd
    row[unit_decoding.ANCHORS] = self.anchors.ctypes.data
    row[unit_decoding.CRCS] = self.crcs.ctypes.data
    row[unit_decoding.DDICT] = self._dictionary.address
    row[unit_decoding.NUM_UNITS] = self.num_blocks
    row[unit_decoding.UNIT_BYTES] = self.block_rows * self.frame_bytes
    row[unit_decoding.LAST_BYTES] = last_rows * self.frame_bytes
    row[unit_decoding.HEADER] = self._header
    row[unit_decoding.SIZES] = self._sizes.ctypes.data
    row[unit_decoding.SIZE_BYTES] = self._sizes.dtype.itemsize
    row[unit_decoding.ANCHOR_UNITS] = self.anchor_units
    return row

  def check_index(self) -> None:
    """Checks every block of the unit index (once): what decoding any unit
    reads, for a reader that does not check a batch's blocks."""
    for name in (
      checkpoint_tables.UNIT_SIZES,
      checkpoint_tables.UNIT_ANCHORS,
      checkpoint_tables.UNIT_CRC32,
    ):
      self.tables.check_range(name, 0, self.num_blocks)

  def _read_units(self, units):
    """Raises the error of a short read of the run of sorted `units`."""
    starts, ends = self.unit_spans(units)
    start = int(starts[0])
    size = int(ends[-1]) - start
    data = os.pread(self._fd, size, start)
    if len(data) != size:
      end = start + len(data)
      late = int(np.searchsorted(ends, end, side='right'))
      raise self._damaged(
        int(units[min(late, len(units) - 1)]), f'file ends at byte {end}'
      )

  def _raise_for(self, status, units):
    """Raises the CheckpointError of unit_decoding's failure `status`."""
    position, problem, value, end = status.tolist()
    unit = int(units[position])
    if problem == unit_decoding.SHORT_READ:
      if self._fd is None:
        raise ValueError(f'{self.path} is closed')
      self._read_units(units[position:end])
      problem_text = 'changed while it was read'
    elif problem == unit_decoding.BAD_CRC:
      problem_text = f'CRC-32 {value:#010x}, expected {self.crcs[unit]:#010x}'
    elif problem == unit_decoding.ZSTD_ERROR:
      problem_text = f'zstd cannot decode it: {unit_decoding.error_name(value)}'
    elif problem == unit_decoding.WRONG_SIZE:
      first, end = self.block_rows_of(unit)
      size = (end - first) * self.frame_bytes
      problem_text = f'decodes to {value} bytes, not {size}'
    else:
      raise IndexError(f'unit {unit} outside [0, {self.num_blocks})')
    raise self._damaged(unit, problem_text)

  def _decode(self, units, out):
    """Decodes sorted distinct `units` into `out`, whole units end to end.

    Each unit's CRC-32 is checked before it is decoded.
    """
    unit_bytes = self.block_rows * self.frame_bytes
    target = out.reshape(-1).view(np.uint8)[: units.size * unit_bytes]
    FrameReader([self]).read(
      np.zeros(units.size, np.int64),
      units,
      target.reshape(units.size, unit_bytes),
    )

  def read_frames(self, rows, out=None):
    """The frames at sorted distinct file `rows`, (len(rows), *row_shape).

    Decodes only the units holding them (for one-frame units: exactly
    those frames), into `out` when given.
    """
    rows = np.asarray(rows, dtype=np.int64)
    self.check_index()
    if out is None:
      out = np.empty((len(rows),) + self.row_shape, self.dtype)
    if not len(rows):
      return out
    if self.block_rows == 1:
      self._decode(rows, out)
      return out
    units = np.unique(rows // self.block_rows)
    decoded = np.empty(
      (len(units) * self.block_rows,) + self.row_shape, self.dtype
    )
    self._decode(units, decoded)
    slot = np.searchsorted(units, rows // self.block_rows)
    out[...] = decoded[slot * self.block_rows + rows % self.block_rows]
    return out

  def read_rows(self, start, count):
    """Returns frames [start, start + count) as a new array (not hot path)."""
    return self.read_frames(np.arange(start, start + count))


class FrameReader:
  """Decodes units of several checkpoints at once.

  The batch-wide form of StoredUnits.read_frames: one compiled call a
  batch, outside the GIL. `table` describes the sources to
  unit_decoding's kernel, for compiled callers.
  """

  def __init__(self, sources):
    """Args: sources: sequence of StoredUnits of alike frames and units."""
    self._sources = tuple(sources)
    self.table = np.stack([s.table_row() for s in self._sources])

  def read(self, which, rows, out, slots=None):
    """Decodes units `rows` of sources `which` into `out`.

    Args:
      which: int64 array (n,), index in `sources` of each unit.
      rows: int64 array (n,), unit numbers (file rows of one-frame units),
        increasing within a run of one source.
      out: C-contiguous array (m, block_rows, *row_shape) or, for one-frame
        units, (m, *row_shape) of the frames' dtype.
      slots: optional int64 array (n,): unit k goes to out[slots[k]]
        (default out[k]).

    Raises:
      CheckpointError: naming checkpoint, unit and rows of a unit whose bytes
        do not match their CRC-32 or do not decode.
    """
    if not len(rows):
      return
    status = unit_decoding.decode(
      self.table, which, rows, out.reshape(len(out), -1).view(np.uint8), slots
    )
    if status[1] != unit_decoding.OK:
      self.raise_for(status, which, rows)

  def raise_for(self, status, which, rows):
    """Raises the error of unit_decoding's failure `status` on these units.

    Raises:
      CheckpointError: naming the checkpoint, unit and rows.
    """
    position = int(status[0])
    mine = np.flatnonzero(which == which[position])
    status = status.copy()
    status[0] = np.searchsorted(mine, position)
    status[3] = np.searchsorted(mine, status[3])
    self._sources[int(which[position])]._raise_for(status, rows[mine])

  def close(self) -> None:
    """Stops reading: the sources' descriptors may be reused."""
    self.table[:, unit_decoding.FD] = -1
