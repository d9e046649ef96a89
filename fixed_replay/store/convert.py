"""Converts a run's gzip replay checkpoints into a compact store, once.

Each checkpoint is converted by one worker process that streams its
observation file in slices (bounded memory whatever the file's size),
compresses each block of `block_rows` frames into its own blosc2 chunk,
writes everything into a partial directory, verifies it (every block decoded
and checked against the CRC-32 of the source frames, every small array read
back) and only then renames it into place. A conversion that is interrupted
leaves complete checkpoints and partial directories; started again, it checks
and skips the former, deletes the latter and converts the rest, giving the
same bytes as an uninterrupted run. The source is only ever read.

Where the rows come from is a source (checkpoint_source.py: Dopamine gzip
files; rlu_source.py: RL Unplugged episodes); what is written is an output:
the compact store (compact_store.py for the layout) or, with
`output_format='dopamine'`, Dopamine's own checkpoint files
(dopamine_output.py). Both go through the same partial directory,
verification, commit and skip-after-check.

Before converting anything, every gzip checkpoint's bookkeeping is checked
(see dataset/checks.py) and all problems are reported at once. Worker
processes die with the converting process, however it ends (workers.py); a
failure to write names the path and the cause (destination.py).
"""

import concurrent.futures
import dataclasses
import itertools
import os
import shutil
import time

from absl import logging
import blosc2
import numpy as np

from fixed_replay import progress
from fixed_replay.dataset import checkpoints
from fixed_replay.dataset import validity
from fixed_replay.errors import CheckpointError
from fixed_replay.errors import CheckpointProblems
from fixed_replay.io import files as storage
from fixed_replay.store import checkpoint_source
from fixed_replay.store import compact_store
from fixed_replay.store import destination
from fixed_replay.store import dopamine_output
from fixed_replay.store import workers as worker_processes

_LOG_EVERY_S = 30.0


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
  """How checkpoints are stored.

  Attributes:
    block_rows: int, frames per compressed block. Measured on Breakout
      (benchmarks/compact_store_benchmark.py): 16 stores ~0.7x gzip's bytes
      and decodes a random 5-frame window in ~50 us; 32 is smaller, slower.
    codec: str, a key of compact_store.CODECS.
    clevel: int, blosc2 compression level (0-9); zstd at 5 compresses ~50k
      frames/s per core; higher levels cost much more for little.
    stack_size: int, frames per state, for the table of valid rows.
    update_horizon: int, n of the n-step return, for that table.
    slice_bytes: int, uncompressed frame bytes read per step (the worker's
      memory beyond the small arrays).
    output_format: str, 'compact' (the compact store) or 'dopamine'
      (Dopamine's own gzip checkpoint files, dopamine_output.py).
    gzip_level: int, gzip level of the 'dopamine' output's files. zlib-ng
      at 2 compresses an Atari frame in ~7 us to ~1.6x the bytes of
      Dopamine's own level 9, which takes ~70 us (6: ~14 us, 1.4x); see
      benchmarks/rlu_convert_benchmark.py.
  """

  block_rows: int = 16
  codec: str = 'zstd'
  clevel: int = 5
  stack_size: int = 4
  update_horizon: int = 1
  slice_bytes: int = 64 << 20
  output_format: str = 'compact'
  gzip_level: int = 2

  def stored(self):
    """The options a compact checkpoint records (its format's, not
    slice_bytes)."""
    return {
      'block_rows': self.block_rows,
      'codec': self.codec,
      'clevel': self.clevel,
      'stack_size': self.stack_size,
      'update_horizon': self.update_horizon,
    }


@dataclasses.dataclass
class ConversionResult:
  """What a conversion did.

  Attributes:
    converted: list of suffixes converted now.
    skipped: list of suffixes already complete (checked, kept).
    frames: int, frames converted now.
    source_bytes: int, bytes of the source files of all stored checkpoints.
    store_bytes: int, bytes of the store's files for those checkpoints.
    seconds: float, wall time.
  """

  converted: list
  skipped: list
  frames: int
  source_bytes: int
  store_bytes: int
  seconds: float


def _stored_options(manifest):
  spec = manifest['observation']
  return {
    'block_rows': spec['block_rows'],
    'codec': spec['codec'],
    'clevel': spec['clevel'],
    'stack_size': manifest['valid_rows']['stack_size'],
    'update_horizon': manifest['valid_rows']['update_horizon'],
  }


