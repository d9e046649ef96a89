"""What the compact store costs and gives, on busy games and on Breakout.

The compact store (`fixed-replay convert`, format 5: one frame a zstd unit,
decoded per batch) is what a run trains from when its gzip files do not fit
in RAM. For each game of `--games`, in fresh processes, this measures:

1. Size of a converted checkpoint (with its share of the zstd dictionary a
   run's checkpoints share) against Dopamine's gzip files of it, beside the
   PNGs RL Unplugged would store for its frames (zlib level 6, TensorFlow's
   encode_png default) and the uncompressed frames.
2. Conversion, frames per CPU-second of `convert` in one process, against
   inflating the frames alone into a `.npy` (what converting the gzip files
   cannot go below), beside decoding those PNGs (the same floor for RL
   Unplugged's shards).
3. Sampling at batch 32 in the calling thread, transitions per CPU-second,
   against Dopamine's own OutOfGraphReplayBuffer on the loaded checkpoint,
4. and each way's peak memory (RSS above its imports, and the growth of
   its anonymous memory: what it allocated, not the file pages it maps)
   over a whole run of `--checkpoints` hard links of the checkpoint (each
   stored one with its own manifest): FixedReplayBuffer over the store; an
   uncompressed memory-mapped store (TorchRL's approach, sampled with the
   same transition code; the links share one file's page cache, so its
   rate is an upper bound: a real run's frames, 7 GB a 1M-row checkpoint,
   come from disk); and the sharded FixedReplayBuffer over the gzip files,
   holding the checkpoints `--max_memory_gb` allows (the rest wait for a
   reload). Every way's batch at the same 256 rows is checked equal to
   Dopamine's.

Data: `busy_<G>` is random play of a busy game written by Dopamine's own
writer, one checkpoint in benchmarks/data/busy_<G>/ (generate it first);
`common` is common.py's Breakout checkpoint of `--rows` rows (built if
missing), whose near-static frames gzip compresses best.

Usage:
  for G in MsPacman Asterix Seaquest; do
    fixed-replay generate --environment=atari --game=$G --policy=random \\
      --checkpoint_rows=100000 --num_checkpoints=1 \\
      --output_dir=benchmarks/data/busy_$G
  done
  python benchmarks/store_benchmark.py [--games=MsPacman,Asterix,common] \\
    [--rows=1000000] [--checkpoints=50] [--sample_seconds=10] \\
    [--max_memory_gb=8] [--parts=convert,sample]
"""

import os
import shutil
import time

from absl import app
from absl import flags
import common
import numpy as np

_GAMES = flags.DEFINE_list(
  'games',
  ['MsPacman', 'Asterix', 'Seaquest', 'common'],
  "busy_<G> data to measure; 'common' is common.py's Breakout checkpoint.",
)
_CHECKPOINTS = flags.DEFINE_integer('checkpoints', 50, 'Checkpoints a run.')
_SAMPLE_SECONDS = flags.DEFINE_float('sample_seconds', 10.0, 'Per sampler.')
_MAX_MEMORY_GB = flags.DEFINE_float('max_memory_gb', 8.0, 'For gzip shards.')
_PARTS = flags.DEFINE_list(
  'parts',
  ['convert', 'sample'],
  'convert: size and conversion (1, 2); sample: sampling and memory (3, 4).',
)

BATCH = 32
CHECK_ROWS = 256
PNG_FRAMES = 2000
FRAME_BYTES = 84 * 84


def _setup():
  from fixed_replay.convert import convert  # noqa: F401
  from fixed_replay.replay import fixed_replay_buffer  # noqa: F401


def _setup_dopamine():
  from dopamine.tf.replay_memory import circular_replay_buffer  # noqa: F401

  _setup()


def _identity(result):
  return result


def _measure(setup, function, *args):
  return common.measure(setup, function, args, _identity)


def _gzip_files(directory):
  """Names of Dopamine's files of checkpoint 0."""
  return [n for n in os.listdir(directory) if n.endswith('_ckpt.0.gz')]


def link_gzip_run(source, run, num_checkpoints):
  """run/: hard links of source's checkpoint 0 as suffixes 0..n-1."""
  os.makedirs(run, exist_ok=True)
  for name in _gzip_files(source):
    for suffix in range(num_checkpoints):
      link = os.path.join(run, name.replace('.0.gz', f'.{suffix}.gz'))
      if not os.path.exists(link):
        os.link(os.path.join(source, name), link)


