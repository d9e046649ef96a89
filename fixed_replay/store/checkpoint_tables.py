"""A stored checkpoint's tables: every array but the frames, in one file.

Sampling a transition reads a few bytes of several tables: the action,
reward and terminal of a few rows, a bit of the valid-row mask, and the
size, anchor and CRC-32 of the units that hold its frames. Mapped one file a
table, a checkpoint took eight of Linux's 65,530 maps a process
(`vm.max_map_count`): a process held about 8,000 checkpoints, half the DQN
Replay Dataset. Here the tables are one file, `tables`, each at an offset
that is a multiple of ALIGN, so that a checkpoint takes one map; its units
take none (they are read with `pread`).

The file is checked in BLOCK_BYTES blocks against CRC-32s the manifest holds
(`block_crc32`: base64 of little-endian uint32s, covered by the manifest's
own CRC-32), so that a reader checks only the blocks it reads: opening 500
checkpoints from disk then reads their manifests, not 4 GB of tables.
Aligned tables share no block, and a damaged block is named with its table.
"""

import base64
import mmap
import os

import numba
import numpy as np

from fixed_replay import kernel_cache
from fixed_replay.errors import CheckpointError
from fixed_replay.io import mapped
from fixed_replay.store import unit_decoding

kernel_cache.install()  # Before the first njit: see kernel_cache.py.

FILE = 'tables'
# Each table starts a page: no block holds two tables' bytes.
ALIGN = 4096
BLOCK_BYTES = 4096
# The tables beside the `$store$_` arrays (which are named by element).
VALID_MASK = 'valid_mask'  # One bit a file row (np.packbits, little order).
INVALID_RANGE = 'invalid_range'
EPISODE_ENDS = 'episode_end_indices'  # Where the checkpoint had them.
UNIT_SIZES = 'unit_sizes'  # Each unit's bytes, u1, u2 or u4.
UNIT_ANCHORS = 'unit_anchors'  # int64 offset of every ANCHOR_UNITS-th unit.
UNIT_CRC32 = 'unit_crc32'  # uint32, each unit's.
RESERVED = (
  VALID_MASK,
  INVALID_RANGE,
  EPISODE_ENDS,
  UNIT_SIZES,
  UNIT_ANCHORS,
  UNIT_CRC32,
)


