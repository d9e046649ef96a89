"""The compact store's layouts on busy frames: size, sampling, decode limit.

Random-policy Breakout frames are nearly static; busier games compress and
sample differently. On checkpoints written by Dopamine's own writer with
`fixed-replay generate --environment=atari --game=G --policy=random`
(benchmarks/data/busy_<G>/, one checkpoint each; generate them first, see
Usage), for each layout (by default format 2 with one and 32 frames a unit,
and format 1's 16-frame blosc2 blocks, the default when issue 18 was filed):

* size of a stored checkpoint against Dopamine's gzip files, and the PNGs
  RL Unplugged would store (the frames encoded with zlib level 6, as
  TensorFlow's encode_png does by default);
* conversion: frames per CPU-second (all threads of the converting process),
  against decoding those PNGs alone (what converting RL Unplugged's shards
  cannot go below), and the CPU-hours of a 50M-frame run (a game's 50
  checkpoints);
* sampling uniformly over `--checkpoints` (default 50) stored checkpoints
  (hard links of the converted one, each with its own manifest and so its
  own decoding dictionary in memory), batch 32: transitions per CPU-second
  in the calling thread, beside the decode limit (1 / (units decoded per
  transition x seconds to decode one unit with the bare decoder, here
  python-zstandard or blosc2, on random units spread over the 50
  checkpoints' dictionaries)) and the ratio to it; peak RSS increase; then 1
  and 2 background threads (per wall second and per CPU-second of the
  process: the machine may be shared);
* Dopamine's OutOfGraphReplayBuffer on the same rows (one checkpoint in RAM,
  uncompressed) and Dopamine 4.x's JAX ReplayBuffer (uniform sampling,
  uncompressed, holding every stacked transition: filled with the first
  `--jax_rows` transitions of the same checkpoint), per CPU-second.

Every measurement runs in a fresh process. Every layout's batch at the same
(checkpoint, row) indices is checked equal to the first layout's.

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
  'sample_seconds', 3.0, 'Seconds of sampling per measurement.'
)
_LAYOUTS = flags.DEFINE_list(
  'layouts',
  ['units1', 'units32', 'blocks16'],
  'Layouts: unitsN (format 2, N frames a unit) or blocksN (format 1).',
)
_JAX_ROWS = flags.DEFINE_integer(
  'jax_rows', 20_000, 'Transitions in Dopamine 4.x JAX ReplayBuffer.'
)

BATCH = 32
TARGET_RATE = 20_000
PNG_FRAMES = 5000
# Sampling before each timed window: a block cache's arena fills in well
# under a second (first touches of fresh memory are slow), threads start.
WARM_UP_S = 1.0


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


def png_figures(source):
  """Mean bytes of a frame as a PNG (zlib level 6) and PNG decodes/CPU-s."""
  import cv2

  from fixed_replay.io import npy_stream

  path = os.path.join(source, '$store$_observation_ckpt.0.gz')
  frames = npy_stream.read_rows(path, 0, PNG_FRAMES)
  encoded = [
    cv2.imencode('.png', f, [cv2.IMWRITE_PNG_COMPRESSION, 6])[1] for f in frames
  ]
  began = time.process_time()
  for data in encoded:
    cv2.imdecode(data, cv2.IMREAD_UNCHANGED)
  decodes = len(encoded) / (time.process_time() - began)
  return float(np.mean([len(e) for e in encoded])), decodes


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


def _unit_decode_seconds(store, num_checkpoints, num_units=3000):
  """CPU-seconds of the bare decoder for one unit.

  Random units of random checkpoints, each checkpoint decoded with its own
  dictionary (as sampling does), in a Python loop over python-zstandard's
  (or blosc2's) call: its per-call cost makes this a slight underestimate
  of the limit.
  """
  import blosc2
  import zstandard

  from fixed_replay.store import compact_store

  rng = np.random.default_rng(1)
  stored = [
    compact_store.StoredCheckpoint(
      os.path.join(store, f'checkpoint_{i}'), verify=False
    )
    for i in range(num_checkpoints)
  ]
  frames = stored[0].frames
  which = rng.integers(0, num_checkpoints, num_units)
  units = rng.integers(0, frames.num_blocks, num_units)
  datas = []
  for unit in units.tolist():
    start, stop = frames.offsets[unit : unit + 2].tolist()
    datas.append(os.pread(frames._fd, stop - start, start))
  if hasattr(frames, 'frame_bytes'):  # Format 2: zstd units.
    size = frames.block_rows * frames.frame_bytes
    decompressors = []
    for checkpoint in stored:
      spec = checkpoint.manifest['observation']
      with open(
        os.path.join(checkpoint.directory, spec['dictionary']), 'rb'
      ) as f:
        dictionary = zstandard.ZstdCompressionDict(f.read())
      decompressors.append(zstandard.ZstdDecompressor(dict_data=dictionary))
      decompressors[-1].decompress(datas[0], max_output_size=size)  # Digest.
    calls = [decompressors[i].decompress for i in which.tolist()]
    began = time.process_time()
    for call, data in zip(calls, datas, strict=True):
      call(data, max_output_size=size)
  else:
    out = np.empty((frames.block_rows,) + frames.row_shape, frames.dtype)
    began = time.process_time()
    for data in datas:
      blosc2.decompress2(data, dst=out, nthreads=1)
  seconds = (time.process_time() - began) / len(datas)
  for checkpoint in stored:
    checkpoint.close()
  return seconds


def _warm_up(buffer):
  """Samples for WARM_UP_S: the cache's arena is touched, threads started."""
  began = time.perf_counter()
  while time.perf_counter() - began < WARM_UP_S:
    buffer.sample_transition_batch()


def _rate(buffer, seconds):
  """(transitions per wall second, per CPU-second of this process)."""
  _warm_up(buffer)
  count, began, cpu = 0, time.perf_counter(), time.process_time()
  while time.perf_counter() - began < seconds:
    buffer.sample_transition_batch()
    count += 1
  wall = time.perf_counter() - began
  return count * BATCH / wall, count * BATCH / (time.process_time() - cpu)


def sample_store(store, seconds, num_checkpoints, check_suffixes, check_rows):
  """Rates, units per transition, decode limit, digest, thread scaling."""
  from fixed_replay.replay.compact_replay_buffer import CompactReplayBuffer

  buffer = CompactReplayBuffer(
    store, batch_size=BATCH, sampling_threads=0, seed=0
  )
  _warm_up(buffer)
  source = buffer._source  # noqa: SLF001  (its decode counter)
  decoded_before = source.units_decoded
  count, began, cpu = 0, time.perf_counter(), time.process_time()
  while time.perf_counter() - began < seconds:
    buffer.sample_transition_batch()
    count += 1
  rate = count * BATCH / (time.process_time() - cpu)
  per_transition = (source.units_decoded - decoded_before) / (count * BATCH)
  batch = buffer.sample_transition_batch(
    indices=check_rows, suffixes=check_suffixes
  )
  digest = common.array_digest(dict(enumerate(batch)))
  buffer.close()
  unit_seconds = _unit_decode_seconds(store, num_checkpoints)
  limit = 1 / (per_transition * unit_seconds)
  background = {}
  for workers in (1, 2):
    buffer = CompactReplayBuffer(
      store, batch_size=BATCH, sampling_threads=workers, seed=0
    )
    background[workers] = _rate(buffer, seconds) + (
      f'{os.getloadavg()[0]:.1f}',
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
  return _rate(buffer, seconds)[1]


class _JaxBuffer:
  """Dopamine 4.x's JAX ReplayBuffer, sampled as the others are."""

  def __init__(self, source, rows):
    from dopamine.jax.replay_memory import accumulator
    from dopamine.jax.replay_memory import elements
    from dopamine.jax.replay_memory import replay_buffer
    from dopamine.jax.replay_memory import samplers

    from fixed_replay.io import npy_stream

    def read(name):
      path = os.path.join(source, f'$store$_{name}_ckpt.0.gz')
      return npy_stream.read_rows(path, 0, rows)

    frames, actions = read('observation'), read('action')
    rewards, terminals = read('reward'), read('terminal')
    self._buffer = replay_buffer.ReplayBuffer(
      accumulator.TransitionAccumulator(
        stack_size=4, update_horizon=1, gamma=0.99
      ),
      samplers.UniformSamplingDistribution(seed=0),
      batch_size=BATCH,
      max_capacity=rows,
      compress=False,
    )
    for frame, action, reward, terminal in zip(
      frames,
      actions.tolist(),
      rewards.tolist(),
      terminals.tolist(),
      strict=True,
    ):
      self._buffer.add(
        elements.TransitionElement(frame, action, reward, bool(terminal))
      )

  def sample_transition_batch(self):
    return self._buffer.sample(BATCH)


def sample_jax(source, rows, seconds):
  """Dopamine 4.x's JAX ReplayBuffer, per CPU-second."""
  return _rate(_JaxBuffer(source, rows), seconds)[1]


def _identity(result):
  return result


def _setup():
  from fixed_replay.replay import compact_replay_buffer  # noqa: F401


def _jax_setup():
  from dopamine.jax.replay_memory import replay_buffer  # noqa: F401

  _setup()


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


def _measure_layout(game, source, layout, check):
  store = str(common.DATA_DIR / f'busy_store_{game}_{layout}')
  shutil.rmtree(store, ignore_errors=True)
  converted = common.measure(
    _setup, convert_one, (source, store, layout), digest=_identity
  )
  frames = converted.digest
  cpu = converted.user_s + converted.system_s
  checkpoint = os.path.join(store, 'checkpoint_0')
  size = sum(
    os.path.getsize(os.path.join(checkpoint, n)) for n in os.listdir(checkpoint)
  )
  _replicate(store, _CHECKPOINTS.value)
  if check is None:
    check = _check_indices(store)
  sampled = common.measure(
    _setup,
    sample_store,
    (store, _SAMPLE_SECONDS.value, _CHECKPOINTS.value, check[0], check[1]),
    digest=_identity,
  )
  rate, per_transition, limit, digest, background = sampled.digest
  return (
    check,
    digest,
    {
      'layout': layout,
      'bytes': size,
      'frames': frames,
      'convert': frames / cpu,
      'rate': rate,
      'units': per_transition,
      'limit': limit,
      'rss': sampled.peak_increase,
      'background': background,
    },
  )


def run_game(game):
  """Measures every layout on one game; returns its rows (None: no data)."""
  source = str(common.DATA_DIR / f'busy_{game}')
  if not os.path.exists(os.path.join(source, 'add_count_ckpt.0.gz')):
    print(f'\n{game}: no data in {source} (see Usage)')
    return None
  gzip_bytes = _files_bytes(source)
  png, png_decodes = common.measure(
    _setup, png_figures, (source,), digest=_identity
  ).digest
  print(f'\n== {game}: gzip {gzip_bytes:,} bytes, load {common.load_average()}')
  rows, check, reference = [], None, None
  for layout in _LAYOUTS.value:
    check, digest, row = _measure_layout(game, source, layout, check)
    if reference is None:
      reference = digest
    else:
      common.assert_same_digest(reference, digest, layout)
    rows.append(row)
  frames = rows[0]['frames']
  seconds = _SAMPLE_SECONDS.value
  dopamine = common.measure(
    _setup, sample_dopamine, (source, frames, seconds), digest=_identity
  )
  jax_rows = min(_JAX_ROWS.value, frames)
  jax = common.measure(
    _jax_setup, sample_jax, (source, jax_rows, seconds), digest=_identity
  )
  baseline = rows[-1]  # The last layout (blocks16 by default).
  print(
    f'PNG: {png:.0f} B/frame, {png_decodes:,.0f} decodes/CPU-s; Dopamine '
    f'OutOfGraphReplayBuffer (one checkpoint in RAM) {dopamine.digest:,.0f} '
    f'transitions/CPU-s, peak RSS '
    f'+{common.format_bytes(dopamine.peak_increase)}'
    f'; Dopamine 4.x JAX ReplayBuffer ({jax_rows:,} transitions in RAM) '
    f'{jax.digest:,.0f}/CPU-s, peak RSS +'
    f'{common.format_bytes(jax.peak_increase)}'
  )
  print(
    '| layout | size vs gzip | vs PNG | convert frames/CPU-s (vs PNG '
    'decoding) | CPU-h per 50M frames | transitions/CPU-s | vs '
    f'{baseline["layout"]} | vs OutOfGraph | vs JAX | units/transition | '
    'decode limit | of limit | peak RSS | 1 thread /wall-s (/CPU-s) | '
    '2 threads /wall-s (/CPU-s) | 2 vs 1 (wall) | load |'
  )
  print('|' + '---|' * 17)
  for row in rows:
    (w1, c1, _), (w2, c2, load) = row['background'][1], row['background'][2]
    per_frame = row['bytes'] / row['frames']
    print(
      f'| {row["layout"]} | {row["bytes"] / gzip_bytes:.2f}x | '
      f'{per_frame / png:.2f}x | {row["convert"]:,.0f} '
      f'({row["convert"] / png_decodes:.2f}x) | '
      f'{50e6 / row["convert"] / 3600:.2f} | {row["rate"]:,.0f} | '
      f'{row["rate"] / baseline["rate"]:.2f}x | '
      f'{row["rate"] / dopamine.digest:.2f}x | '
      f'{row["rate"] / jax.digest:.2f}x | {row["units"]:.2f} | '
      f'{row["limit"]:,.0f} | {row["rate"] / row["limit"]:.2f} | '
      f'{common.format_bytes(row["rss"])} | {w1:,.0f} ({c1:,.0f}) | '
      f'{w2:,.0f} ({c2:,.0f}) | {w2 / w1:.2f}x | {load} |'
    )
  return rows


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