def convert_one(source, store):
  """Converts source's checkpoint into a store in this process; frames."""
  from fixed_replay.convert import convert

  return convert.convert(str(source), str(store), workers=0).frames


def write_memmap(source, path):
  """Inflates checkpoint 0's frames into a plain .npy (TorchRL's layout)."""
  from fixed_replay.io import npy_stream
  from fixed_replay.io.gzip_stream import GzipStream
  from fixed_replay.sources.dopamine import checkpoints

  files = checkpoints.find_checkpoints(str(source))[0]
  header = checkpoints.read_store_headers(files)['observation']
  out = np.lib.format.open_memmap(
    path + '.partial', 'w+', header.dtype, header.shape
  )
  step = 50_000
  with GzipStream(files.store_paths['observation']) as stream:
    npy_stream.read_header(stream)
    for start in range(0, header.shape[0], step):
      stream.readinto(out[start : start + step].reshape(-1).view(np.uint8))
  out.flush()
  del out
  os.rename(path + '.partial', path)
  return header.shape[0]


def png_figures(source):
  """Mean bytes of a frame as a PNG (zlib level 6), PNG decodes/CPU-s."""
  import cv2

  from fixed_replay.io import npy_stream

  path = os.path.join(source, '$store$_observation_ckpt.0.gz')
  frames = npy_stream.read_rows(path, 0, PNG_FRAMES)
  level = [cv2.IMWRITE_PNG_COMPRESSION, 6]
  encoded = [cv2.imencode('.png', frame, level)[1] for frame in frames]
  began = time.process_time()
  for data in encoded:
    cv2.imdecode(data, cv2.IMREAD_UNCHANGED)
  decodes = len(encoded) / (time.process_time() - began)
  return float(np.mean([len(e) for e in encoded])), decodes


class MemmapStore:
  """Uniform sampling over memory-mapped frames with ReplayShard's math."""

  def __init__(self, gzip_run, memmap_dir, num_checkpoints):
    from fixed_replay.io import npy_stream
    from fixed_replay.replay import replay_shard
    from fixed_replay.sources.dopamine import checkpoints

    found = checkpoints.find_checkpoints(str(gzip_run))
    self.shards = []
    for suffix in range(num_checkpoints):
      files = found[suffix]
      window = checkpoints.read_checkpoint(files, 0, 0)  # The small arrays.
      for name in ('action', 'reward', 'terminal'):
        window.store[name] = npy_stream.read_rows(files.store_paths[name])
      path = os.path.join(memmap_dir, f'observation_{suffix}.npy')
      window.store['observation'] = np.load(path, mmap_mode='r')
      self.shards.append(replay_shard.ReplayShard(window, 4, 1, 0.99))
    self.valid_rows = np.concatenate([s.valid_rows for s in self.shards])
    self.ends = np.cumsum([s.num_valid for s in self.shards])

  def sample(self, rng, batch_size, suffixes=None, rows=None):
    from fixed_replay.replay import transitions

    if rows is None:
      positions = rng.integers(0, self.ends[-1], batch_size)
      suffixes = np.searchsorted(self.ends, positions, side='right')
      rows = self.valid_rows[positions]
    elements = transitions.transition_elements(
      len(rows), common.OBSERVATION_SHAPE, common.STACK_SIZE, np.uint8
    )
    batch = transitions.empty_batch(elements)
    for suffix in np.unique(suffixes):
      members = np.flatnonzero(suffixes == suffix)
      self.shards[suffix].write_transitions(rows[members], batch, members)
    return tuple(batch[e.name] for e in elements)


def _rate(sample, seconds):
  """Transitions per CPU-second of this process (all its threads)."""
  for _ in range(3):
    sample()  # Warm-up: compiles the kernels.
  count, began, cpu = 0, time.perf_counter(), time.process_time()
  while time.perf_counter() - began < seconds:
    sample()
    count += 1
  return count * BATCH / (time.process_time() - cpu)


def _digest(batch):
  """Digest of Dopamine's eight elements (ours add the suffix)."""
  return common.array_digest(dict(enumerate(batch[:8])))


