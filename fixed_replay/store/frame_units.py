"""The frames of a stored checkpoint as zstd units with a trained dictionary.

Format version 2 of the compact store. A sampled transition uses five frames
(two overlapping stacks of four), so decoding whole blocks of 16 frames
threw most decoded bytes away. Here `observation.units` holds `block_rows`
frames per unit (1 by default), each unit one zstd frame (no content
size, checksum or dictionary id: those bytes repeat in every unit) compressed
against a dictionary trained on the checkpoint's own frames
(`observation.dict`). The dictionary is what keeps single frames small:
Atari screens share their background, score digits and sprites.
`observation_offsets.npy` and `observation_crc32.npy` index and check the
units, and every unit is checked against its CRC-32 before it is decoded.

A batch reads the units it needs with one `pread` per run of consecutive
units, then checks and decodes each (zstd drops the GIL while decoding).
"""

import os
import threading

import numpy as np
import zstandard

from fixed_replay.errors import CheckpointError
from fixed_replay.store import frame_blocks
from fixed_replay.store import manifest as manifest_lib

LAYOUT = 'units'
# Trained-dictionary size. On 100k-row checkpoints of random MsPacman and
# Asterix, one frame a unit, zstd 15 (benchmarks/busy_store_benchmark.py,
# 2026-12-01): 112 KB stored 1.17x / 1.40x the bytes of Dopamine's gzip,
# 1 MB 1.19x / 1.08x (all files). zstd returns a smaller dictionary where
# the frames hold less to learn (163 KB on MsPacman).
DICTIONARY_BYTES = 1 << 20
# zstd's k and d for the dictionary: what its own parameter search chose on
# MsPacman and Seaquest. Fixed, training takes ~0.15 s a checkpoint instead
# of ~8 s, for the same size.
_TRAINING_K, _TRAINING_D = 1826, 8
# Frames the dictionary is trained on (spread over the first slice).
TRAINING_FRAMES = 4000
# Magicless frames would save 4 bytes a unit, but zstd's tools (and its
# batch decoder) then no longer recognise the units.
_FORMAT = zstandard.FORMAT_ZSTD1


def zstd_level(clevel):
  """The zstd level of a store's clevel (0-9): 3 x clevel, at most 19.

  The default clevel 5 is zstd 15. With the 1 MB dictionary, measured
  2026-12-01 (benchmarks/busy_store_benchmark.py, random MsPacman and
  Asterix): zstd 9 stores 1.28x / 1.07x gzip's bytes converting ~22,000
  frames per CPU-second, zstd 15 1.19x / 1.08x at 16,000-19,000. Conversion
  runs once per dataset, sampling every step of every experiment; decoding
  takes 1.4-2.6 us a frame at every level.
  """
  return min(max(1, 3 * clevel), 19)


