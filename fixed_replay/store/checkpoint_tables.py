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
own CRC-32), so that a reader may check only the blocks it reads. Aligned
tables share no block, and a damaged block is named with its table.
"""

import base64
import os

import numpy as np

from fixed_replay.errors import CheckpointError
from fixed_replay.io import mapped
from fixed_replay.store import unit_decoding

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
  crcs = unit_decoding.block_crc32s(data, BLOCK_BYTES).astype('<u4')
  return data, {
    'file': FILE,
    'block_bytes': BLOCK_BYTES,
    'block_crc32': base64.b64encode(crcs.tobytes()).decode('ascii'),
    'layout': layout,
  }


class CheckpointTables:
  """The tables of one stored checkpoint, mapped once, read where they lie.

  `tables[name]` is a read-only view of a table in its stored dtype.
  """

  def __init__(self, directory: str, manifest: dict) -> None:
    """Maps the tables file and checks every block against its CRC-32.

    Raises:
      CheckpointError: if the file is missing, of another size than the
        manifest's, or a block differs from its CRC-32 (naming its table).
    """
    spec = manifest['tables']
    self.path = os.path.join(directory, spec['file'])
    self._suffix = manifest['suffix']
    self._layout = spec['layout']
    self._block_bytes = spec['block_bytes']
    self._crcs = np.frombuffer(base64.b64decode(spec['block_crc32']), '<u4')
    try:
      self._data = mapped.map_file(self.path)
    except FileNotFoundError as error:
      raise CheckpointError(self.path, 'missing: the tables') from error
    expected = manifest['files'][spec['file']]['bytes']
    blocks = -(-len(self._data) // self._block_bytes)
    if len(self._data) != expected or blocks != len(self._crcs):
      raise CheckpointError(
        self.path,
        f'checkpoint {self._suffix}: {len(self._data)} bytes, manifest says '
        f'{expected} in {len(self._crcs)} blocks of {self._block_bytes}',
      )
    for name in self._layout:
      self[name]  # Raises for a table that is not inside the file.
    self._check_blocks()

  def _check_blocks(self) -> None:
    actual = unit_decoding.block_crc32s(self._data, self._block_bytes)
    bad = np.flatnonzero(actual != self._crcs)
    if not len(bad):
      return
    block = int(bad[0])
    start = block * self._block_bytes
    held = [n for n, t in self._layout.items() if t['offset'] <= start]
    table = max(held, key=lambda n: self._layout[n]['offset'], default='')
    raise CheckpointError(
      self.path,
      f'checkpoint {self._suffix}: block {block} (bytes {start}-'
      f'{start + self._block_bytes - 1}, table {table}) is damaged: CRC-32 '
      f'{actual[block]:#010x}, manifest says {self._crcs[block]:#010x}',
    )

  def __contains__(self, name: str) -> bool:
    return name in self._layout

  def __getitem__(self, name: str) -> np.ndarray:
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