def sample_dopamine(seconds, check, unused_count, source, rows):
  """Dopamine's OutOfGraphReplayBuffer on the loaded checkpoint."""
  from dopamine.tf.replay_memory import circular_replay_buffer

  began = time.perf_counter()
  buffer = circular_replay_buffer.OutOfGraphReplayBuffer(
    common.OBSERVATION_SHAPE, common.STACK_SIZE, rows, BATCH
  )
  buffer.load(str(source), 0)
  opened = time.perf_counter() - began
  rate = _rate(buffer.sample_transition_batch, seconds)
  rows = check[1]
  batch = buffer.sample_transition_batch(len(rows), indices=rows)
  return opened, rate, _digest(batch)


def sample_buffer(seconds, check, num_buffers, data_dir):
  """FixedReplayBuffer over the first num_buffers checkpoints."""
  from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer

  began = time.perf_counter()
  buffer = FixedReplayBuffer(
    str(data_dir),
    None,
    replay_file_end_index=num_buffers,
    num_buffers_to_load=num_buffers,
    prefetch=False,
    seed=0,
    batch_size=BATCH,
    sampling_threads=0,
  )
  opened = time.perf_counter() - began
  rate = _rate(buffer.sample_transition_batch, seconds)
  batch = buffer.sample_transition_batch(indices=check[1], suffixes=check[0])
  buffer.close()
  return opened, rate, _digest(batch)


def sample_memmap(seconds, check, num_checkpoints, gzip_run, memmap_dir):
  began = time.perf_counter()
  store = MemmapStore(gzip_run, memmap_dir, num_checkpoints)
  opened = time.perf_counter() - began
  rng = np.random.default_rng(0)
  rate = _rate(lambda: store.sample(rng, BATCH), seconds)
  return opened, rate, _digest(store.sample(rng, 0, *check))


def _check_indices(store, num_checkpoints):
  """CHECK_ROWS valid rows of checkpoint 0, each at a random suffix."""
  from fixed_replay.store import compact_store

  stored = compact_store.StoredCheckpoint(os.path.join(store, 'checkpoint_0'))
  valid = stored.valid_rows_table(common.STACK_SIZE, 1)
  stored.close()
  rng = np.random.default_rng(1)
  rows = rng.choice(valid, CHECK_ROWS).astype(np.int64)
  return rng.integers(0, num_checkpoints, CHECK_ROWS), rows


def _source(game):
  """(label, directory, work directory) of a game's data, or None."""
  if game == 'common':
    rows = common.ROWS.value
    source = common.build_checkpoint(rows, common.SEED.value)
    return 'Breakout (common.py)', source, f'store_breakout_{rows}'
  source = common.DATA_DIR / f'busy_{game}'
  if not (source / 'add_count_ckpt.0.gz').exists():
    print(f'\n{game}: no data in {source} (see Usage)')
    return None
  return f'{game} (random play)', source, f'store_busy_{game}'


def _report_size(converted, inflated, source, store, rows, num):
  """Prints size (1) and conversion (2) of one checkpoint."""
  gzip_bytes = sum(os.path.getsize(source / n) for n in _gzip_files(source))
  png_bytes, png_decodes = png_figures(source)
  stored = sum(f.stat().st_size for f in (store / 'checkpoint_0').iterdir())
  dictionary = sum(f.stat().st_size for f in store.glob('*.dict'))
  convert_rate = converted.digest / (converted.user_s + converted.system_s)
  inflate_rate = rows / (inflated.user_s + inflated.system_s)
  print(f'\n| 1. one checkpoint, {rows:,} rows | bytes/frame | vs gzip |')
  print('|---|---:|---:|')
  for name, size in (
    ("Dopamine's gzip files (baseline)", gzip_bytes),
    (f'compact store + 1/{num} of its dictionary', stored + dictionary / num),
    ('compact store + its whole dictionary', stored + dictionary),
    ("RL Unplugged's PNGs (frames alone)", png_bytes * rows),
    ('uncompressed frames (memory map)', rows * FRAME_BYTES),
  ):
    print(f'| {name} | {size / rows:,.0f} | {size / gzip_bytes:.2f}x |')
  print(
    f'\n2. Conversion, one process: convert {convert_rate:,.0f} frames/CPU-s'
    f' = {convert_rate / inflate_rate:.2f}x inflating the frames alone into '
    f'a .npy ({inflate_rate:,.0f}/CPU-s); decoding the PNGs alone '
    f'{png_decodes:,.0f}/CPU-s; convert peak RSS '
    f'+{common.format_bytes(converted.peak_increase)}'
  )


