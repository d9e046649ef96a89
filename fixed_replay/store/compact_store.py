"""The compact store: replay checkpoints as independently decodable blocks.

`fixed-replay convert` (see convert.py) writes one directory per run:

  STORE/
    checkpoint_<suffix>/        one per converted checkpoint, complete only
      manifest.json             what the directory holds; written last
      observation.blocks        the frames, `block_rows` rows per block, each
                                block one self-contained blosc2 chunk
      observation_offsets.npy   int64 (num_blocks + 1,): byte offset of each
                                block in observation.blocks, then the size
      observation_crc32.npy     uint32 (num_blocks,): CRC-32 of each block
      action.npy, reward.npy, terminal.npy, <extra element>.npy
                                the other `$store$_` arrays, plain .npy
      invalid_range.npy         as in the checkpoint
      episode_end_indices.npy   sorted int64 rows, when the checkpoint had it
      valid_mask.npy            one bit per file row (np.packbits, little
                                bit order): may Dopamine sample it, for the
                                manifest's stack_size and update_horizon
    .checkpoint_<suffix>.partial-<pid>/   being written: never read

A checkpoint directory only ever appears by renaming a verified partial one,
so its presence means it is complete. The manifest records the format and
version, the codec, the block size, the rows, the source files and the size
and CRC-32 of every file, and the CRC-32 of its own content
(`manifest_crc32`), so a store describes and checks itself.

Reading a row decodes only its block: a frame costs a `pread` of a few KB, a
CRC-32 and a zstd decompression, all outside the GIL.
"""

import dataclasses
import json
import os
import re

import blosc2
import numpy as np

from fixed_replay.dataset import checkpoints
from fixed_replay.errors import CheckpointError
from fixed_replay.io import gzip_stream

FORMAT = 'fixed_replay.store.compact_store'
VERSION = 1
MANIFEST = 'manifest.json'
BLOCKS_FILE = 'observation.blocks'
OFFSETS_FILE = 'observation_offsets.npy'
CRC_FILE = 'observation_crc32.npy'
VALID_MASK_FILE = 'valid_mask.npy'
INVALID_RANGE_FILE = 'invalid_range.npy'
EPISODE_ENDS_FILE = 'episode_end_indices.npy'
CODECS = {
  'zstd': blosc2.Codec.ZSTD,
  'lz4': blosc2.Codec.LZ4,
  'lz4hc': blosc2.Codec.LZ4HC,
  'zlib': blosc2.Codec.ZLIB,
  'blosclz': blosc2.Codec.BLOSCLZ,
}
_CHECKPOINT_DIR = re.compile(r'^checkpoint_(?P<suffix>\d+)$')
_PARTIAL_DIR = re.compile(r'^\.checkpoint_\d+\.partial-\d+$')
_VERIFY_READ_BYTES = 16 << 20
MANIFEST_CRC_KEY = 'manifest_crc32'
# Entries every manifest has, and their types (checked before any is used).
_MANIFEST_FIELDS = {
  'suffix': int,
  'num_rows': int,
  'add_count': int,
  'observation': dict,
  'arrays': dict,
  'valid_rows': dict,
  'files': dict,
  'source': dict,
}
_OBSERVATION_FIELDS = {
  'file': str,
  'dtype': str,
  'row_shape': list,
  'codec': str,
  'clevel': int,
  'block_rows': int,
  'num_blocks': int,
  'frames_crc32': int,
}

# Decoding runs in background threads next to training: let blosc2 drop the
# GIL while it (de)compresses. Process-wide, and harmless to other users.
blosc2.set_releasegil(True)


# The fastest CRC-32 at hand (isal's is ~10x zlib's); all compute zlib's.
_crc32 = gzip_stream.BACKENDS[gzip_stream.DEFAULT_BACKEND].crc32


def crc32(data, value=0):
  """CRC-32 of a buffer (zlib's polynomial), optionally continuing `value`."""
  return _crc32(memoryview(data).cast('B'), value)


def checkpoint_dirname(suffix):
  return f'checkpoint_{suffix}'


def partial_dirname(suffix):
  """Where checkpoint `suffix` is written before it is complete."""
  return f'.checkpoint_{suffix}.partial-{os.getpid()}'


def is_partial_dirname(name):
  return bool(_PARTIAL_DIR.match(name))


