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

Before converting anything, every checkpoint's bookkeeping is checked (see
dataset/checks.py) and all problems are reported at once. Worker processes
die with the converting process, however it ends (workers.py); a failure to
write names the path and the cause (destination.py).

See compact_store.py for the layout.
"""

import concurrent.futures
import dataclasses
import os
import shutil
import time

from absl import logging
import blosc2
import numpy as np

from fixed_replay import progress
from fixed_replay.dataset import checkpoints
from fixed_replay.dataset import checks
from fixed_replay.dataset import validity
from fixed_replay.errors import CheckpointError
from fixed_replay.errors import CheckpointProblems
from fixed_replay.io import files as storage
from fixed_replay.io import npy_stream
from fixed_replay.io.gzip_stream import GzipStream
from fixed_replay.store import compact_store
from fixed_replay.store import destination
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
  """

  block_rows: int = 16
  codec: str = 'zstd'
  clevel: int = 5
  stack_size: int = 4
  update_horizon: int = 1
  slice_bytes: int = 64 << 20

  def stored(self):
    """The options a stored checkpoint records (all but slice_bytes)."""
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


def _source_sizes(files):
  return {
    os.path.basename(path): storage.size(path) for path in files.all_paths()
  }


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

  Raises:
    CheckpointError: if it is damaged, was converted from other files or with
      other options.
  """
  manifest = compact_store.verify_checkpoint(directory).manifest
  if manifest['source']['files'] != _source_sizes(files):
    raise CheckpointError(
      directory,
      f'converted from files of other sizes than those of checkpoint '
      f'{files.suffix} in {files.directory} ({manifest["source"]["files"]}): '
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


def _compress_stream(stream, header, out, cparams, options, threads):
  """Compresses the frames of a GzipStream slice by slice into `out`.

  Returns:
    (offsets, crcs, frames_crc, blocks_crc): block offsets in `out` (one
    more than blocks), each block's CRC-32, and the CRC-32 of all the frames
    and of all the blocks.
  """
  block_rows = options.block_rows
  num_rows = header.shape[0]
  slice_rows = max(1, options.slice_bytes // max(header.row_bytes, 1))
  slice_rows = max(block_rows, slice_rows // block_rows * block_rows)
  buffer = np.empty(
    (min(slice_rows, num_rows),) + header.row_shape, header.dtype
  )
  compress = lambda block: compact_store.compress_block(block, cparams)
  offsets, crcs = [0], []
  frames_crc, blocks_crc = 0, 0
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    for start in range(0, num_rows, slice_rows):
      part = buffer[: min(slice_rows, num_rows - start)]
      stream.readinto(part.reshape(-1).view(np.uint8))
      frames_crc = compact_store.crc32(part, frames_crc)
      blocks = [
        part[i : i + block_rows] for i in range(0, len(part), block_rows)
      ]
      for chunk in pool.map(compress, blocks):
        out.write(chunk)
        offsets.append(offsets[-1] + len(chunk))
        crcs.append(compact_store.crc32(chunk))
        blocks_crc = compact_store.crc32(chunk, blocks_crc)
      worker_processes.count_progress(len(part))
  return offsets, crcs, frames_crc, blocks_crc


def _write_frames(files, directory, options, threads):
  """Streams the observation file into blocks; returns the manifest entry."""
  path = files.store_paths['observation']
  with GzipStream(path) as stream:
    header = npy_stream.read_header(stream)
    if len(header.shape) < 1:
      raise CheckpointError(path, 'observations must have a row axis')
    cparams = compact_store.block_cparams(
      options.codec,
      options.clevel,
      options.block_rows,
      header.row_shape,
      header.dtype,
    )
    with open(os.path.join(directory, compact_store.BLOCKS_FILE), 'wb') as out:
      offsets, crcs, frames_crc, blocks_crc = _compress_stream(
        stream, header, out, cparams, options, threads
      )
      out.flush()
      os.fsync(out.fileno())
    # Reading to the end checks the source's gzip CRC-32 and length.
    if stream.read_to_end():
      raise CheckpointError(path, 'more data after the rows its header lists')
  _write_npy(
    directory, compact_store.OFFSETS_FILE, np.array(offsets, dtype=np.int64)
  )
  _write_npy(directory, compact_store.CRC_FILE, np.array(crcs, dtype=np.uint32))
  spec = {
    'file': compact_store.BLOCKS_FILE,
    'dtype': header.dtype.str,
    'row_shape': list(header.row_shape),
    'codec': options.codec,
    'clevel': options.clevel,
    'filter': 'shuffle' if header.dtype.itemsize > 1 else 'none',
    'block_rows': options.block_rows,
    'num_blocks': len(crcs),
    'frames_crc32': frames_crc,
    'library': f'blosc2 {blosc2.__version__}',
  }
  blocks_entry = {'bytes': offsets[-1], 'crc32': blocks_crc}
  return header.shape[0], spec, blocks_entry


def _read_small_arrays(files, num_rows):
  """Reads every `$store$_` array but the observations, checking its gzip."""
  arrays = {}
  for name, path in sorted(files.store_paths.items()):
    if name == 'observation':
      continue
    arrays[name] = npy_stream.read_rows(path)  # Whole: CRC-32 checked.
    if len(arrays[name]) != num_rows:
      raise CheckpointError(path, f'{len(arrays[name])} rows, not {num_rows}')
  return arrays


def _write_checkpoint(files, directory, options, threads):
  """Writes every file of one checkpoint into `directory`; returns manifest."""
  rows = checks.store_headers(files, checkpoints.read_store_headers(files))
  add_count, invalid_range, episode_end_indices = checkpoints.read_bookkeeping(
    files, rows
  )
  num_rows, frames_spec, blocks_entry = _write_frames(
    files, directory, options, threads
  )
  arrays = _read_small_arrays(files, num_rows)
  written = {
    name: _write_npy(directory, f'{name}.npy', array)
    for name, array in arrays.items()
  }
  _write_npy(directory, compact_store.INVALID_RANGE_FILE, invalid_range)
  episode_ends = None
  if episode_end_indices is not None:
    episode_ends = _write_npy(
      directory, compact_store.EPISODE_ENDS_FILE, episode_end_indices
    )
  valid = validity.valid_rows(
    arrays['terminal'],
    0,
    num_rows,
    add_count,
    invalid_range,
    episode_end_indices,
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
    'suffix': files.suffix,
    'num_rows': num_rows,
    'add_count': add_count,
    'source': {'files': _source_sizes(files)},
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


def convert_checkpoint(files, store_dir, options, threads=1):
  """Converts one checkpoint into `store_dir/checkpoint_<suffix>`.

  Args:
    files: checkpoints.CheckpointFiles of the source.
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
  final = os.path.join(
    store_dir, compact_store.checkpoint_dirname(files.suffix)
  )
  partial = os.path.join(store_dir, compact_store.partial_dirname(files.suffix))
  try:
    if os.path.exists(partial):
      shutil.rmtree(partial)
    os.mkdir(partial)
    try:
      manifest, arrays, valid = _write_checkpoint(
        files, partial, options, threads
      )
      _verify_written(partial, arrays, valid)
      if os.path.exists(final):
        raise CheckpointError(final, 'appeared while converting: not replaced')
      if not worker_processes.parent_alive():
        os._exit(1)  # The conversion was killed: leave nothing behind.
      os.rename(partial, final)
      _fsync_directory(store_dir)
    finally:
      if os.path.exists(partial):
        shutil.rmtree(partial, ignore_errors=True)
  except OSError as error:  # Sources are read through CheckpointError.
    raise destination.error(final, error) from error
  return {
    'suffix': files.suffix,
    'rows': manifest['num_rows'],
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
      pool.submit(convert_checkpoint, files, store_dir, options, threads)
      for files, _ in pending
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
    for files, rows in pending:
      result = convert_checkpoint(
        files, store_dir, options, threads=os.cpu_count() or 1
      )
      done += rows
      bar.update(done)
      _log_result(result)
  finally:
    bar.close()


def _plan(found, rows_by_suffix, store_dir, options):
  """Returns (pending, skipped): what to convert, what is there (checked)."""
  _remove_partials(store_dir)
  pending, skipped = [], []
  for suffix, files in found.items():
    final = os.path.join(store_dir, compact_store.checkpoint_dirname(suffix))
    if os.path.exists(final):
      check_existing(final, files, options)
      skipped.append(suffix)
    else:
      pending.append((files, rows_by_suffix[suffix]))
  logging.info(
    'Converting %d checkpoint(s) %s of %s into %s; %d already converted '
    '(checked)',
    len(pending),
    [files.suffix for files, _ in pending],
    next(iter(found.values())).directory,
    store_dir,
    len(skipped),
  )
  return pending, skipped


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
  began = time.perf_counter()
  options = options or ConvertOptions()
  source_dir, store_dir = str(source_dir), str(store_dir)
  if not storage.is_remote(source_dir) and os.path.realpath(
    source_dir
  ) == os.path.realpath(store_dir):
    raise CheckpointError(store_dir, 'the store must not be the source')
  found = checkpoints.find_checkpoints(source_dir)
  rows_by_suffix, errors = checkpoints.check_run(found)
  if errors:
    raise CheckpointProblems(source_dir, errors)
  destination.create(store_dir)
  lock = destination.lock(store_dir)
  try:
    destination.wait_for_old_workers(store_dir)
    pending, skipped = _plan(found, rows_by_suffix, store_dir, options)
    if pending:
      if workers is None:
        workers = min(len(pending), os.cpu_count() or 1)
      if workers == 0:
        _run_here(pending, store_dir, options)
      else:
        _run_pool(pending, store_dir, options, min(workers, len(pending)))
  except OSError as error:
    raise destination.error(store_dir, error) from error
  finally:
    lock.close()
  source_bytes = sum(sum(_source_sizes(f).values()) for f in found.values())
  store_bytes = sum(
    _store_bytes(os.path.join(store_dir, compact_store.checkpoint_dirname(s)))
    for s in found
  )
  return ConversionResult(
    converted=[files.suffix for files, _ in pending],
    skipped=skipped,
    frames=sum(rows for _, rows in pending),
    source_bytes=source_bytes,
    store_bytes=store_bytes,
    seconds=time.perf_counter() - began,
  )
