"""A whole run in bounded memory: compact store against the alternatives.

On a run of `--checkpoints` (default 50) copies of the Breakout benchmark
checkpoint of `common.py` (hard links: copies may stand in for a run's
checkpoints), side by side, each measured in a fresh process:

* CompactReplayBuffer over a store written by `fixed-replay convert`;
* an uncompressed memory-mapped store, TorchRL's approach: each checkpoint's
  frames as a plain `.npy` memory map, sampled uniformly over all checkpoints
  with the same exact transition code (ReplayShard);
* the sharded FixedReplayBuffer over the gzip files, holding as many
  checkpoints as `--max_memory_gb` allows (the rest are not sampled until a
  reload).

Reported: disk bytes against the gzip files, peak resident memory (RSS
increase over the imports) after opening and sampling, transitions per
second at batch 32 in Dopamine's layout (one sampling thread = one core,
and CompactReplayBuffer's background threads on all cores), and conversion
throughput. Every approach's batch at the same (checkpoint, row) indices is
checked equal to FixedReplayBuffer's (itself tested against Dopamine).

Only `--converted` checkpoints (default: all for 100k rows, 2 for 1M) are
converted for real, in parallel; the other stored checkpoints are hard
links to those, with their own manifest. The memory-mapped store writes one
`.npy` and links it; with hard links every "checkpoint" shares the page
cache of that one file, so its sampling rate is an upper bound (a real run
is 7 GB per 1M-row checkpoint, far beyond RAM: random reads hit the disk).

Usage: python benchmarks/compact_store_benchmark.py [--rows=1000000]
  [--checkpoints=50] [--sample_seconds=20]
"""

import json
import os
import shutil
import time

from absl import app
from absl import flags
from absl import logging
import common
import numpy as np

_CHECKPOINTS = flags.DEFINE_integer(
  'checkpoints', 50, 'Checkpoints of the run (hard links of one).'
)
_CONVERTED = flags.DEFINE_integer(
  'converted',
  None,
  'Checkpoints converted for real (default: all up to 100k rows, else 2).',
)
_SAMPLE_SECONDS = flags.DEFINE_float(
  'sample_seconds', 20.0, 'Seconds of sampling per measurement.'
)
_MAX_MEMORY_GB = flags.DEFINE_float(
  'max_memory_gb', 4.0, 'Most RAM FixedReplayBuffer may hold for its shards.'
)
BATCH = 32
CHECK_ROWS = 256
STEP_SECONDS = 0.002


def setup_ours():
  from fixed_replay.replay import compact_replay_buffer  # noqa: F401
  from fixed_replay.replay import fixed_replay_buffer  # noqa: F401


def _result(value):
  return value


# ------------------------------------------------------------- section 0


# ------------------------------------------------------------ the stores


def _link_gzip_run(source, rows, num_checkpoints):
  """A run of hard links to checkpoint 0 as suffixes 0..n-1."""
  run = common.DATA_DIR / f'gzip_run_{rows}x{num_checkpoints}'
  run.mkdir(exist_ok=True)
  for name in os.listdir(source):
    if name.endswith('_ckpt.0.gz'):
      for suffix in range(num_checkpoints):
        link = run / name.replace('_ckpt.0.gz', f'_ckpt.{suffix}.gz')
        if not link.exists():
          os.link(source / name, link)
  return run


def convert_run(source, store):
  """Converts a gzip run with one worker per core (the timed call)."""
  from fixed_replay.convert import convert

  result = convert.convert(str(source), str(store))
  return result.frames, result.seconds


def _replicate(store, num_checkpoints, converted):
  """Stored checkpoints converted..n-1 as links of the converted ones."""
  from fixed_replay.store import manifest as manifest_lib

  for suffix in range(converted, num_checkpoints):
    origin = store / manifest_lib.checkpoint_dirname(suffix % converted)
    target = store / manifest_lib.checkpoint_dirname(suffix)
    target.mkdir()
    for name in os.listdir(origin):
      if name != manifest_lib.MANIFEST:
        os.link(origin / name, target / name)
    manifest = manifest_lib.read_manifest(origin)
    manifest['suffix'] = suffix
    manifest['source']['files'] = {
      name.replace(f'.{suffix % converted}.gz', f'.{suffix}.gz'): size
      for name, size in manifest['source']['files'].items()
    }
    manifest_lib.write_manifest(target, manifest)