def train_dictionary(frames, dictionary_bytes=DICTIONARY_BYTES):
  """A zstd dictionary trained on some of a checkpoint's frames.

  Args:
    frames: array (n, *row_shape), frames spread over the checkpoint.
    dictionary_bytes: int, the dictionary's size.

  Returns:
    bytes, empty when the frames are too few (or too alike) to train on:
    units are then compressed without a dictionary.
  """
  step = max(1, len(frames) // TRAINING_FRAMES)
  samples = [np.ascontiguousarray(f).tobytes() for f in frames[::step]]
  if len(samples) < 8:
    return b''
  # zstd refuses (or shrinks) a dictionary much larger than its samples.
  dictionary_bytes = min(dictionary_bytes, sum(map(len, samples)) // 16)
  try:
    trained = zstandard.train_dictionary(
      dictionary_bytes, samples, k=_TRAINING_K, d=_TRAINING_D, threads=1
    )
  except zstandard.ZstdError:
    return b''  # zstd refuses samples that are too few or too small.
  return trained.as_bytes()


def _dictionary(data, for_compression=False, level=None):
  if not data:
    return None
  dictionary = zstandard.ZstdCompressionDict(data)
  if for_compression:
    dictionary.precompute_compress(level=level)
  return dictionary


class UnitCompressor:
  """Compresses units against one dictionary; one per thread."""

  def __init__(self, dictionary, level):
    params = zstandard.ZstdCompressionParameters.from_level(
      level,
      format=_FORMAT,
      write_content_size=False,
      write_checksum=False,
      write_dict_id=False,
    )
    self._compressor = zstandard.ZstdCompressor(
      dict_data=_dictionary(dictionary, True, level),
      compression_params=params,
    )

  def compress(self, frames):
    """The unit (bytes) of C-contiguous frames."""
    return self._compressor.compress(np.ascontiguousarray(frames))


class StoredUnits(frame_blocks.StoredFrameFile):
  """The compressed frames of one stored checkpoint, decoded per unit.

  Thread-safe: reads use `os.pread` on one descriptor, each thread decodes
  with its own zstd context.
  """

  UNIT = 'unit'

  def __init__(self, directory, manifest):
    """Opens the units and checks index and dictionary against the manifest.

    Raises:
      CheckpointError: if the index or the dictionary is damaged.
    """
    super().__init__(directory, manifest)
    spec = manifest['observation']
    self.frame_bytes = int(np.prod(self.row_shape, dtype=np.int64)) * (
      self.dtype.itemsize
    )
    files = manifest['files']
    # The index and dictionary are small and read whole: check them always,
    # so a damaged one is found before anything is decoded with it.
    self.offsets = self._load_checked(manifest_lib.OFFSETS_FILE, files, np.load)
    self.crcs = self._load_checked(manifest_lib.CRC_FILE, files, np.load)
    dictionary = b''
    if spec.get('dictionary'):
      dictionary = self._load_checked(
        spec['dictionary'], files, lambda path: open(path, 'rb').read()
      )
    self._check_index(self.offsets, self.crcs)
    self.offsets = self.offsets.astype(np.int64)
    self._lengths = np.diff(self.offsets)
    if self._lengths.size and self._lengths.min() < 0:
      raise CheckpointError(
        os.path.join(directory, manifest_lib.OFFSETS_FILE),
        'unit offsets decrease',
      )
    self._dictionary = _dictionary(dictionary)
    self._dictionary_bytes = len(dictionary)
    self._local = threading.local()
    self._open()

  def _load_checked(self, name, files, load):
    path = os.path.join(self.directory, name)
    expected = files.get(name)
    if expected is None:
      raise CheckpointError(path, 'not listed in the manifest')
    try:
      actual = manifest_lib.file_entry(path)
    except FileNotFoundError as error:
      raise CheckpointError(path, 'missing from the stored checkpoint') from (
        error
      )
    if actual != expected:
      raise CheckpointError(
        path,
        f'checkpoint {self.suffix}: damaged: {actual["bytes"]} bytes with '
        f'CRC-32 {actual["crc32"]:#010x}, manifest says '
        f'{expected["bytes"]} bytes with {expected["crc32"]:#010x}',
      )
    try:
      return load(path)
    except (OSError, ValueError) as error:
      raise CheckpointError(path, f'unreadable: {error}') from error

  @property
  def nbytes(self):
    """Bytes held in memory: the unit index and the dictionary."""
    return self.offsets.nbytes + self.crcs.nbytes + self._dictionary_bytes

  def _decompressor(self):
    decompressor = getattr(self._local, 'decompressor', None)
    if decompressor is None:
      decompressor = zstandard.ZstdDecompressor(
        dict_data=self._dictionary, format=_FORMAT
      )
      self._local.decompressor = decompressor
    return decompressor

  def _read_units(self, units):
    """The bytes of sorted distinct `units`, and where each one starts.

    Runs of consecutive units are read with one `pread` each.
    """
    starts = self.offsets[units]
    lengths = self._lengths[units]
    # A run breaks where the next unit is not the next in the file.
    breaks = np.flatnonzero(np.diff(units) != 1) + 1
    run_first = np.concatenate([[0], breaks])
    run_last = np.concatenate([breaks, [len(units)]]) - 1
    pieces = []
    for first, last in zip(run_first.tolist(), run_last.tolist(), strict=True):
      start = int(starts[first])
      size = int(starts[last] + lengths[last]) - start
      data = os.pread(self._fd, size, start)
      if len(data) != size:
        end = start + len(data)
        late = int(np.searchsorted(self.offsets, end, side='right')) - 1
        raise self._damaged(
          min(max(late, int(units[first])), int(units[last])),
          f'file ends at byte {end}',
        )
      pieces.append(data)
    data = b''.join(pieces) if len(pieces) > 1 else pieces[0]
    return data, np.cumsum(lengths) - lengths, lengths

  def _decode(self, units, out):
    """Decodes sorted distinct `units` into `out` (frames end to end).

    Each unit's CRC-32 is checked before it is decoded. One zstd call per
    unit: zstd's own batch call re-reads the dictionary for every frame and
    is slower on units this small.
    """
    data, positions, lengths = self._read_units(units)
    view = memoryview(data)
    target = memoryview(out.reshape(-1).view(np.uint8))
    decompress = self._decompressor().decompress
    crc32 = manifest_lib.crc32
    expected = self.crcs[units].tolist()
    unit_bytes = self.block_rows * self.frame_bytes
    last_bytes = (
      self.num_rows - (self.num_blocks - 1) * self.block_rows
    ) * self.frame_bytes
    last_unit = self.num_blocks - 1
    at = 0
    for unit, position, length, crc in zip(
      units.tolist(),
      positions.tolist(),
      lengths.tolist(),
      expected,
      strict=True,
    ):
      unit_data = view[position : position + length]
      actual = crc32(unit_data)
      if actual != crc:
        raise self._damaged(
          unit, f'CRC-32 {actual:#010x}, expected {crc:#010x}'
        )
      size = last_bytes if unit == last_unit else unit_bytes
      try:
        decoded = decompress(unit_data, max_output_size=size)
      except zstandard.ZstdError as error:
        raise self._damaged(unit, f'zstd cannot decode it: {error}') from error
      if len(decoded) != size:
        raise self._damaged(
          unit, f'decodes to {len(decoded)} bytes, not {size}'
        )
      target[at : at + size] = decoded
      at += size
    return at // self.frame_bytes

  def _checked_unit(self, unit, data, crc):
    actual = manifest_lib.raw_crc32(data)
    if actual != crc:
      raise self._damaged(unit, f'CRC-32 {actual:#010x}, expected {crc:#010x}')

  def read_block(self, block, out):
    """Decodes unit `block` into `out[:rows]`; returns the number of rows.

    Raises:
      CheckpointError: naming checkpoint, unit and rows when the unit's
        bytes do not match their checksum or do not decode.
    """
    return self._decode(np.array([block], dtype=np.int64), out)

  def read_frames(self, rows, out=None):
    """The frames at sorted distinct file `rows`, (len(rows), *row_shape).

    Decodes only the units holding them (for one-frame units: exactly
    those frames), into `out` when given.
    """
    rows = np.asarray(rows, dtype=np.int64)
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


def read_frames_of(sources, which, rows, out):
  """Decodes frames of several checkpoints at once, into `out`.

  The batch-wide form of StoredUnits.read_frames, for one-frame units: the
  index look-ups are one numpy call per checkpoint, the reads one `pread`
  per run of consecutive frames, and the rest one loop over the frames.

  Args:
    sources: sequence of StoredUnits with block_rows == 1, alike frames.
    which: int64 array (n,), index in `sources` of each frame, sorted.
    rows: int64 array (n,), file rows, increasing within each source.
    out: C-contiguous array (n, *row_shape) of the frames' dtype.

  Raises:
    CheckpointError: naming checkpoint, unit and rows of a unit whose bytes
      do not match their CRC-32 or do not decode.
  """
  count = len(rows)
  if not count:
    return
  starts = np.empty(count, np.int64)
  lengths = np.empty(count, np.int64)
  crcs = np.empty(count, np.int64)
  bounds = np.flatnonzero(which[1:] != which[:-1]) + 1
  group_first = np.concatenate([[0], bounds]).tolist()
  group_end = np.concatenate([bounds, [count]]).tolist()
  for first, end in zip(group_first, group_end, strict=True):
    source = sources[int(which[first])]
    part = rows[first:end]
    starts[first:end] = source.offsets[part]
    lengths[first:end] = source._lengths[part]
    crcs[first:end] = source.crcs[part]
  # A run of consecutive frames of one checkpoint is one read.
  new_run = np.ones(count, dtype=bool)
  new_run[1:] = (which[1:] != which[:-1]) | (rows[1:] != rows[:-1] + 1)
  run_first = np.flatnonzero(new_run)
  run_last = np.append(run_first[1:], count) - 1
  run_start = starts[run_first]
  run_size = starts[run_last] + lengths[run_last] - run_start
  pieces = []
  for first, last, start, size in zip(
    run_first.tolist(),
    run_last.tolist(),
    run_start.tolist(),
    run_size.tolist(),
    strict=True,
  ):
    source = sources[int(which[first])]
    data = os.pread(source._fd, size, start)
    if len(data) != size:
      source._read_units(rows[first : last + 1])  # Raises, naming the unit.
    pieces.append(data)
  view = memoryview(b''.join(pieces))
  positions = (np.cumsum(lengths) - lengths).tolist()
  lengths = lengths.tolist()
  crcs = crcs.tolist()
  target = memoryview(out.reshape(-1).view(np.uint8))
  crc32 = manifest_lib.raw_crc32
  for first, end in zip(group_first, group_end, strict=True):
    source = sources[int(which[first])]
    decompress = source._decompressor().decompress
    size = source.frame_bytes
    for k in range(first, end):
      position = positions[k]
      data = view[position : position + lengths[k]]
      if crc32(data) != crcs[k]:
        source._checked_unit(int(rows[k]), data, crcs[k])
      try:
        target[k * size : k * size + size] = decompress(
          data, max_output_size=size
        )
      except ValueError:  # Decoded to another size than a frame's.
        decoded = decompress(data, max_output_size=size)
        raise source._damaged(
          int(rows[k]), f'decodes to {len(decoded)} bytes, not {size}'
        ) from None
      except zstandard.ZstdError as error:
        raise source._damaged(
          int(rows[k]), f'zstd cannot decode it: {error}'
        ) from error
