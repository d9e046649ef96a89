"""Writes one checkpoint as the compact store's files, and checks them.

`CompactOutput` is the output convert.py uses by default (the other is
dopamine_output.py): it streams a source's frames in slices into zstd units
against the run's dictionary (dictionary_preparation.py), bounded
memory, the units compressed by a few threads; it writes the other arrays and
the valid rows as one file of tables (checkpoint_tables.py) and a manifest with
checksums, in the newest format version (older ones are read, not written),
into a partial directory, then reads all of it back against the source before
the commit. `check_existing` decides whether
a stored checkpoint may be skipped. The layout is compact_store.py's.
"""

import concurrent.futures
import itertools
import os
import shutil
import threading
from typing import Any

import numpy as np
import numpy.typing as npt
import zstandard

from fixed_replay.convert import convert_options
from fixed_replay.convert import destination
from fixed_replay.convert import dictionary_preparation
from fixed_replay.convert import unit_compression
from fixed_replay.convert import workers as worker_processes
from fixed_replay.convert.checkpoint_source import CheckpointSource
from fixed_replay.convert.convert_options import ConvertOptions
from fixed_replay.errors import CheckpointError
from fixed_replay.io import npy_stream
from fixed_replay.sources.dopamine import validity
from fixed_replay.store import checkpoint_tables
from fixed_replay.store import compact_store
from fixed_replay.store import frame_units
from fixed_replay.store import manifest as manifest_lib
from fixed_replay.store import run_dictionary

# What `narrowest` tries, narrowest first.
_NARROW_DTYPES = tuple(map(np.dtype, ('u1', 'i1', 'u2', 'i2', 'u4', 'i4')))


def narrowest(array: np.ndarray) -> np.ndarray:
  """`array` in the narrowest integer dtype that gives back its bytes.

  The store keeps its per-row arrays so: Dopamine's int32 actions and
  float32 Atari rewards (whole points) take a byte or two a row, and read
  back as the manifest's dtype bit for bit (a -0.0 or a fraction keeps
  float32). An array no narrower dtype holds is returned as it is.
  """
  for dtype in _NARROW_DTYPES:
    if dtype.itemsize >= array.dtype.itemsize:
      break
    if not np.can_cast(dtype, array.dtype):  # Wraps back: uint16 as int8.
      continue
    with np.errstate(invalid='ignore', over='ignore'):  # Checked below.
      narrow = array.astype(dtype)
      if narrow.astype(array.dtype).tobytes() == array.tobytes():
        return narrow
  return array


def _stored_options(manifest):
  """ConvertOptions.stored() of what a checkpoint was written with."""
  spec = manifest['observation']
  return {
    'block_rows': spec['block_rows'],
    'clevel': spec['clevel'],
    'stack_size': manifest['valid_rows']['stack_size'],
    'update_horizon': manifest['valid_rows']['update_horizon'],
    'version': manifest['version'],
  }


def check_existing(
  directory: str, source: CheckpointSource, options: ConvertOptions
) -> dict:
  """Verifies an already converted checkpoint before it is skipped.

  Args:
    directory: str, the stored checkpoint.
    source: a source (checkpoint_source.py).
    options: ConvertOptions.

  Raises:
    CheckpointError: if it is damaged, was converted from other files or with
      other options.
  """
  manifest = compact_store.verify_checkpoint(directory).manifest
  convert_options.check_same_conversion(
    directory,
    source,
    manifest['source'],
    _stored_options(manifest),
    options.stored(),
  )
  return manifest