def write_memmap(source_files, path):
  """Streams a checkpoint's frames into a plain .npy (TorchRL's layout)."""
  from fixed_replay.io import npy_stream
  from fixed_replay.io.gzip_stream import GzipStream
  from fixed_replay.sources.dopamine import checkpoints

  header = checkpoints.read_store_headers(source_files)['observation']
  out = np.lib.format.open_memmap(
    path + '.partial', 'w+', header.dtype, header.shape
  )
  step = 50_000
  with GzipStream(source_files.store_paths['observation']) as stream:
    npy_stream.read_header(stream)
    for start in range(0, header.shape[0], step):
      part = out[start : start + step]
      stream.readinto(part.reshape(-1).view(np.uint8))
  out.flush()
  del out
  os.rename(path + '.partial', path)
  return header.shape[0]


class MemmapStore:
  """Uniform sampling over memory-mapped frames with ReplayShard's math."""

  def __init__(self, gzip_run, memmap_dir, num_checkpoints):
    from fixed_replay.replay import transitions as shard_lib
    from fixed_replay.sources.dopamine import checkpoints

    found = checkpoints.find_checkpoints(str(gzip_run))
    self.shards = []
    for suffix in range(num_checkpoints):
      window = self._small_window(found[suffix])
      frames = np.load(memmap_dir / f'observation_{suffix}.npy', mmap_mode='r')
      window.store['observation'] = np.asarray(frames)
      self.shards.append(shard_lib.ReplayShard(window, 4, 1, 0.99))
    self.valid_rows = np.concatenate([s.valid_rows for s in self.shards])
    self.ends = np.cumsum([s.num_valid for s in self.shards])
    self._shard_lib = shard_lib

  @staticmethod
  def _small_window(files):
    """The checkpoint's arrays but the frames (read once, whole)."""
    from fixed_replay.io import npy_stream
    from fixed_replay.sources.dopamine import checkpoints

    meta = checkpoints.read_checkpoint(files, 0, 0)
    for name in ('action', 'reward', 'terminal'):
      meta.store[name] = npy_stream.read_rows(files.store_paths[name])
    return meta

  def sample(self, rng, batch_size, suffixes=None, rows=None):
    if rows is None:
      positions = rng.integers(0, self.ends[-1], batch_size)
      suffixes = np.searchsorted(self.ends, positions, side='right')
      rows = self.valid_rows[positions]
    elements = self._shard_lib.transition_elements(
      len(rows), (84, 84), 4, np.uint8
    )
    batch = self._shard_lib.empty_batch(elements)
    for suffix in np.unique(suffixes):
      members = np.flatnonzero(suffixes == suffix)
      self.shards[suffix].write_transitions(rows[members], batch, members)
    return tuple(batch[e.name] for e in elements)


# ------------------------------------------------------------- sampling


def _rate(sample, seconds):
  """(transitions per wall second, per CPU second of this process)."""
  sample()  # Warm-up (compiles the kernels).
  count, began, cpu = 0, time.perf_counter(), time.process_time()
  while time.perf_counter() - began < seconds:
    sample()
    count += 1
  wall = time.perf_counter() - began
  return count * BATCH / wall, count * BATCH / (time.process_time() - cpu)


def _stall(sample, seconds, step_seconds):
  """Mean seconds `sample` blocks when each call follows a training step.

  The step is a sleep: like a TF or JAX update it releases the GIL, so the
  prefetching threads run meanwhile.
  """
  sample()
  waited, count, began = 0.0, 0, time.perf_counter()
  while time.perf_counter() - began < seconds:
    time.sleep(step_seconds)
    started = time.perf_counter()
    sample()
    waited += time.perf_counter() - started
    count += 1
  return waited / count


def sample_compact(store, seconds, check_suffixes, check_rows, workers):
  """((wall, per-CPU rate), digest at the check indices, cache hit rate,
  stall per 2 ms training step or None, seconds to open)."""
  from fixed_replay.replay.compact_replay_buffer import CompactReplayBuffer

  began = time.perf_counter()
  buffer = CompactReplayBuffer(
    str(store),
    batch_size=BATCH,
    sampling_threads=workers,
    seed=0,
  )
  opened = time.perf_counter() - began
  rate = _rate(buffer.sample_transition_batch, seconds)
  stall = None
  if workers:
    stall = _stall(buffer.sample_transition_batch, seconds / 2, STEP_SECONDS)
  batch = buffer.sample_transition_batch(
    indices=check_rows, suffixes=check_suffixes
  )
  buffer.close()
  digest = common.array_digest(dict(enumerate(batch)))
  return rate, digest, None, stall, opened  # No cache: no hit rate.