def _report_sampling(source, store, work, rows, num):
  """Measures and prints sampling (3) and memory (4) over num checkpoints."""
  suffixes, check_rows = _check_indices(store, num)
  checkpoint_bytes = rows * FRAME_BYTES * 1.1
  held = min(num, int(_MAX_MEMORY_GB.value * 1e9 // checkpoint_bytes))
  seconds = _SAMPLE_SECONDS.value
  gzip_run, memmap_dir = os.path.join(work, 'gzip'), os.path.join(work, 'npy')
  ways = [
    ("Dopamine's buffer (baseline)", 1, sample_dopamine, source, rows),
    ('compact store', num, sample_buffer, store),
    ('memory-mapped store (TorchRL)', num, sample_memmap, gzip_run, memmap_dir),
  ]
  if held:
    ways.append(
      ('FixedReplayBuffer, gzip files', held, sample_buffer, gzip_run)
    )
  common.require_memory(max(held, 1) * checkpoint_bytes + common.GIB)
  results = {}
  for name, count, function, *args in ways:
    setup = _setup_dopamine if function is sample_dopamine else _setup
    check = suffixes % count, check_rows
    args = seconds, check, count, *args
    results[name] = count, _measure(setup, function, *args)
  baseline = next(iter(results.values()))[1].digest
  print(
    f'\n| 3-4. batch {BATCH}, {seconds:g} s, run of {num} checkpoints | held '
    '| open s | transitions/CPU-s | vs Dopamine | peak RSS | anonymous |'
  )
  print('|---|---:|---:|---:|---:|---:|---:|')
  for name, (count, measurement) in results.items():
    opened, rate, digest = measurement.digest
    common.assert_same_digest(baseline[2], digest, name)
    print(
      f'| {name} | {count} | {opened:.2f} | {rate:,.0f} | '
      f'{rate / baseline[1]:.2f}x | '
      f'+{common.format_bytes(measurement.peak_increase)} | '
      f'+{common.format_bytes(measurement.anonymous)} |'
    )
  print(
    f'{held} of {num} checkpoints fit --max_memory_gb as gzip shards; every '
    f"way's batch at the same {CHECK_ROWS} rows equals Dopamine's."
  )


def run_game(game, parts, num):
  """Measures one game's data (the parts asked for)."""
  found = _source(game)
  if found is None:
    return
  from fixed_replay.sources.dopamine import checkpoints

  label, source, name = found
  files = checkpoints.find_checkpoints(str(source))[0]
  rows = checkpoints.read_store_headers(files)['observation'].shape[0]
  work = common.DATA_DIR / name
  store, npy = work / 'store', os.path.join(work, 'npy')
  first = os.path.join(npy, 'observation_0.npy')
  print(f'\n== {label}: {source}, {common.load_average()}')
  if 'convert' in parts or not os.path.exists(first):
    shutil.rmtree(work, ignore_errors=True)  # Our own output: made again.
    os.makedirs(npy)
    converted = _measure(_setup, convert_one, source, store)
    inflated = _measure(_setup, write_memmap, source, first)
    if 'convert' in parts:
      _report_size(converted, inflated, source, store, rows, num)
  common.link_checkpoints(
    os.path.join(store, 'checkpoint_0'), store, range(1, num)
  )
  link_gzip_run(source, os.path.join(work, 'gzip'), num)
  for suffix in range(1, num):
    link = os.path.join(npy, f'observation_{suffix}.npy')
    if not os.path.exists(link):
      os.link(first, link)
  if 'sample' in parts:
    _report_sampling(source, store, work, rows, num)


def main(argv):
  del argv
  print(
    f'store_benchmark {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, '
    f'{os.cpu_count()} CPUs, {common.load_average()}'
  )
  for game in _GAMES.value:
    run_game(game, _PARTS.value, _CHECKPOINTS.value)
  print(f'\n{common.load_average()} at end')


if __name__ == '__main__':
  app.run(main)