def slice_rows(
  row_shape: tuple[int, ...], dtype: npt.DTypeLike, options: ConvertOptions
) -> int:
  """Frames read per slice: slice_bytes worth, whole blocks."""
  block_rows = options.block_rows
  row_bytes = npy_stream.row_bytes(row_shape, dtype)
  rows = max(1, options.slice_bytes // max(row_bytes, 1))
  return max(block_rows, rows // block_rows * block_rows)


def _compress_slices(slices, out, compress_one, options, threads):
  """Compresses frames, slice by slice, into `out`.

  Args:
    slices: iterable of frame arrays.
    out: binary file.
    compress_one: function(frames) -> bytes, safe to call from `threads`
      threads at once.
    options: ConvertOptions.
    threads: int.

  Returns:
    (offsets, crcs, frames_crc, blocks_crc, num_rows): block offsets in
    `out` (one more than blocks), each block's CRC-32, the CRC-32 of all the
    frames and of all the blocks, and the number of frames.
  """
  block_rows = options.block_rows
  # A few tasks per thread and slice: one per 16-frame block cost more in
  # futures than the blocks' compression on one core.
  compress = lambda group: [compress_one(block) for block in group]
  offsets, crcs = [0], []
  frames_crc, blocks_crc, num_rows = 0, 0, 0
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    for part in slices:
      num_rows += len(part)
      frames_crc = manifest_lib.crc32(part, frames_crc)
      blocks = [
        part[i : i + block_rows] for i in range(0, len(part), block_rows)
      ]
      step = max(1, -(-len(blocks) // (4 * threads)))
      groups = [blocks[i : i + step] for i in range(0, len(blocks), step)]
      for chunk in itertools.chain.from_iterable(pool.map(compress, groups)):
        out.write(chunk)
        offsets.append(offsets[-1] + len(chunk))
        crcs.append(manifest_lib.crc32(chunk))
        blocks_crc = manifest_lib.crc32(chunk, blocks_crc)
      worker_processes.count_progress(len(part))
  return offsets, crcs, frames_crc, blocks_crc, num_rows


def _unit_compressor(dictionary: bytes, level: int):
  """function(frames) -> unit, callable from any thread."""
  local = threading.local()

  def compress(frames):
    # zstd contexts are not thread-safe: one per thread.
    compressor = getattr(local, 'compressor', None)
    if compressor is None:
      compressor = local.compressor = unit_compression.UnitCompressor(
        dictionary, level
      )
    return compressor.compress(frames)

  return compress


def _write_frames(reader, directory: str, options, threads):
  """Streams a source's frames into units; returns the manifest entry."""
  slices = reader.frame_slices(
    slice_rows(reader.row_shape, reader.dtype, options)
  )
  path = run_dictionary.checkpoint_path(directory)  # Written first.
  try:
    with open(path, 'rb') as stream:
      dictionary = stream.read()
  except FileNotFoundError as error:
    raise CheckpointError(path, "missing: the run's dictionary") from error
  level = unit_compression.zstd_level(options.clevel)
  spec = {
    'run_dictionary': {
      'bytes': len(dictionary),
      'crc32': manifest_lib.crc32(dictionary),
    },
    'unit_header': unit_compression.UnitCompressor(dictionary, level).header,
  }
  name = manifest_lib.UNITS_FILE
  with destination.synced_file(directory, name) as out:
    offsets, crcs, frames_crc, blocks_crc, num_rows = _compress_slices(
      slices,
      out,
      _unit_compressor(dictionary, level),
      options,
      threads,
    )
  # Sizes, a byte or two each, and every ANCHOR_UNITS-th unit's offset: a
  # reader maps both and adds up at most ANCHOR_UNITS - 1 sizes a unit.
  offsets = np.array(offsets, np.int64)
  unit_tables = {
    checkpoint_tables.UNIT_SIZES: narrowest(np.diff(offsets)),
    checkpoint_tables.UNIT_ANCHORS: offsets[
      : len(crcs) : manifest_lib.ANCHOR_UNITS
    ],
    checkpoint_tables.UNIT_CRC32: np.array(crcs, dtype=np.uint32),
  }
  spec.update(
    file=name,
    dtype=np.dtype(reader.dtype).str,
    row_shape=list(reader.row_shape),
    codec='zstd',
    clevel=options.clevel,
    block_rows=options.block_rows,
    anchor_units=manifest_lib.ANCHOR_UNITS,
    num_blocks=len(crcs),
    frames_crc32=frames_crc,
    layout=frame_units.LAYOUT,
    library=f'zstandard {zstandard.__version__}',
  )
  units_entry = {name: {'bytes': int(offsets[-1]), 'crc32': blocks_crc}}
  return num_rows, spec, units_entry, unit_tables


def _keep_units(reader, directory: str, options):
  """Copies a stored source's units as they are, where encoding them would
  write the same bytes (reader.keep_units: the same encoding, block_rows,
  clevel and run dictionary, which dictionary_preparation.py keeps from
  the source store). Returns what _write_frames does, or None: encode."""
  keep = getattr(reader, 'keep_units', None)  # Stored sources only.
  dictionary = run_dictionary.checkpoint_path(directory)
  kept = (
    keep
    and os.path.exists(dictionary)
    and keep(
      options.block_rows, options.clevel, manifest_lib.file_entry(dictionary)
    )
  )
  if not kept:
    return None
  units, unit_tables, spec, num_rows = kept
  name = manifest_lib.UNITS_FILE
  with open(units, 'rb') as source:
    with destination.synced_file(directory, name) as out:
      shutil.copyfileobj(source, out, 16 << 20)
  worker_processes.count_progress(num_rows)
  entry = manifest_lib.file_entry(os.path.join(directory, name))
  return num_rows, dict(spec, file=name), {name: entry}, unit_tables


def _write_checkpoint(source, directory: str, options, threads):
  """Writes every file of one checkpoint into `directory`; returns manifest."""
  with source.open(threads) as reader:
    written = _keep_units(reader, directory, options) or _write_frames(
      reader, directory, options, threads
    )
    num_rows, frames_spec, units_entry, unit_tables = written
    meta = reader.finish(num_rows)
  arrays = meta.arrays
  clash = set(arrays) & set(checkpoint_tables.RESERVED)
  if clash:
    raise CheckpointError(
      directory, f'an element named {sorted(clash)[0]}: a name the store uses'
    )
  if num_rows >= 2**31:
    raise CheckpointError(directory, f'{num_rows} rows: too many')
  valid = validity.valid_rows(
    arrays['terminal'],
    0,
    num_rows,
    meta.add_count,
    meta.invalid_range,
    meta.episode_end_indices,
    options.stack_size,
    options.update_horizon,
  ).astype(np.int32)
  tables = {name: narrowest(array) for name, array in arrays.items()}
  tables[checkpoint_tables.VALID_MASK] = compact_store.pack_valid_rows(
    valid, num_rows
  )
  tables.update(unit_tables)
  tables[checkpoint_tables.INVALID_RANGE] = np.asarray(meta.invalid_range)
  if meta.episode_end_indices is not None:
    tables[checkpoint_tables.EPISODE_ENDS] = np.asarray(
      meta.episode_end_indices
    )
  data, tables_spec = checkpoint_tables.pack(tables)
  destination.write_bytes(directory, tables_spec['file'], data)
  files = dict(units_entry)
  files[tables_spec['file']] = {
    'bytes': len(data),
    'crc32': manifest_lib.crc32(data),
  }
  manifest = {
    'format': manifest_lib.FORMAT,
    'version': manifest_lib.VERSION,
    'suffix': source.suffix,
    'num_rows': num_rows,
    'add_count': meta.add_count,
    'source': meta.description,
    'observation': frames_spec,
    'arrays': {
      name: {'dtype': array.dtype.str, 'row_shape': list(array.shape[1:])}
      for name, array in arrays.items()
    },
    'tables': tables_spec,
    'valid_rows': {
      'stack_size': options.stack_size,
      'update_horizon': options.update_horizon,
      'count': len(valid),
    },
    'files': files,
  }
  if options.game:
    manifest[manifest_lib.GAME_KEY] = options.game
  manifest_lib.write_manifest(directory, manifest)
  return manifest, arrays, valid


def _verify_written(directory: str, arrays, valid):
  """Reads a freshly written checkpoint back; raises on any difference."""
  compact_store.verify_checkpoint(directory, decode=True)
  opened = compact_store.StoredCheckpoint(directory)
  try:
    for name, array in arrays.items():
      # Bytes, not values: NaN rewards must round-trip too.
      if opened.arrays[name].tobytes() != array.tobytes():
        raise CheckpointError(directory, f'{name} differs from the source')
    spec = opened.manifest['valid_rows']
    table = opened.valid_rows_table(spec['stack_size'], spec['update_horizon'])
    if not np.array_equal(table, valid):
      raise CheckpointError(directory, 'valid_mask differs when read back')
  finally:
    opened.close()


class CompactOutput:
  """The compact store: checkpoint_<suffix>/ directories (compact_store.py).

  A checkpoint_commit.ConverterOutput.
  """

  def final_path(self, store_dir: str, suffix: int) -> str:
    return os.path.join(store_dir, manifest_lib.checkpoint_dirname(suffix))

  def exists(self, store_dir: str, suffix: int) -> bool:
    return os.path.exists(self.final_path(store_dir, suffix))

  def stored_source(self, store_dir: str, suffix: int) -> dict | None:
    """manifest['source'] of a stored checkpoint, or None if absent."""
    path = self.final_path(store_dir, suffix)
    if not os.path.exists(path):
      return None
    return manifest_lib.read_manifest(path)['source']

  def check_existing(
    self, store_dir: str, source: CheckpointSource, options: ConvertOptions
  ) -> None:
    check_existing(self.final_path(store_dir, source.suffix), source, options)

  def clean(self, store_dir: str) -> None:
    """Removes a partial run dictionary, and one no checkpoint uses (a
    conversion that failed first: the next trains one on the sources as they
    are then); the caller removes partial checkpoints."""
    names = os.listdir(store_dir)
    unused = not any(name.startswith('checkpoint_') for name in names)
    for name in names:
      partial = name.startswith('.') and name.endswith(
        dictionary_preparation.PARTIAL_DICTIONARY
      )
      if partial or unused and name == manifest_lib.RUN_DICTIONARY_FILE:
        os.remove(os.path.join(store_dir, name))

  def prepare(self, store_dir: str, sources) -> None:
    dictionary_preparation.prepare_run(store_dir, sources)

  def run_bytes(self, store_dir: str) -> int:
    path = run_dictionary.store_path(store_dir)
    return os.path.getsize(path) if os.path.exists(path) else 0

  def write(self, source, partial, options, threads):  # ConverterOutput's.
    """Returns (rows, what verify needs)."""
    manifest, arrays, valid = _write_checkpoint(
      source, partial, options, threads
    )
    return manifest['num_rows'], (arrays, valid)

  def verify(self, partial: str, written: Any) -> None:
    _verify_written(partial, *written)

  def commit(self, partial: str, store_dir: str, suffix: int) -> None:
    os.rename(partial, self.final_path(store_dir, suffix))

  def remove(self, store_dir: str, suffix: int) -> None:
    """Deletes a stored checkpoint (renamed away first: never half there)."""
    doomed = os.path.join(store_dir, manifest_lib.partial_dirname(suffix))
    os.rename(self.final_path(store_dir, suffix), doomed)
    destination.fsync_directory(store_dir)
    shutil.rmtree(doomed)

  def stored_bytes(self, store_dir: str, suffix: int) -> int:
    return store_bytes(self.final_path(store_dir, suffix))

  def stored_rows(self, store_dir: str, suffix: int) -> int:
    path = self.final_path(store_dir, suffix)
    return manifest_lib.read_manifest(path)['num_rows']


def store_bytes(directory: str) -> int:
  """Bytes of the files of a stored checkpoint directory."""
  return sum(
    os.path.getsize(os.path.join(directory, name))
    for name in os.listdir(directory)
  )