def block_cparams(codec, clevel, block_rows, row_shape, dtype):
  """blosc2 compression parameters of one block of frames.

  One internal blosc2 block per chunk: a block of frames is compressed as a
  whole (far better ratios than blosc2's default split) and decoded whole.
  Multi-byte observations are byte-shuffled first.
  """
  dtype = np.dtype(dtype)
  if codec not in CODECS:
    raise ValueError(f'codec {codec!r} is not one of {sorted(CODECS)}')
  return {
    'codec': CODECS[codec],
    'clevel': int(clevel),
    'typesize': dtype.itemsize,
    'filters': [
      blosc2.Filter.SHUFFLE if dtype.itemsize > 1 else blosc2.Filter.NOFILTER
    ],
    'nthreads': 1,
    'blocksize': int(block_rows * np.prod(row_shape, dtype=np.int64))
    * dtype.itemsize,
  }


def compress_block(frames, cparams):
  """Returns the blosc2 chunk (bytes) of a C-contiguous block of frames."""
  return blosc2.compress2(np.ascontiguousarray(frames), **cparams)


def file_entry(path):
  """{'bytes', 'crc32'} of a file, read in chunks."""
  value, size = 0, 0
  with open(path, 'rb') as stream:
    while chunk := stream.read(_VERIFY_READ_BYTES):
      value = crc32(chunk, value)
      size += len(chunk)
  return {'bytes': size, 'crc32': value}


def pack_valid_rows(rows, num_rows):
  """Packs sorted valid file rows into one bit per row (little bit order)."""
  mask = np.zeros(num_rows, dtype=bool)
  mask[rows] = True
  return np.packbits(mask, bitorder='little')


def unpack_valid_rows(packed, num_rows):
  """Inverse of pack_valid_rows: sorted int32 file rows."""
  mask = np.unpackbits(packed, count=num_rows, bitorder='little')
  return np.flatnonzero(mask).astype(np.int32)


def _manifest_text(manifest):
  """The canonical JSON of a manifest (what write_manifest writes)."""
  return json.dumps(manifest, indent=1, sort_keys=True)


def _check_fields(path, entries, fields, where):
  for key, kind in fields.items():
    value = entries.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
      raise CheckpointError(
        path, f'damaged manifest: {where}{key} is {value!r:.40}'
      )


def _check_manifest(path, manifest):
  """Checks the manifest's own CRC-32 and the types of its entries."""
  if not isinstance(manifest, dict):
    raise CheckpointError(path, 'damaged manifest: not a JSON object')
  if MANIFEST_CRC_KEY in manifest:  # Stores written before it lack it.
    expected = manifest.pop(MANIFEST_CRC_KEY)
    actual = crc32(_manifest_text(manifest).encode())
    if actual != expected:
      raise CheckpointError(
        path,
        f'damaged manifest: content has CRC-32 {actual:#010x}, its '
        f'{MANIFEST_CRC_KEY} says {expected!r:.20}',
      )
  _check_fields(path, manifest, _MANIFEST_FIELDS, '')
  _check_fields(
    path, manifest['observation'], _OBSERVATION_FIELDS, 'observation.'
  )


def read_manifest(directory):
  """Reads and checks the manifest of a stored checkpoint.

  Raises:
    CheckpointError: if it is missing, unreadable, damaged (its CRC-32) or
      of another format.
  """
  path = os.path.join(directory, MANIFEST)
  try:
    with open(path, 'rb') as stream:
      manifest = json.loads(stream.read().decode('utf8'))
  except FileNotFoundError as error:
    raise CheckpointError(
      path, 'missing: not a compact store checkpoint'
    ) from error
  except (OSError, ValueError) as error:
    raise CheckpointError(path, f'unreadable manifest: {error}') from error
  if not isinstance(manifest, dict) or manifest.get('format') != FORMAT:
    format_name = manifest.get('format') if isinstance(manifest, dict) else None
    raise CheckpointError(path, f'format is {format_name!r}')
  if manifest.get('version') != VERSION:
    raise CheckpointError(
      path,
      f'format version {manifest.get("version")}, this reader knows '
      f'{VERSION}',
    )
  _check_manifest(path, manifest)
  return manifest


def write_manifest(directory, manifest):
  """Writes manifest.json deterministically (sorted keys) and syncs it.

  The written manifest holds the CRC-32 of its canonical text without that
  entry, so any change to its content is found when it is read.
  """
  manifest = dict(manifest)
  manifest.pop(MANIFEST_CRC_KEY, None)
  manifest[MANIFEST_CRC_KEY] = crc32(_manifest_text(manifest).encode())
  path = os.path.join(directory, MANIFEST)
  with open(path, 'w') as stream:
    stream.write(_manifest_text(manifest))
    stream.write('\n')
    stream.flush()
    os.fsync(stream.fileno())


