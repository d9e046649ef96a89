"""Compact stores of format versions 1-5, read once so they can be upgraded.

A buffer samples format 6 alone (store/compact_store.py). A store written by
an earlier fixed_replay is refused there with the command that upgrades it,
`fixed-replay convert OLD NEW`, whose reader is this module: each checkpoint
front to back, its index, arrays and dictionary checked whole against the
manifest first, every frame unit or block against its CRC-32 as it is
decoded, and all the frames against the CRC-32 taken from the original
source (checkpoint_source.py). What the older versions hold, beside the
manifest, action, reward, terminal and the other per-row arrays:

  1  the frames as blosc2 blocks (`observation.blocks`), indexed by int64
     offsets (`observation_offsets.npy`);
  2  zstd units against the checkpoint's own dictionary (`observation.dict`),
     indexed by int64 offsets;
  3  units without the 6 bytes they all begin with (the manifest's
     `unit_header` holds 2 of them), indexed by their sizes, and every file
     but the units and their CRC-32s zstd-compressed (`.zst`);
  4  3 with one dictionary for the whole run, beside its checkpoints;
  5  4 with every file plain, and the offset of every 64th unit
     (`observation_anchors.npy`).

Decoding goes through zstandard's and blosc2's Python calls, a unit at a
time: an upgrade is read once, and this keeps the sampler's compiled
decoder to the one format it samples.
"""

import io
import os

import numpy as np
import zstandard

from fixed_replay.errors import CheckpointError
from fixed_replay.io import npy_stream
from fixed_replay.store import checkpoint_tables
from fixed_replay.store import manifest as manifest_lib
from fixed_replay.store import run_dictionary
from fixed_replay.store import unit_decoding

BLOCKS_VERSION = 1
SIZES_VERSION = 3  # Unit sizes, headers stripped, small files packed.
RUN_DICTIONARY_VERSION = 4
PACKED_VERSIONS = (3, 4)  # Small files zstd-compressed.
PLAIN_VERSION = 5  # Units encoded as the newest version's.
OFFSETS_FILE = 'observation_offsets.npy'
SIZES_FILE = 'observation_sizes.npy'
CRC_FILE = 'observation_crc32.npy'
ANCHORS_FILE = 'observation_anchors.npy'
INVALID_RANGE_FILE = 'invalid_range.npy'
PACKED_SUFFIX = '.zst'


def _read(path: str) -> bytes:
  """A file's content, decompressed where its name ends in .zst."""
  with open(path, 'rb') as stream:
    data = stream.read()
  if not path.endswith(PACKED_SUFFIX):
    return data
  try:
    return zstandard.ZstdDecompressor().decompress(data)
  except zstandard.ZstdError as error:
    raise CheckpointError(path, f'does not decompress: {error}') from error


def _load(path: str) -> np.ndarray:
  """A stored .npy array (see _read)."""
  try:
    return np.load(io.BytesIO(_read(path)), allow_pickle=False)
  except (OSError, ValueError, EOFError) as error:
    raise CheckpointError(path, f'unreadable array: {error}') from error


def unit_index(directory: str) -> dict[str, np.ndarray]:
  """The unit sizes, anchors and CRC-32s of a version 5 checkpoint, in the
  newest version's table names (its files checked by LegacyCheckpoint)."""
  names = {
    checkpoint_tables.UNIT_SIZES: SIZES_FILE,
    checkpoint_tables.UNIT_ANCHORS: ANCHORS_FILE,
    checkpoint_tables.UNIT_CRC32: CRC_FILE,
  }
  return {n: _load(os.path.join(directory, f)) for n, f in names.items()}


class LegacyCheckpoint:
  """A checkpoint of format 1-5, as `_StoredReader` reads a stored one.

  Attributes:
    manifest: dict.
    suffix, num_rows, add_count: int.
    arrays: dict of element name to array, in the manifest's dtype.
    invalid_range: int64 array.
    episode_end_indices: int64 array or None.
    frames: the frames, with `read_rows(start, count)`.
  """

  def __init__(self, directory: str) -> None:
    """Reads and checks everything but the frames.

    Raises:
      CheckpointError: naming the damaged file.
    """
    manifest = manifest_lib.read_manifest(
      directory, manifest_lib.LEGACY_VERSIONS
    )
    self.manifest = manifest
    spec = manifest['observation']
    manifest_lib.verify_files(directory, manifest, skip={spec['file']})
    self.suffix = manifest['suffix']
    self.num_rows = manifest['num_rows']
    self.add_count = manifest['add_count']

    def load(name):
      return _load(os.path.join(directory, name))

    self.arrays = {}
    for name, entry in manifest['arrays'].items():
      array = load(entry['file'])
      if len(array) != self.num_rows:
        raise CheckpointError(
          os.path.join(directory, entry['file']),
          f'{len(array)} rows, manifest says {self.num_rows}',
        )
      self.arrays[name] = array.astype(entry['dtype'], copy=False)
    packed = PACKED_SUFFIX if manifest['version'] in PACKED_VERSIONS else ''
    self.invalid_range = load(INVALID_RANGE_FILE + packed).astype(np.int64)
    self.episode_end_indices = None
    if manifest['episode_end_indices']:
      self.episode_end_indices = load(manifest['episode_end_indices'])
    if manifest['version'] >= SIZES_VERSION:
      sizes = load(SIZES_FILE + packed)
      offsets = np.zeros(len(sizes) + 1, np.int64)
      np.cumsum(sizes, out=offsets[1:])
    else:
      offsets = load(OFFSETS_FILE)
    self.frames = _Frames(directory, manifest, offsets, load(CRC_FILE))

  def close(self) -> None:
    self.frames.close()