def sample_memmap(gzip_run, memmap_dir, num_checkpoints, seconds, check):
  from fixed_replay.replay import transitions  # noqa: F401

  store = MemmapStore(gzip_run, memmap_dir, num_checkpoints)
  rng = np.random.default_rng(0)
  rate = _rate(lambda: store.sample(rng, BATCH), seconds)
  check_suffixes, check_rows = check
  batch = store.sample(rng, 0, check_suffixes, check_rows)
  return rate, common.array_digest(dict(enumerate(batch)))


def sample_fixed(gzip_run, num_buffers, seconds, check):
  """FixedReplayBuffer holding checkpoints 0..num_buffers-1."""
  from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer

  began = time.perf_counter()
  buffer = FixedReplayBuffer(
    str(gzip_run),
    None,
    replay_file_end_index=num_buffers,
    num_buffers_to_load=num_buffers,
    prefetch=False,
    seed=0,
    batch_size=BATCH,
  )
  load_seconds = time.perf_counter() - began
  rate = _rate(buffer.sample_transition_batch, seconds)
  check_suffixes, check_rows = check
  batch = buffer.sample_transition_batch(
    indices=check_rows, suffixes=check_suffixes
  )
  return rate, common.array_digest(dict(enumerate(batch))), load_seconds


# ----------------------------------------------------------------- main


def _logical_bytes(directory):
  """Bytes of all files under directory, each hard link counted."""
  return sum(
    os.path.getsize(os.path.join(root, name))
    for root, _, names in os.walk(directory)
    for name in names
    if not name.startswith('.')
  )


def _check_indices(store, suffixes):
  """CHECK_ROWS valid (suffix, row) pairs among the given checkpoints."""
  from fixed_replay.store import compact_store
  from fixed_replay.store import manifest as manifest_lib

  rng = np.random.default_rng(1)
  chosen = rng.choice(suffixes, CHECK_ROWS)
  rows = []
  for suffix in chosen:
    stored = compact_store.StoredCheckpoint(
      store / manifest_lib.checkpoint_dirname(int(suffix))
    )
    table = stored.valid_rows_table(4, 1)
    rows.append(int(table[rng.integers(len(table))]))
    stored.close()
  return chosen.astype(np.int64), np.array(rows, dtype=np.int64)


