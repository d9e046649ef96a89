"""The compact store's layouts on busy frames: size, sampling, decode limit.

Random-policy Breakout frames are nearly static; busier games compress and
sample differently. On checkpoints written by Dopamine's own writer with
`fixed-replay generate --environment=atari --game=G --policy=random`
(benchmarks/data/busy_<G>/, one checkpoint each; generate them first, see
Usage), for each layout:

* size of a stored checkpoint against Dopamine's gzip files, and the PNGs
  RL Unplugged would store (the frames encoded with zlib level 6, as
  TensorFlow's encode_png does by default);
* conversion: frames per CPU-second (all threads of the converting process)
  and the CPU-hours of a 50M-frame run (a game's 50 checkpoints);
* sampling uniformly over `--checkpoints` (default 50) stored checkpoints
  (hard links of the converted one, each with its own manifest), batch 32:
  transitions per CPU-second in the calling thread, beside the decode limit
  (1 / (units decoded per transition x seconds to decode one unit, measured
  on the same units with the bare decoder)) and the ratio to it; peak RSS
  increase; then 1 and 2 background threads (per wall second and per
  CPU-second of the process: the machine may be shared);
* Dopamine's OutOfGraphReplayBuffer on the same rows (one checkpoint in RAM,
  uncompressed), per CPU-second.

Every measurement runs in a fresh process. Every layout's batch at the same
(checkpoint, row) indices is checked equal to the default layout's.

Usage:
  for G in MsPacman Asterix Seaquest Breakout; do
    fixed-replay generate --environment=atari --game=$G --policy=random \\
      --checkpoint_rows=100000 --num_checkpoints=1 \\
      --output_dir=benchmarks/data/busy_$G
  done
  python benchmarks/busy_store_benchmark.py [--games=MsPacman,Asterix]
"""

import os
import shutil
import time

from absl import app
from absl import flags
import common
import numpy as np

_GAMES = flags.DEFINE_list(
  'games', ['MsPacman', 'Asterix', 'Seaquest', 'Breakout'], 'Games to run.'
)
_CHECKPOINTS = flags.DEFINE_integer('checkpoints', 50, 'Stored checkpoints.')
_SAMPLE_SECONDS = flags.DEFINE_float(
  'sample_seconds', 8.0, 'Seconds of sampling per measurement.'
)
_LAYOUTS = flags.DEFINE_list(
  'layouts',
  ['units1', 'units32', 'blocks16', 'blocks32'],
  'Layouts: unitsN (format 2, N frames a unit) or blocksN (format 1).',
)

BATCH = 32
TARGET_RATE = 20_000
PNG_FRAMES = 5000


def _options(layout):
  from fixed_replay.store import convert

  if layout.startswith('units'):
    return convert.ConvertOptions(block_rows=int(layout[5:]))
  return convert.ConvertOptions(layout='blocks', block_rows=int(layout[6:]))


def _files_bytes(directory, suffix=0):
  return sum(
    os.path.getsize(os.path.join(directory, name))
    for name in os.listdir(directory)
    if name.endswith(f'_ckpt.{suffix}.gz')
  )


def _png_bytes(source):
  """Mean bytes of a frame as a PNG (zlib level 6), on PNG_FRAMES frames."""
  import cv2

  from fixed_replay.io import npy_stream

  path = os.path.join(source, '$store$_observation_ckpt.0.gz')
  frames = npy_stream.read_rows(path, 0, PNG_FRAMES)
  return np.mean(
    [
      len(cv2.imencode('.png', f, [cv2.IMWRITE_PNG_COMPRESSION, 6])[1])
      for f in frames
    ]
  )


def convert_one(source, store, layout):
  from fixed_replay.store import convert

  result = convert.convert(source, store, _options(layout), workers=0)
  return result.frames


def _replicate(store, num_checkpoints):
  """Checkpoints 1..n-1 as hard links of checkpoint 0, own manifests."""
  from fixed_replay.store import manifest as manifest_lib

  origin = os.path.join(store, manifest_lib.checkpoint_dirname(0))
  manifest = manifest_lib.read_manifest(origin)
  for suffix in range(1, num_checkpoints):
    target = os.path.join(store, manifest_lib.checkpoint_dirname(suffix))
    if os.path.exists(target):
      continue
    os.mkdir(target)
    for name in os.listdir(origin):
      if name != manifest_lib.MANIFEST:
        os.link(os.path.join(origin, name), os.path.join(target, name))
    copy = dict(manifest, suffix=suffix)
    copy['source'] = dict(manifest['source'])
    copy['source']['files'] = {
      name.replace('.0.gz', f'.{suffix}.gz'): size
      for name, size in manifest['source']['files'].items()
    }
    manifest_lib.write_manifest(target, copy)