def pack(tables: dict[str, np.ndarray]) -> tuple[np.ndarray, dict]:
  """The bytes of a tables file holding `tables`, and its manifest entry.

  Args:
    tables: dict of name to array, stored in its dtype and shape.

  Returns:
    (uint8 array, dict): the file's bytes (a whole number of blocks), and
    manifest['tables'].
  """
  layout, size = {}, 0
  for name, array in tables.items():
    layout[name] = {
      'offset': size,
      'dtype': array.dtype.str,
      'shape': list(array.shape),
    }
    size += -(-array.nbytes // ALIGN) * ALIGN
  data = np.zeros(size, np.uint8)
  for name, array in tables.items():
    start = layout[name]['offset']
    data[start : start + array.nbytes] = (
      np.ascontiguousarray(array).view(np.uint8).reshape(-1)
    )
  crcs = block_crc32s(data, BLOCK_BYTES).astype('<u4')
  return data, {
    'file': FILE,
    'block_bytes': BLOCK_BYTES,
    'block_crc32': base64.b64encode(crcs.tobytes()).decode('ascii'),
    'layout': layout,
  }


@numba.njit(nogil=True, cache=True)
def _block_crcs(functions, address, size, block_bytes, blocks, out):
  for k in range(len(blocks)):
    start = blocks[k] * block_bytes
    length = min(block_bytes, size - start)
    out[k] = unit_decoding.call_crc(functions[1], 0, address + start, length)


def block_crc32s(
  data: np.ndarray, block_bytes: int, blocks: np.ndarray | None = None
) -> np.ndarray:
  """The CRC-32 of `block_bytes` blocks of `data` (the last may be shorter).

  Args:
    data: C-contiguous uint8 array.
    block_bytes: int.
    blocks: optional int64 array of block numbers (default: every block).

  Returns:
    uint32 array, one a block: ISA-L's CRC-32 in compiled code, outside the
    GIL, with no call from Python a block.
  """
  if data.dtype != np.uint8 or not data.flags.c_contiguous:
    raise ValueError('`data` must be a C-contiguous uint8 array')
  count = -(-data.size // block_bytes)
  if blocks is None:
    blocks = np.arange(count)
  blocks = np.ascontiguousarray(blocks, np.int64)
  if blocks.size and (blocks.min() < 0 or blocks.max() >= count):
    raise IndexError(f'blocks outside the {count} of `data`')
  out = np.empty(len(blocks), np.uint32)
  if blocks.size:
    _block_crcs(
      unit_decoding.FUNCTIONS,
      data.ctypes.data,
      data.size,
      block_bytes,
      blocks,
      out,
    )
  return out


@numba.njit(nogil=True, cache=True)
def check_blocks(
  functions, addresses, sizes, base, block_bytes, keys, expected, checked
):
  """Checks blocks of several mapped files against their CRC-32s.

  Key k names block keys[k] - base[p] of file p (the last p with base[p] <=
  keys[k]), mapped at addresses[p], sizes[p] bytes; expected[key] is its
  CRC-32, and checked[key] is set once it matches. Every block's read is
  asked for (madvise(WILLNEED)) before the first is checked.

  Returns:
    (-1, 0), or (k, CRC-32) of the first key whose block differs.
  """
  owners = np.empty(len(keys), np.int64)
  for k in range(len(keys)):
    low, high = 0, len(base) - 1
    while low < high:  # The last file whose blocks begin at or before it.
      middle = (low + high + 1) // 2
      if base[middle] <= keys[k]:
        low = middle
      else:
        high = middle - 1
    owners[k] = low
  if functions.size > unit_decoding.MADVISE:
    for k in range(len(keys)):
      p = owners[k]
      start = (keys[k] - base[p]) * block_bytes
      unit_decoding.call_madvise(
        functions[unit_decoding.MADVISE],
        addresses[p] + start,
        block_bytes,
        unit_decoding.MADV_WILLNEED,
      )
  for k in range(len(keys)):
    p = owners[k]
    start = (keys[k] - base[p]) * block_bytes
    length = min(block_bytes, sizes[p] - start)
    crc = unit_decoding.call_crc(functions[1], 0, addresses[p] + start, length)
    if crc != expected[keys[k]]:
      return k, crc
    checked[keys[k]] = True
  return -1, 0


class CheckpointTables:
  """The tables of one stored checkpoint, mapped once, read where they lie.

  `tables[name]` is a read-only view of a whole table in its stored dtype,
  its blocks checked; `unchecked(name)` the same view for a reader that
  checks the blocks it reads first (`check_blocks`, `check_range`: a
  sampler's, replay/block_checks.py). Opened from the page cache, every
  block is checked at once: that costs memory reads alone and enters the
  file in the page table, so sampling takes no fault on it. Opened from
  disk, a block is read and checked when first used: opening reads no
  table, and sampling only the pages its transitions use.
  """

  def __init__(self, directory: str, manifest: dict) -> None:
    """Maps the tables file; checks it whole if it is in the page cache.

    Raises:
      CheckpointError: if the file is missing, of another size than the
        manifest's, or (in the page cache) a block differs from its
        CRC-32, naming its table.
    """
    spec = manifest['tables']
    self.path = os.path.join(directory, spec['file'])
    self._suffix = manifest['suffix']
    self._layout = spec['layout']
    self.block_bytes = spec['block_bytes']
    # Each block's CRC-32, as the manifest gives them.
    self.crcs = np.frombuffer(base64.b64decode(spec['block_crc32']), '<u4')
    try:
      self._data = mapped.map_file(self.path)
    except FileNotFoundError as error:
      raise CheckpointError(self.path, 'missing: the tables') from error
    expected = manifest['files'][spec['file']]['bytes']
    self.num_blocks = -(-len(self._data) // self.block_bytes)
    if len(self._data) != expected or self.num_blocks != len(self.crcs):
      raise CheckpointError(
        self.path,
        f'checkpoint {self._suffix}: {len(self._data)} bytes, manifest says '
        f'{expected} in {len(self.crcs)} blocks of {self.block_bytes}',
      )
    self.address = self._data.ctypes.data  # Of the map, for compiled checks.
    for name in self._layout:
      self.unchecked(name)  # Raises for a table that is not inside the file.
    # Which blocks are checked (a sampler's checks start from these).
    self.checked = np.zeros(self.num_blocks, np.bool_)
    if mapped.in_page_cache(self._data):
      self.check_blocks(np.arange(self.num_blocks))
    else:
      # A fault reads its page alone: Linux's read-around (8 MB here) would
      # read most of the file for each page a batch reads.
      mapped.advise(self._data, mmap.MADV_RANDOM)

  def share(self, crcs: np.ndarray, checked: np.ndarray) -> None:
    """Keeps the blocks' CRC-32s and checked bits in `crcs` and `checked`,
    views of a sampler's arrays over many checkpoints (their values taken
    from here), so that a block either checks is checked for both."""
    crcs[:] = self.crcs
    checked[:] = self.checked
    self.crcs, self.checked = crcs, checked

  def check_blocks(self, blocks: np.ndarray) -> None:
    """Checks those of `blocks` not checked before against their CRC-32s.

    Raises:
      CheckpointError: naming the first damaged block and its table.
    """
    blocks = np.asarray(blocks, np.int64)
    blocks = blocks[~self.checked[blocks]]
    if not len(blocks):
      return
    actual = block_crc32s(self._data, self.block_bytes, blocks)
    bad = np.flatnonzero(actual != self.crcs[blocks])
    if len(bad):
      self.raise_damaged(int(blocks[bad[0]]), int(actual[bad[0]]))
    self.checked[blocks] = True

  def raise_damaged(self, block: int, actual: int) -> None:
    """Raises the CheckpointError of `block`, whose CRC-32 is `actual`."""
    start = block * self.block_bytes
    held = [n for n, t in self._layout.items() if t['offset'] <= start]
    table = max(held, key=lambda n: self._layout[n]['offset'], default='')
    raise CheckpointError(
      self.path,
      f'checkpoint {self._suffix}: block {block} (bytes {start}-'
      f'{start + self.block_bytes - 1}, table {table}) is damaged: CRC-32 '
      f'{actual:#010x}, manifest says {self.crcs[block]:#010x}',
    )

  def region(self, name: str) -> tuple[int, int]:
    """(offset in the file, bytes an element along the first axis) of
    table `name`."""
    entry = self._layout[name]
    row = np.prod(entry['shape'][1:], dtype=np.int64)
    return entry['offset'], int(row) * np.dtype(entry['dtype']).itemsize

  def check_range(
    self, name: str, start: int = 0, stop: int | None = None
  ) -> None:
    """Checks the blocks holding elements [start, stop) of table `name`
    (default: all of it)."""
    shape = self._layout[name]['shape']
    length = shape[0] if shape else 1
    start, stop = max(start, 0), min(length if stop is None else stop, length)
    if stop <= start:
      return
    offset, size = self.region(name)
    first = (offset + start * size) // self.block_bytes
    last = (offset + stop * size - 1) // self.block_bytes
    if last > first and not self.checked[first : last + 1].all():
      # Read together, not a page a fault (see __init__).
      mapped.advise(
        self._data,
        mmap.MADV_WILLNEED,
        first * self.block_bytes,
        (last + 1 - first) * self.block_bytes,
      )
    self.check_blocks(np.arange(first, last + 1))

  def __contains__(self, name: str) -> bool:
    return name in self._layout

  def __getitem__(self, name: str) -> np.ndarray:
    self.check_range(name)
    return self.unchecked(name)

  def unchecked(self, name: str) -> np.ndarray:
    """Table `name`, its blocks not checked here (see the class)."""
    entry = self._layout[name]
    dtype, shape = np.dtype(entry['dtype']), tuple(entry['shape'])
    count = int(np.prod(shape, dtype=np.int64))
    if entry['offset'] + count * dtype.itemsize > len(self._data):
      raise CheckpointError(
        self.path,
        f'checkpoint {self._suffix}: table {name} ({shape} {dtype} at byte '
        f'{entry["offset"]}) ends past the file',
      )
    array = np.frombuffer(self._data, dtype, count, entry['offset'])
    return array.reshape(shape)