def main(argv):
  del argv
  rows, num = common.ROWS.value, _CHECKPOINTS.value
  converted = _CONVERTED.value or (num if rows <= 100_000 else 2)
  print(
    f'\nCompact store benchmark: {num} checkpoints of {rows:,} Breakout '
    f'rows ({num * rows:,} transitions), {os.cpu_count()} CPUs'
  )
  print(f'{common.load_average()} at start')

  source = common.build_checkpoint(rows, common.SEED.value)
  gzip_run = _link_gzip_run(source, rows, num)
  gzip_bytes = _logical_bytes(gzip_run)

  logging.info('1/3 conversion')
  store = common.DATA_DIR / f'compact_{rows}x{num}'
  if store.exists():
    shutil.rmtree(store)  # Our own output of an earlier run: convert again.
  convert_source = _link_gzip_run(source, rows, converted)
  conversion = common.measure(
    setup_ours, convert_run, (convert_source, store), _result
  )
  frames, convert_seconds = conversion.digest
  _replicate(store, num, converted)
  store_bytes = _logical_bytes(store)

  memmap_dir = common.DATA_DIR / f'memmap_{rows}'
  memmap_dir.mkdir(exist_ok=True)
  first = memmap_dir / 'observation_0.npy'
  memmap_seconds = None
  if not first.exists():
    from fixed_replay.sources.dopamine import checkpoints

    files = checkpoints.find_checkpoints(str(source))[0]
    began = time.perf_counter()
    common.run_in_subprocess(write_memmap, files, str(first))
    memmap_seconds = time.perf_counter() - began
  for suffix in range(1, num):
    link = memmap_dir / f'observation_{suffix}.npy'
    if not link.exists():
      os.link(first, link)
  memmap_bytes = num * os.path.getsize(first)

  print(f'\n1. Disk for {num} checkpoints (hard links counted each time)')
  print(f'   gzip files (Dopamine)      {gzip_bytes / 1e9:9.3f} GB')
  print(
    f'   compact store              {store_bytes / 1e9:9.3f} GB = '
    f'{store_bytes / gzip_bytes:.2f}x gzip'
  )
  print(
    f'   uncompressed memory map    {memmap_bytes / 1e9:9.3f} GB = '
    f'{memmap_bytes / gzip_bytes:.0f}x gzip'
  )
  print('\n2. Conversion')
  print(
    f'   fixed-replay convert: {converted} checkpoint(s), {frames:,} frames '
    f'in {convert_seconds:.1f} s with {min(converted, os.cpu_count())} '
    f'workers = {frames / convert_seconds:,.0f} frames/s '
    f'({frames / convert_seconds / os.cpu_count():,.0f}'
    f'/s per core); parent peak RSS +'
    f'{common.format_bytes(conversion.peak_increase)}'
  )
  if memmap_seconds is not None:
    print(
      f'   memory-map write (gunzip to .npy): {rows:,} frames in '
      f'{memmap_seconds:.1f} s = {rows / memmap_seconds:,.0f} frames/s'
    )

  logging.info('2/3 sampling')
  fixed_buffers = max(
    0, min(num, int(_MAX_MEMORY_GB.value * 1e9 // (rows * 84 * 84 * 1.01)))
  )
  check_set = list(range(max(fixed_buffers, 1)))
  check = _check_indices(store, check_set)
  seconds = _SAMPLE_SECONDS.value
  results = {}
  common.wait_for_memory(4 * common.GIB)
  results['compact, 1 thread'] = common.measure(
    setup_ours, sample_compact, (store, seconds, *check, 0), _result
  )
  results[f'compact, {os.cpu_count()} threads'] = common.measure(
    setup_ours,
    sample_compact,
    (store, seconds, *check, os.cpu_count()),
    _result,
  )
  results['memory map, 1 thread'] = common.measure(
    setup_ours,
    sample_memmap,
    (gzip_run, memmap_dir, num, seconds, check),
    _result,
  )
  if fixed_buffers:
    common.wait_for_memory(fixed_buffers * rows * 84 * 84 + common.GIB)
    results[f'FixedReplayBuffer ({fixed_buffers} held)'] = common.measure(
      setup_ours,
      sample_fixed,
      (gzip_run, fixed_buffers, seconds, check),
      _result,
    )
    reference = results[f'FixedReplayBuffer ({fixed_buffers} held)'].digest[1]
  else:
    reference = results['compact, 1 thread'].digest[1]
  for name, measurement in results.items():
    common.assert_same_digest(reference, measurement.digest[1], name)

  print(
    f'\n3. Sampling, batch {BATCH}, state ({BATCH}, 84, 84, 4), '
    f'{seconds:.0f} s each; RSS = peak increase over imports'
  )
  print(
    '   per core = transitions per CPU-second of the process (all its '
    'threads): the machine is shared, so wall rates vary with its load'
  )
  for name, measurement in results.items():
    rate, per_core = measurement.digest[0]
    extra = ''
    if name.startswith('compact'):
      stall = measurement.digest[3]
      if stall is not None:
        extra = (
          f'; after a {STEP_SECONDS * 1e3:.0f} ms GIL-free training step, '
          f'a batch waits {stall * 1e3:.2f} ms'
        )
      extra += f'; opened in {measurement.digest[4]:.2f} s'
    if name.startswith('FixedReplayBuffer'):
      extra = (
        f', load {measurement.digest[2]:.0f} s; samples {fixed_buffers} of '
        f'{num} checkpoints at a time'
      )
    print(
      f'   {name:<27} {rate:8,.0f}/s wall, {per_core:8,.0f}/s per core, RSS '
      f'+{common.format_bytes(measurement.peak_increase)} (anonymous '
      f'+{common.format_bytes(measurement.anonymous)}){extra}'
    )
  if not fixed_buffers:
    print(
      f'   FixedReplayBuffer: not run, one {rows:,}-row checkpoint needs '
      f'{rows * 84 * 84 / 1e9:.2f} GB (> --max_memory_gb)'
    )
  print("   every approach's batch at the same 256 indices is identical")
  print(f'\n{common.load_average()} at end')
  summary = {
    'rows': rows,
    'checkpoints': num,
    'gzip_bytes': gzip_bytes,
    'store_bytes': store_bytes,
    'memmap_bytes': memmap_bytes,
    'conversion_frames_per_s': frames / convert_seconds,
    'sampling': {
      name: {'transitions_per_s': m.digest[0], 'peak_rss': m.peak_increase}
      for name, m in results.items()
    },
  }
  logging.info('summary %s', json.dumps(summary))


if __name__ == '__main__':
  app.run(main)