def _unit_decode_seconds(stored, num_units=3000):
  """Seconds the bare decoder takes for one unit (random units)."""
  frames = stored.frames
  rng = np.random.default_rng(1)
  units = np.sort(rng.choice(frames.num_blocks, num_units, replace=False))
  datas = []
  for unit in units.tolist():
    start, stop = frames.offsets[unit : unit + 2].tolist()
    datas.append(os.pread(frames._fd, stop - start, start))
  size = (
    frames.block_rows * frames.frame_bytes
    if hasattr(frames, 'frame_bytes')
    else None
  )
  began = time.process_time()
  if size is not None:
    decompress = frames._decompressor().decompress
    for data in datas:
      decompress(data, max_output_size=size)
  else:
    import blosc2

    out = np.empty((frames.block_rows,) + frames.row_shape, frames.dtype)
    for data in datas:
      blosc2.decompress2(data, dst=out, nthreads=1)
  return (time.process_time() - began) / len(datas)


def sample_store(store, seconds, check_suffixes, check_rows):
  """Per-CPU-second rate, decode limit, digest, and background rates."""
  from fixed_replay.replay.compact_replay_buffer import CompactReplayBuffer
  from fixed_replay.store import compact_store
  from fixed_replay.store import frame_units

  decoded = [0]
  original = frame_units.read_frames_of

  def counting(sources, which, rows, out):
    decoded[0] += len(rows)
    return original(sources, which, rows, out)

  frame_units.read_frames_of = counting
  buffer = CompactReplayBuffer(
    store, batch_size=BATCH, sampling_threads=0, seed=0
  )
  buffer.sample_transition_batch()
  misses0, decoded[0] = buffer.cache.misses, 0
  count, began, cpu = 0, time.perf_counter(), time.process_time()
  while time.perf_counter() - began < seconds:
    buffer.sample_transition_batch()
    count += 1
  rate = count * BATCH / (time.process_time() - cpu)
  units = decoded[0] + buffer.cache.misses - misses0
  per_transition = units / (count * BATCH)
  batch = buffer.sample_transition_batch(
    indices=check_rows, suffixes=check_suffixes
  )
  digest = common.array_digest(dict(enumerate(batch)))
  buffer.close()
  frame_units.read_frames_of = original
  stored = compact_store.StoredCheckpoint(
    os.path.join(store, 'checkpoint_0'), verify=False
  )
  unit_seconds = _unit_decode_seconds(stored)
  stored.close()
  limit = 1 / (per_transition * unit_seconds)
  background = {}
  for workers in (1, 2):
    buffer = CompactReplayBuffer(
      store, batch_size=BATCH, sampling_threads=workers, seed=0
    )
    buffer.sample_transition_batch()
    count, began, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - began < seconds:
      buffer.sample_transition_batch()
      count += 1
    wall = time.perf_counter() - began
    background[workers] = (
      count * BATCH / wall,
      count * BATCH / (time.process_time() - cpu),
    )
    buffer.close()
  return rate, per_transition, limit, digest, background


def sample_dopamine(source, rows, seconds):
  """Dopamine's OutOfGraphReplayBuffer over one checkpoint, per CPU-second."""
  from dopamine.replay_memory import circular_replay_buffer

  buffer = circular_replay_buffer.OutOfGraphReplayBuffer(
    observation_shape=(84, 84),
    stack_size=4,
    replay_capacity=rows,
    batch_size=BATCH,
  )
  buffer.load(source, '0')
  buffer.sample_transition_batch()
  count, began, cpu = 0, time.perf_counter(), time.process_time()
  while time.perf_counter() - began < seconds:
    buffer.sample_transition_batch()
    count += 1
  return count * BATCH / (time.process_time() - cpu)


def _identity(result):
  return result


def _setup():
  from fixed_replay.replay import compact_replay_buffer  # noqa: F401