def find_stored_checkpoints(store_dir):
  """Returns {suffix: directory} of the complete checkpoints of a store.

  Raises:
    CheckpointError: if the directory does not exist or holds none.
  """
  store_dir = str(store_dir)
  if not os.path.isdir(store_dir):
    raise CheckpointError(store_dir, 'compact store directory does not exist')
  found = {}
  for name in os.listdir(store_dir):
    match = _CHECKPOINT_DIR.match(name)
    if match:
      found[int(match['suffix'])] = os.path.join(store_dir, name)
  if not found:
    hint = ''
    if checkpoints.scan_checkpoints(store_dir)[0]:
      hint = ' (it holds gzip checkpoints: convert them first)'
    raise CheckpointError(
      store_dir,
      'no compact store checkpoint (checkpoint_N/ directories, written by '
      f'`fixed-replay convert SRC DST`){hint}',
    )
  return dict(sorted(found.items()))


def verify_files(directory, manifest, skip=()):
  """Checks the size and CRC-32 of every file the manifest lists.

  Raises:
    CheckpointError: naming the first file that differs.
  """
  for name, expected in sorted(manifest['files'].items()):
    if name in skip:
      continue
    path = os.path.join(directory, name)
    if not os.path.exists(path):
      raise CheckpointError(path, 'missing from the stored checkpoint')
    actual = file_entry(path)
    if actual != expected:
      raise CheckpointError(
        path,
        f'damaged: {actual["bytes"]} bytes with CRC-32 '
        f'{actual["crc32"]:#010x}, manifest says {expected["bytes"]} bytes '
        f'with {expected["crc32"]:#010x}',
      )


class StoredFrames:
  """The compressed frames of one stored checkpoint, decoded per block.

  Thread-safe: reads use `os.pread` on one descriptor.
  """

  def __init__(self, directory, manifest):
    self.directory = directory
    self.suffix = manifest['suffix']
    spec = manifest['observation']
    self.path = os.path.join(directory, spec['file'])
    self.block_rows = spec['block_rows']
    self.num_rows = manifest['num_rows']
    self.row_shape = tuple(spec['row_shape'])
    self.dtype = np.dtype(spec['dtype'])
    self.num_blocks = spec['num_blocks']
    self.offsets = np.load(os.path.join(directory, OFFSETS_FILE))
    self.crcs = np.load(os.path.join(directory, CRC_FILE))
    if len(self.offsets) != self.num_blocks + 1 or len(self.crcs) != (
      self.num_blocks
    ):
      raise CheckpointError(
        directory,
        f'block index of {len(self.offsets) - 1} blocks and '
        f'{len(self.crcs)} checksums, manifest says {self.num_blocks}',
      )
    self._fd = os.open(self.path, os.O_RDONLY)

  @property
  def nbytes(self):
    """Bytes held in memory: the block index."""
    return self.offsets.nbytes + self.crcs.nbytes

  def block_rows_of(self, block):
    """File rows [first, end) held by `block`."""
    first = block * self.block_rows
    return first, min(first + self.block_rows, self.num_rows)

  def _damaged(self, block, problem):
    first, end = self.block_rows_of(block)
    return CheckpointError(
      self.path,
      f'checkpoint {self.suffix}: block {block} (rows {first}-{end - 1}) is '
      f'damaged: {problem}',
    )

  def read_block(self, block, out):
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
    expected = int(self.crcs[block])
    if _crc32(data) != expected:
      raise self._damaged(
        block, f'CRC-32 {_crc32(data):#010x}, expected {expected:#010x}'
      )
    rows = min(self.block_rows, self.num_rows - block * self.block_rows)
    try:
      blosc2.decompress2(data, dst=out[:rows], nthreads=1)
    except (RuntimeError, ValueError) as error:
      raise self._damaged(block, f'blosc2 cannot decode it: {error}') from error
    return rows

  def read_rows(self, start, count):
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

  def close(self):
    if self._fd is not None:
      os.close(self._fd)
      self._fd = None


class UnheldFrames:
  """Stands for a window's frames that stay compressed on disk.

  Sits in a CheckpointWindow's `store['observation']`, where only the length
  (rows of the window) is used; frames come from StoredFrames instead.
  """

  nbytes = 0

  def __init__(self, num_rows):
    self._num_rows = num_rows

  def __len__(self):
    return self._num_rows