def check_existing(directory, files, options):
  """Verifies an already converted checkpoint before it is skipped.

  Args:
    directory: str, the stored checkpoint.
    files: a source (checkpoint_source.py) or CheckpointFiles.
    options: ConvertOptions.

  Raises:
    CheckpointError: if it is damaged, was converted from other files or with
      other options.
  """
  source = checkpoint_source.as_source(files)
  manifest = compact_store.verify_checkpoint(directory).manifest
  if manifest['source'] != source.description():
    raise CheckpointError(
      directory,
      f'converted from other source files than those of checkpoint '
      f'{source.suffix} now ({manifest["source"]["files"]}): '
      'convert into a new directory',
    )
  if _stored_options(manifest) != options.stored():
    raise CheckpointError(
      directory,
      f'converted with {_stored_options(manifest)}, now asked for '
      f'{options.stored()}: use the same options or a new directory',
    )
  return manifest


def _write_npy(directory, name, array):
  path = os.path.join(directory, name)
  with open(path, 'wb') as stream:
    np.save(stream, array, allow_pickle=False)
    stream.flush()
    os.fsync(stream.fileno())
  return name


def slice_rows(row_shape, dtype, options):
  """Frames read per slice: slice_bytes worth, whole blocks."""
  block_rows = options.block_rows
  row_bytes = int(np.prod(row_shape, dtype=np.int64)) * np.dtype(dtype).itemsize
  rows = max(1, options.slice_bytes // max(row_bytes, 1))
  return max(block_rows, rows // block_rows * block_rows)


def _compress_slices(slices, out, cparams, options, threads):
  """Compresses frames, slice by slice, into `out`.

  Returns:
    (offsets, crcs, frames_crc, blocks_crc, num_rows): block offsets in
    `out` (one more than blocks), each block's CRC-32, the CRC-32 of all the
    frames and of all the blocks, and the number of frames.
  """
  block_rows = options.block_rows
  # A few tasks per thread and slice: one per 16-frame block cost more in
  # futures than the blocks' compression on one core.
  compress = lambda group: [
    compact_store.compress_block(block, cparams) for block in group
  ]
  offsets, crcs = [0], []
  frames_crc, blocks_crc, num_rows = 0, 0, 0
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    for part in slices:
      num_rows += len(part)
      frames_crc = compact_store.crc32(part, frames_crc)
      blocks = [
        part[i : i + block_rows] for i in range(0, len(part), block_rows)
      ]
      step = max(1, -(-len(blocks) // (4 * threads)))
      groups = [blocks[i : i + step] for i in range(0, len(blocks), step)]
      for chunk in itertools.chain.from_iterable(pool.map(compress, groups)):
        out.write(chunk)
        offsets.append(offsets[-1] + len(chunk))
        crcs.append(compact_store.crc32(chunk))
        blocks_crc = compact_store.crc32(chunk, blocks_crc)
      worker_processes.count_progress(len(part))
  return offsets, crcs, frames_crc, blocks_crc, num_rows


def _write_frames(reader, directory, options, threads):
  """Streams a source's frames into blocks; returns the manifest entry."""
  cparams = compact_store.block_cparams(
    options.codec,
    options.clevel,
    options.block_rows,
    reader.row_shape,
    reader.dtype,
  )
  slices = reader.frame_slices(
    slice_rows(reader.row_shape, reader.dtype, options)
  )
  with open(os.path.join(directory, compact_store.BLOCKS_FILE), 'wb') as out:
    offsets, crcs, frames_crc, blocks_crc, num_rows = _compress_slices(
      slices, out, cparams, options, threads
    )
    out.flush()
    os.fsync(out.fileno())
  _write_npy(
    directory, compact_store.OFFSETS_FILE, np.array(offsets, dtype=np.int64)
  )
  _write_npy(directory, compact_store.CRC_FILE, np.array(crcs, dtype=np.uint32))
  dtype = np.dtype(reader.dtype)
  spec = {
    'file': compact_store.BLOCKS_FILE,
    'dtype': dtype.str,
    'row_shape': list(reader.row_shape),
    'codec': options.codec,
    'clevel': options.clevel,
    'filter': 'shuffle' if dtype.itemsize > 1 else 'none',
    'block_rows': options.block_rows,
    'num_blocks': len(crcs),
    'frames_crc32': frames_crc,
    'library': f'blosc2 {blosc2.__version__}',
  }
  blocks_entry = {'bytes': offsets[-1], 'crc32': blocks_crc}
  return num_rows, spec, blocks_entry


def _write_checkpoint(source, directory, options, threads):
  """Writes every file of one checkpoint into `directory`; returns manifest."""
  with source.open(threads) as reader:
    num_rows, frames_spec, blocks_entry = _write_frames(
      reader, directory, options, threads
    )
    meta = reader.finish(num_rows)
  arrays = meta.arrays
  written = {
    name: _write_npy(directory, f'{name}.npy', array)
    for name, array in arrays.items()
  }
  _write_npy(directory, compact_store.INVALID_RANGE_FILE, meta.invalid_range)
  episode_ends = None
  if meta.episode_end_indices is not None:
    episode_ends = _write_npy(
      directory, compact_store.EPISODE_ENDS_FILE, meta.episode_end_indices
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
  _write_npy(
    directory,
    compact_store.VALID_MASK_FILE,
    compact_store.pack_valid_rows(valid, num_rows),
  )
  names = [
    compact_store.OFFSETS_FILE,
    compact_store.CRC_FILE,
    compact_store.INVALID_RANGE_FILE,
    compact_store.VALID_MASK_FILE,
  ] + list(written.values())
  if episode_ends:
    names.append(episode_ends)
  file_entries = {
    name: compact_store.file_entry(os.path.join(directory, name))
    for name in names
  }
  file_entries[compact_store.BLOCKS_FILE] = blocks_entry
  manifest = {
    'format': compact_store.FORMAT,
    'version': compact_store.VERSION,
    'suffix': source.suffix,
    'num_rows': num_rows,
    'add_count': meta.add_count,
    'source': meta.description,
    'observation': frames_spec,
    'arrays': {
      name: {
        'file': written[name],
        'dtype': array.dtype.str,
        'row_shape': list(array.shape[1:]),
      }
      for name, array in arrays.items()
    },
    'valid_rows': {
      'file': compact_store.VALID_MASK_FILE,
      'stack_size': options.stack_size,
      'update_horizon': options.update_horizon,
      'count': len(valid),
    },
    'episode_end_indices': episode_ends,
    'files': file_entries,
  }
  compact_store.write_manifest(directory, manifest)
  return manifest, arrays, valid


def _verify_written(directory, arrays, valid):
  """Reads a freshly written checkpoint back; raises on any difference."""
  compact_store.verify_checkpoint(directory, decode=True)
  opened = compact_store.StoredCheckpoint(directory, verify=False)
  try:
    for name, array in arrays.items():
      stored = opened.arrays[name]
      # Bytes, not values: NaN rewards must round-trip too.
      if stored.tobytes() != array.tobytes():
        raise CheckpointError(directory, f'{name}.npy differs from the source')
    table = opened.valid_rows_table(
      opened.manifest['valid_rows']['stack_size'],
      opened.manifest['valid_rows']['update_horizon'],
    )
    if not np.array_equal(table, valid):
      raise CheckpointError(directory, 'valid_mask.npy differs when read back')
  finally:
    opened.close()


def _fsync_directory(path):
  descriptor = os.open(path, os.O_RDONLY)
  try:
    os.fsync(descriptor)
  finally:
    os.close(descriptor)


class CompactOutput:
  """The compact store: checkpoint_<suffix>/ directories (compact_store.py)."""

  def final_path(self, store_dir, suffix):
    return os.path.join(store_dir, compact_store.checkpoint_dirname(suffix))

  def exists(self, store_dir, suffix):
    return os.path.exists(self.final_path(store_dir, suffix))

  def stored_source(self, store_dir, suffix):
    """manifest['source'] of a stored checkpoint, or None if absent."""
    if not self.exists(store_dir, suffix):
      return None
    return compact_store.read_manifest(self.final_path(store_dir, suffix))[
      'source'
    ]

  def check_existing(self, store_dir, source, options):
    check_existing(self.final_path(store_dir, source.suffix), source, options)

  def clean(self, store_dir):
    """Nothing to tidy: partial directories are removed by the caller."""

  def write(self, source, partial, options, threads):
    """Returns (rows, what verify needs)."""
    manifest, arrays, valid = _write_checkpoint(
      source, partial, options, threads
    )
    return manifest['num_rows'], (arrays, valid)

  def verify(self, partial, written):
    _verify_written(partial, *written)

  def commit(self, partial, store_dir, suffix):
    os.rename(partial, self.final_path(store_dir, suffix))

  def remove(self, store_dir, suffix):
    """Deletes a stored checkpoint (renamed away first: never half there)."""
    doomed = os.path.join(store_dir, compact_store.partial_dirname(suffix))
    os.rename(self.final_path(store_dir, suffix), doomed)
    _fsync_directory(store_dir)
    shutil.rmtree(doomed)

  def stored_bytes(self, store_dir, suffix):
    return _store_bytes(self.final_path(store_dir, suffix))

  def stored_rows(self, store_dir, suffix):
    path = self.final_path(store_dir, suffix)
    return compact_store.read_manifest(path)['num_rows']


def output_of(options):
  """The output ConvertOptions.output_format names."""
  if options.output_format == 'compact':
    return CompactOutput()
  if options.output_format == 'dopamine':
    return dopamine_output.DopamineOutput()
  raise ValueError(
    f'output_format {options.output_format!r} is not compact or dopamine'
  )


def convert_checkpoint(files, store_dir, options, threads=1):
  """Converts one checkpoint into the store (`checkpoint_<suffix>`).

  Args:
    files: a source (checkpoint_source.py) or checkpoints.CheckpointFiles.
    store_dir: str, the store.
    options: ConvertOptions.
    threads: int, threads compressing blocks.

  Returns:
    dict with suffix, rows, seconds.

  Raises:
    CheckpointError: if the source is damaged, the result fails its check,
      or the store cannot be written (naming the path and the cause).
  """
  began = time.perf_counter()
  source = checkpoint_source.as_source(files)
  output = output_of(options)
  final = output.final_path(store_dir, source.suffix)
  partial = os.path.join(
    store_dir, compact_store.partial_dirname(source.suffix)
  )
  try:
    if os.path.exists(partial):
      shutil.rmtree(partial)
    os.mkdir(partial)
    try:
      num_rows, written = output.write(source, partial, options, threads)
      output.verify(partial, written)
      if output.exists(store_dir, source.suffix):
        raise CheckpointError(final, 'appeared while converting: not replaced')
      if not worker_processes.parent_alive():
        os._exit(1)  # The conversion was killed: leave nothing behind.
      output.commit(partial, store_dir, source.suffix)
      _fsync_directory(store_dir)
    finally:
      if os.path.exists(partial):
        shutil.rmtree(partial, ignore_errors=True)
  except OSError as error:  # Sources are read through CheckpointError.
    raise destination.error(final, error) from error
  return {
    'suffix': source.suffix,
    'rows': num_rows,
    'seconds': time.perf_counter() - began,
  }


def _remove_partials(store_dir):
  """Deletes partial checkpoints of killed conversions (ours by name)."""
  for name in os.listdir(store_dir):
    if compact_store.is_partial_dirname(name):
      logging.info('Removing %s, left by an interrupted conversion', name)
      shutil.rmtree(os.path.join(store_dir, name))


def _store_bytes(directory):
  return sum(
    os.path.getsize(os.path.join(directory, name))
    for name in os.listdir(directory)
  )


def _format_eta(seconds):
  seconds = int(seconds)
  return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'


class _Progress:
  """A tqdm bar at a terminal, a log line every 30 s otherwise."""

  def __init__(self, total):
    self._total = total
    self._bar = progress.bar(total, 'converting', unit='frame', unit_scale=True)
    self._began = time.perf_counter()
    self._last_log = self._began
    self._shown = 0

  def update(self, done):
    self._bar.update(done - self._shown)
    self._shown = done
    now = time.perf_counter()
    if self._bar.disable and now - self._last_log >= _LOG_EVERY_S:
      self._last_log = now
      rate = done / max(now - self._began, 1e-9)
      eta = (self._total - done) / rate if rate else float('inf')
      logging.info(
        'Converted %d of %d frames (%.0f%%), %.0f frames/s, ETA %s',
        done,
        self._total,
        100 * done / max(self._total, 1),
        rate,
        _format_eta(eta) if np.isfinite(eta) else '?',
      )

  def close(self):
    self._bar.close()


def _log_result(result):
  logging.info(
    'Converted checkpoint %d (%d rows) in %.1f s',
    result['suffix'],
    result['rows'],
    result['seconds'],
  )


def _run_pool(pending, store_dir, options, workers):
  """Converts the pending checkpoints in worker processes, with progress.

  An interrupt (or any exception but a checkpoint's own failure) kills the
  workers at once; a failed checkpoint lets the others finish, so that a
  rerun has less to do.
  """
  total = sum(rows for _, rows in pending)
  threads = max(1, (os.cpu_count() or 1) // workers)
  bar = _Progress(total)
  pool, counter = worker_processes.start_pool(workers, store_dir)
  try:
    futures = [
      pool.submit(convert_checkpoint, source, store_dir, options, threads)
      for source, _ in pending
    ]
    waiting = set(futures)
    while waiting:
      done, waiting = concurrent.futures.wait(
        waiting, timeout=1.0, return_when=concurrent.futures.FIRST_COMPLETED
      )
      bar.update(counter.value)
      for future in done:
        _log_result(future.result())
  except CheckpointError:
    pool.shutdown(wait=True, cancel_futures=True)
    raise
  except BaseException:
    worker_processes.kill(pool)
    pool.shutdown(wait=True, cancel_futures=True)
    raise
  finally:
    pool.shutdown(wait=True)
    bar.close()


def _run_here(pending, store_dir, options):
  """Converts the pending checkpoints one by one in this process."""
  total = sum(rows for _, rows in pending)
  bar = _Progress(total)
  done = 0
  try:
    for source, rows in pending:
      result = convert_checkpoint(
        source, store_dir, options, threads=os.cpu_count() or 1
      )
      done += rows
      bar.update(done)
      _log_result(result)
  finally:
    bar.close()


def convert(source_dir, store_dir, options=None, workers=None):
  """Converts every complete checkpoint of `source_dir` into a store.

  Args:
    source_dir: str, directory of gzip checkpoints (local or gs://).
    store_dir: str, local directory of the store (created if needed).
    options: ConvertOptions or None for the defaults.
    workers: int or None; processes converting checkpoints in parallel (None:
      one per core, at most one per checkpoint); 0 converts in this process.

  Returns:
    ConversionResult.

  Raises:
    CheckpointError: if the source holds no complete checkpoint, a source
      file is damaged (CheckpointProblems lists every inconsistent file
      before anything is converted), an existing stored checkpoint fails its
      check, another conversion holds the store, or the store cannot be
      written (naming the path and the cause).
  """
  source_dir, store_dir = str(source_dir), str(store_dir)
  _check_not_source(source_dir, store_dir)
  found = checkpoints.find_checkpoints(source_dir)
  _, errors = checkpoints.check_run(found)
  if errors:
    raise CheckpointProblems(source_dir, errors)
  sources = [checkpoint_source.GzipSource(files) for files in found.values()]
  return convert_sources(source_dir, store_dir, [sources], options, workers)


def _check_not_source(source_dir, store_dir):
  if not storage.is_remote(source_dir) and os.path.realpath(
    source_dir
  ) == os.path.realpath(store_dir):
    raise CheckpointError(store_dir, 'the store must not be the source')


def convert_sources(source_dir, store_dir, rounds, options=None, workers=None):
  """Converts checkpoints from sources into a store, round after round.

  Args:
    source_dir: str, where the sources are (for messages and the check that
      the store is elsewhere).
    store_dir: str, local directory of the store (created if needed).
    rounds: iterable of lists of sources (checkpoint_source.py). Each round
      is converted before the next is asked for, all under the store's
      lock, so a generator may plan a round from what the store holds.
    options: ConvertOptions or None for the defaults.
    workers: as for `convert`.

  Returns:
    ConversionResult.

  Raises:
    CheckpointError: as for `convert`.
  """
  began = time.perf_counter()
  options = options or ConvertOptions()
  source_dir, store_dir = str(source_dir), str(store_dir)
  _check_not_source(source_dir, store_dir)
  output = output_of(options)
  destination.create(store_dir)
  lock = destination.lock(store_dir)
  converted, skipped, seen = [], [], {}
  try:
    destination.wait_for_old_workers(store_dir)
    _remove_partials(store_dir)
    output.clean(store_dir)
    for sources in rounds:
      pending = []
      for source in sources:
        seen[source.suffix] = source
        if output.exists(store_dir, source.suffix):
          output.check_existing(store_dir, source, options)
          skipped.append(source.suffix)
          continue
        pending.append((source, source.expected_rows()))
      if sources:
        logging.info(
          'Converting %d checkpoint(s) %s of %s into %s; %d already '
          'converted (checked)',
          len(pending),
          [source.suffix for source, _ in pending],
          source_dir,
          store_dir,
          len(sources) - len(pending),
        )
      if pending:
        count = workers
        if count is None:
          count = min(len(pending), os.cpu_count() or 1)
        if count == 0:
          _run_here(pending, store_dir, options)
        else:
          _run_pool(pending, store_dir, options, min(count, len(pending)))
      converted += [source.suffix for source, _ in pending]
  except OSError as error:
    raise destination.error(store_dir, error) from error
  finally:
    lock.close()
  converted = sorted(set(converted))
  return ConversionResult(
    converted=converted,
    skipped=sorted(set(skipped) - set(converted)),
    frames=sum(output.stored_rows(store_dir, s) for s in converted),
    source_bytes=sum(
      {
        name: size
        for source in seen.values()
        for name, size in source.source_files().items()
      }.values()
    ),
    store_bytes=sum(output.stored_bytes(store_dir, s) for s in seen),
    seconds=time.perf_counter() - began,
  )