class _Frames:
  """The frames of a format 1-5 checkpoint, decoded a unit (block) at a time."""

  def __init__(self, directory, manifest, offsets, crcs):
    spec = manifest['observation']
    self.path = os.path.join(directory, spec['file'])
    self.row_shape = tuple(spec['row_shape'])
    self.dtype = np.dtype(spec['dtype'])
    self._suffix = manifest['suffix']
    self._num_rows = manifest['num_rows']
    self._block_rows = spec['block_rows']
    self._frame_bytes = npy_stream.row_bytes(self.row_shape, self.dtype)
    units = spec['num_blocks']
    size = os.path.getsize(self.path)
    if len(offsets) != units + 1 or len(crcs) != units:
      problem = f'{len(offsets) - 1} units indexed and {len(crcs)} CRC-32s'
      raise CheckpointError(
        os.path.join(directory, CRC_FILE),
        f'{problem}, manifest says {units}',
      )
    if offsets[0] or (np.diff(offsets) < 0).any() or offsets[-1] != size:
      raise CheckpointError(self.path, f'its index does not span {size} bytes')
    self._offsets, self._crcs = offsets.tolist(), crcs.tolist()
    self._prefix = b''  # Whole zstd frames (version 2).
    if manifest['version'] >= SIZES_VERSION:
      self._prefix = unit_decoding.ZSTD_MAGIC.to_bytes(4, 'little') + spec[
        'unit_header'
      ].to_bytes(2, 'little')
    self._decompress = self._blosc2
    if manifest['version'] != BLOCKS_VERSION:
      self._zstd = zstandard.ZstdDecompressor(
        dict_data=_dictionary(directory, manifest)
      )
      self._decompress = self._unit
    self._stream = open(self.path, 'rb')

  def _blosc2(self, data, size):
    import blosc2  # Only version 1 needs it.

    decoded = blosc2.get_cbuffer_sizes(data)[0]
    if decoded != size:
      raise ValueError(f'decodes to {decoded} bytes, not {size}')
    out = np.empty(size, np.uint8)
    blosc2.decompress2(data, dst=out, nthreads=1)
    return out

  def _unit(self, data, size):
    return self._zstd.decompress(self._prefix + data, max_output_size=size)

  def _block(self, block):
    """The frames of unit (block) `block`, checked against its CRC-32."""
    first = block * self._block_rows
    rows = min(self._block_rows, self._num_rows - first)
    where = f'checkpoint {self._suffix}: unit {block} (rows {first}-'
    where += f'{first + rows - 1}) is damaged'
    start, end = self._offsets[block], self._offsets[block + 1]
    self._stream.seek(start)
    data = self._stream.read(end - start)
    actual = manifest_lib.crc32(data)
    if actual != self._crcs[block]:
      expected = f'{self._crcs[block]:#010x}'
      raise CheckpointError(
        self.path, f'{where}: CRC-32 {actual:#010x}, expected {expected}'
      )
    size = rows * self._frame_bytes
    try:
      frames = self._decompress(data, size)
    except (zstandard.ZstdError, RuntimeError, ValueError) as error:
      raise CheckpointError(self.path, f'{where}: {error}') from error
    if len(frames) != size:
      raise CheckpointError(
        self.path, f'{where}: decodes to {len(frames)} bytes, not {size}'
      )
    return np.frombuffer(frames, self.dtype).reshape((rows,) + self.row_shape)

  def read_rows(self, start: int, count: int) -> np.ndarray:
    """Frames [start, start + count), decoded from their units."""
    first = start // self._block_rows
    last = (start + count - 1) // self._block_rows
    frames = np.concatenate([self._block(b) for b in range(first, last + 1)])
    skip = start - first * self._block_rows
    return frames[skip : skip + count]

  def close(self) -> None:
    self._stream.close()


def _dictionary(directory, manifest):
  """The zstd dictionary a checkpoint's units were compressed against."""
  spec = manifest['observation']
  if manifest['version'] >= RUN_DICTIONARY_VERSION:
    path = run_dictionary.checkpoint_path(directory)
    manifest_lib.check_file(path, spec['run_dictionary'], f'{directory}: ')
  elif spec.get('dictionary'):
    path = os.path.join(directory, spec['dictionary'])  # Checked with the rest.
  else:
    return None
  data = _read(path)
  return zstandard.ZstdCompressionDict(data) if data else None