class StoredCheckpoint:
  """One checkpoint of a compact store, opened for sampling.

  Attributes:
    directory: str.
    manifest: dict.
    suffix: int.
    num_rows: int, rows of the file (the writer's capacity).
    add_count: int.
    arrays: dict of element name to read-only memory-mapped array (all
      `$store$_` elements but observation).
    frames: StoredFrames.
    invalid_range: int64 array.
    episode_end_indices: int64 array or None.
  """

  def __init__(self, directory, verify=True):
    """Opens a stored checkpoint.

    Args:
      directory: str, a checkpoint_<suffix> directory.
      verify: bool, check every file but the frame blocks against the
        manifest's CRC-32 (blocks are checked as they are decoded).

    Raises:
      CheckpointError: on a bad manifest or a damaged file.
    """
    self.directory = str(directory)
    self.manifest = read_manifest(self.directory)
    if verify:
      verify_files(self.directory, self.manifest, skip=(BLOCKS_FILE,))
    manifest = self.manifest
    self.suffix = manifest['suffix']
    self.num_rows = manifest['num_rows']
    self.add_count = manifest['add_count']
    self.arrays = {
      name: np.load(os.path.join(self.directory, spec['file']), mmap_mode='r')
      for name, spec in manifest['arrays'].items()
    }
    for name, array in self.arrays.items():
      if len(array) != self.num_rows:
        raise CheckpointError(
          os.path.join(self.directory, manifest['arrays'][name]['file']),
          f'{len(array)} rows, manifest says {self.num_rows}',
        )
    self.invalid_range = np.load(
      os.path.join(self.directory, INVALID_RANGE_FILE)
    ).astype(np.int64)
    self.episode_end_indices = None
    if manifest['episode_end_indices']:
      self.episode_end_indices = np.load(
        os.path.join(self.directory, manifest['episode_end_indices'])
      )
    self.frames = StoredFrames(self.directory, manifest)

  def valid_rows_table(self, stack_size, update_horizon):
    """The precomputed valid rows of the whole file, or None.

    Returns:
      sorted int32 array of file rows when the table was computed for this
      stack_size and update_horizon, else None.
    """
    spec = self.manifest['valid_rows']
    if (spec['stack_size'], spec['update_horizon']) != (
      stack_size,
      update_horizon,
    ):
      return None
    packed = np.load(os.path.join(self.directory, spec['file']))
    return unpack_valid_rows(packed, self.num_rows)

  def _check_rows(self, start, count):
    if start < 0 or count <= 0 or start + count > self.num_rows:
      raise CheckpointError(
        self.directory,
        f'rows [{start}, {start + count}) asked, but checkpoint '
        f'{self.suffix} has {self.num_rows} rows',
      )

  def read_rows_into(self, name, start, out):
    """Reads rows [start, start + len(out)) of a small array into `out`.

    Plain file reads: unlike touching the memory map, they leave nothing
    mapped (and counted as resident) once done.
    """
    self._check_rows(start, len(out))
    array = self.arrays[name]
    if out.dtype != array.dtype or out.shape[1:] != array.shape[1:]:
      raise ValueError(
        f'{name}: rows of {array.dtype}{array.shape[1:]}, asked for '
        f'{out.dtype}{out.shape[1:]}'
      )
    if not out.flags.c_contiguous:
      raise ValueError(f'{name}: `out` must be C-contiguous')
    row_bytes = array.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))
    path = os.path.join(self.directory, self.manifest['arrays'][name]['file'])
    with open(path, 'rb') as stream:
      stream.seek(array.offset + start * row_bytes)
      view = memoryview(out.reshape(-1).view(np.uint8))
      if stream.readinto(view) != len(view):
        raise CheckpointError(path, f'ends before row {start + len(out)}')

  def window(self, start, count, arrays=None):
    """A CheckpointWindow of rows [start, start + count), frames not held.

    Args:
      start: int, first file row.
      count: int, rows.
      arrays: optional dict of element name to arrays already holding the
        window's rows; by default, slices of the memory maps.

    Returns:
      checkpoints.CheckpointWindow whose store['observation'] is UnheldFrames.
    """
    self._check_rows(start, count)
    if arrays is None:
      arrays = {
        name: array[start : start + count]
        for name, array in self.arrays.items()
      }
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

  def close(self):
    self.frames.close()


@dataclasses.dataclass(frozen=True)
class VerifiedCheckpoint:
  """What `verify_checkpoint` found: the manifest and the frames' CRC-32."""

  manifest: dict
  frames_crc32: int


def verify_checkpoint(directory, decode=False):
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
  manifest = read_manifest(directory)
  verify_files(directory, manifest)
  spec = manifest['observation']
  if not decode:
    return VerifiedCheckpoint(manifest, spec['frames_crc32'])
  frames = StoredFrames(directory, manifest)
  try:
    scratch = np.empty((frames.block_rows,) + frames.row_shape, frames.dtype)
    value = 0
    for block in range(frames.num_blocks):
      rows = frames.read_block(block, scratch)
      value = crc32(scratch[:rows], value)
  finally:
    frames.close()
  if value != spec['frames_crc32']:
    raise CheckpointError(
      frames.path,
      f'checkpoint {manifest["suffix"]}: decoded frames have CRC-32 '
      f'{value:#010x}, the source had {spec["frames_crc32"]:#010x}',
    )
  return VerifiedCheckpoint(manifest, value)