def _check_indices(store):
  from fixed_replay.store import compact_store

  rng = np.random.default_rng(7)
  stored = compact_store.StoredCheckpoint(
    os.path.join(store, 'checkpoint_0'), verify=False
  )
  valid = stored.valid_rows_table(4, 1)
  stored.close()
  return (
    rng.integers(0, _CHECKPOINTS.value, 64),
    rng.choice(valid, 64),
  )


def run_game(game):
  source = str(common.DATA_DIR / f'busy_{game}')
  if not os.path.exists(os.path.join(source, 'add_count_ckpt.0.gz')):
    print(f'\n{game}: no data in {source} (see Usage)')
    return
  gzip_bytes = _files_bytes(source)
  gzip_frame = os.path.getsize(
    os.path.join(source, '$store$_observation_ckpt.0.gz')
  )
  png = common.measure(_setup, _png_bytes, (source,), digest=_identity).digest
  print(f'\n== {game}: gzip {gzip_bytes:,} bytes')
  rows_line = []
  check = None
  reference = None
  for layout in _LAYOUTS.value:
    store = str(common.DATA_DIR / f'busy_store_{game}_{layout}')
    shutil.rmtree(store, ignore_errors=True)
    converted = common.measure(
      _setup, convert_one, (source, store, layout), digest=_identity
    )
    frames = converted.digest
    cpu = converted.user_s + converted.system_s
    checkpoint = os.path.join(store, 'checkpoint_0')
    size = sum(
      os.path.getsize(os.path.join(checkpoint, n))
      for n in os.listdir(checkpoint)
    )
    _replicate(store, _CHECKPOINTS.value)
    if check is None:
      check = _check_indices(store)
    sampled = common.measure(
      _setup,
      sample_store,
      (store, _SAMPLE_SECONDS.value, check[0], check[1]),
      digest=_identity,
    )
    rate, per_transition, limit, digest, background = sampled.digest
    if reference is None:
      reference = digest
    else:
      common.assert_same_digest(reference, digest, layout)
    rows_line.append(
      (
        layout,
        size / gzip_bytes,
        size / frames,
        frames / cpu,
        cpu / frames * 50e6 / 3600,
        rate,
        per_transition,
        limit,
        rate / limit,
        sampled.peak_increase,
        background,
      )
    )
  dopamine = common.measure(
    _setup,
    sample_dopamine,
    (source, frames, _SAMPLE_SECONDS.value),
    digest=_identity,
  )
  print(
    f'observation bytes/frame: gzip {gzip_frame / frames:.0f}, '
    f'RL Unplugged PNG {png:.0f} (store files vs PNG: see column)'
  )
  print(
    '| layout | size vs gzip | B/frame (all files) | vs PNG frames | '
    'convert frames/CPU-s | CPU-h per 50M frames | transitions/CPU-s | '
    'units/transition | decode limit | ratio | peak RSS | 1 thread /wall-s '
    '(/CPU-s) | 2 threads /wall-s (/CPU-s) | 2 vs 1 (wall) |'
  )
  print('|' + '---|' * 14)
  for (
    layout,
    ratio,
    per_frame,
    conversion,
    hours,
    rate,
    units,
    limit,
    of_limit,
    rss,
    background,
  ) in rows_line:
    (w1, c1), (w2, c2) = background[1], background[2]
    print(
      f'| {layout} | {ratio:.2f}x | {per_frame:.0f} | '
      f'{per_frame / png:.2f}x | {conversion:,.0f} | {hours:.2f} | '
      f'{rate:,.0f} | {units:.2f} | {limit:,.0f} | {of_limit:.2f} | '
      f'{common.format_bytes(rss)} | {w1:,.0f} ({c1:,.0f}) | '
      f'{w2:,.0f} ({c2:,.0f}) | {w2 / w1:.2f}x |'
    )
  print(
    f'Dopamine OutOfGraphReplayBuffer, one checkpoint in RAM: '
    f'{dopamine.digest:,.0f} transitions/CPU-s (peak RSS '
    f'{common.format_bytes(dopamine.peak_increase)})'
  )


def main(argv):
  del argv
  print(
    f'busy_store_benchmark {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}'
    f', {os.cpu_count()} cores, load {common.load_average()}; '
    f'{_CHECKPOINTS.value} checkpoints, batch {BATCH}, target '
    f'{TARGET_RATE:,} transitions/CPU-s'
  )
  for game in _GAMES.value:
    run_game(game)


if __name__ == '__main__':
  app.run(main)
