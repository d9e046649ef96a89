"""The compact store's layouts on busy frames: size, sampling, decode limit.

Random-policy Breakout frames are nearly static; busier games compress and
sample differently. On checkpoints written by Dopamine's own writer with
`fixed-replay generate --environment=atari --game=G --policy=random`
(benchmarks/data/busy_<G>/, one checkpoint each; generate them first, see
Usage), for each layout (by default one frame a unit, the default, and 16,
the small point; format 1's blosc2 blocks are no longer written):

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
  transition x CPU-seconds to decode one unit with the bare decoder: zstd
  alone in compiled code, or blosc2, on transitions' units at random rows
  of random checkpoints, each with its own dictionary, from memory) and the
  ratio to it; peak RSS increase; then 1 and 2 background threads (per wall
  second and per CPU-second of the process: the machine may be shared;
  medians of three alternating windows each, and the range of their
  ratios), beside what two threads of the bare decoder get over one at
  that moment (the ceiling the machine leaves);
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

With --frontier, only each layout's size, its sampling speed in the calling
thread and its conversion speed, and with --plot=PNG the plot of size
against sampling speed: the frontier of --layouts=units1,units2,units4,units8.
"""

import os
import shutil
import threading
import time

from absl import app
from absl import flags
import common
import numba
import numpy as np

from fixed_replay.store import unit_decoding

_GAMES = flags.DEFINE_list(
  'games', ['MsPacman', 'Asterix', 'Seaquest', 'Breakout'], 'Games to run.'
)
_CHECKPOINTS = flags.DEFINE_integer('checkpoints', 50, 'Stored checkpoints.')
_SAMPLE_SECONDS = flags.DEFINE_float(
  'sample_seconds', 3.0, 'Seconds of sampling per measurement.'
)
_LAYOUTS = flags.DEFINE_list(
  'layouts',
  ['units1', 'units16'],
  'Layouts: unitsN (N frames a unit). The last is the baseline.',
)
_FRONTIER = flags.DEFINE_bool(
  'frontier',
  False,
  'Only size, in-process sampling and conversion speed for each layout '
  '(with --layouts=units1,units2,units4,units8: the frontier).',
)
_PLOT = flags.DEFINE_string(
  'plot', None, 'With --frontier, where to save the plot (PNG).'
)
_JAX_ROWS = flags.DEFINE_integer(
  'jax_rows', 20_000, 'Transitions in Dopamine 4.x JAX ReplayBuffer.'
)

BATCH = 32
# One core feeding 1,250 updates a second at batch 32 (issue 35).
TARGET_RATE = 40_000
THREAD_REPEATS = 3
PNG_FRAMES = 5000
# Frames zstd alone compresses, the conversion's yardstick.
ZSTD_ALONE_FRAMES = 5000
# Sampling before each timed window: a block cache's arena fills in well
# under a second (first touches of fresh memory are slow), threads start.
WARM_UP_S = 1.0


def _options(layout):
  from fixed_replay.convert import convert

  return convert.ConvertOptions(block_rows=int(layout.removeprefix('units')))


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
  from fixed_replay.convert import convert

  result = convert.convert(source, store, _options(layout), workers=0)
  return result.frames


def _replicate(store, num_checkpoints):
  """Checkpoints 1..n-1 as hard links of checkpoint 0, own manifests."""
  from fixed_replay.store import manifest as manifest_lib

  origin = os.path.join(store, manifest_lib.checkpoint_dirname(0))
  link_checkpoints(origin, store, range(1, num_checkpoints))


def link_checkpoints(origin, store, suffixes, **fields):
  """store/checkpoint_<s>/ for each suffix: hard links of the stored
  checkpoint `origin`, each with its own manifest (`fields` changed)."""
  from fixed_replay.store import manifest as manifest_lib

  manifest = manifest_lib.read_manifest(origin)
  for suffix in suffixes:
    target = os.path.join(store, manifest_lib.checkpoint_dirname(suffix))
    if os.path.exists(target):
      continue
    os.makedirs(target)
    for name in os.listdir(origin):
      if name != manifest_lib.MANIFEST:
        os.link(os.path.join(origin, name), os.path.join(target, name))
    copy = dict(manifest, suffix=suffix, **fields)
    copy['source'] = dict(manifest['source'])
    copy['source']['files'] = {
      name.replace('.0.gz', f'.{suffix}.gz'): size
      for name, size in manifest['source']['files'].items()
    }
    manifest_lib.write_manifest(target, copy)


@numba.njit(nogil=True, cache=True)
def _zstd_only(function, context, data_at, positions, lengths, ddicts, out):
  """zstd on in-memory units, nothing else: the decoder's own speed."""
  for k in range(len(positions)):
    unit_decoding._call_zstd(
      function,
      context,
      np.int64(out.ctypes.data),
      out.size,
      data_at + positions[k],
      lengths[k],
      ddicts[k],
    )


class _BareDecoder:
  """The bare decoder on a sampling-like draw of a stored layout's units.

  Runs of a transition's units (5 one-frame units, or 1 larger unit) at
  random rows of random checkpoints, each checkpoint with its own
  dictionary as sampling has them, from memory: zstd alone in compiled code
  (format 2) or blosc2's calls in a loop (format 1, which drops the GIL).
  """

  def __init__(self, store, num_checkpoints, num_transitions=1000):
    from fixed_replay.store import compact_store

    self._stored = [
      compact_store.StoredCheckpoint(os.path.join(store, f'checkpoint_{i}'))
      for i in range(num_checkpoints)
    ]
    frames = self._stored[0].frames
    rng = np.random.default_rng(1)
    per = 5 if frames.block_rows == 1 else 1
    starts = rng.integers(0, frames.num_blocks - per - 1, num_transitions)
    which = np.repeat(rng.integers(0, num_checkpoints, num_transitions), per)
    units = (starts[:, None] + np.arange(per)).ravel()
    self.num_units = len(units)
    self._positions, ends = frames.unit_spans(units)
    self._lengths = ends - self._positions
    self._data = np.fromfile(frames.path, np.uint8)
    self._zstd = hasattr(frames, 'frame_bytes')
    if self._zstd:
      rows = np.stack([s.frames.table_row() for s in self._stored])
      self._ddicts = rows[which, unit_decoding.DDICT]
      self._unit_bytes = frames.block_rows * frames.frame_bytes
      if rows[0, unit_decoding.HEADER] >= 0:  # As the decoder gives them.
        self._whole_frames(int(rows[0, unit_decoding.HEADER]))
    else:
      self._shape = (frames.block_rows,) + frames.row_shape
      self._dtype = frames.dtype
    self.run()  # Compiles; digests every dictionary.

  def _whole_frames(self, header):
    """Each drawn unit with its stripped bytes before it, end to end."""
    stripped = unit_decoding.ZSTD_MAGIC.to_bytes(4, 'little')
    stripped = np.frombuffer(stripped + header.to_bytes(2, 'little'), np.uint8)
    self._data = np.concatenate(
      [
        np.concatenate([stripped, self._data[p : p + n]])
        for p, n in zip(self._positions, self._lengths, strict=True)
      ]
    )
    self._lengths = self._lengths + unit_decoding.STRIPPED
    self._positions = np.cumsum(self._lengths) - self._lengths

  def run(self):
    """Decodes every drawn unit once (in the calling thread)."""
    if self._zstd:
      _zstd_only(
        unit_decoding.FUNCTIONS[0],
        unit_decoding.context(),
        np.int64(self._data.ctypes.data),
        self._positions,
        self._lengths,
        self._ddicts,
        np.empty(self._unit_bytes, np.uint8),
      )
      return
    import blosc2

    out = np.empty(self._shape, self._dtype)
    data = self._data
    for position, length in zip(
      self._positions.tolist(), self._lengths.tolist(), strict=True
    ):
      blosc2.decompress2(data[position : position + length], dst=out)

  def unit_seconds(self, repeats=3):
    """CPU-seconds for one unit (best of `repeats`)."""
    best = float('inf')
    for _ in range(repeats):
      began = time.thread_time()
      self.run()
      best = min(best, time.thread_time() - began)
    return best / self.num_units

  def two_thread_scaling(self, repeats=3):
    """Wall rate of 2 threads each decoding everything, over 1 thread's.

    What this machine gives GIL-free work right now: the ceiling for the
    buffer's two sampling threads.
    """
    ratios = []
    for _ in range(repeats):
      began = time.perf_counter()
      self.run()
      one = time.perf_counter() - began
      threads = [threading.Thread(target=self.run) for _ in range(2)]
      began = time.perf_counter()
      for thread in threads:
        thread.start()
      for thread in threads:
        thread.join()
      ratios.append(2 * one / (time.perf_counter() - began))
    return float(np.median(ratios))

  def close(self):
    for stored in self._stored:
      stored.close()


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


class _GilFreeClock:
  """CPU time this thread spends in the calls that release the GIL.

  Wraps the compiled transition, decode and stacking calls and blosc2's
  decompression for the timed window: their share of a batch's CPU time
  bounds what a second sampling thread can add (Amdahl), whatever the
  machine's load.
  """

  def __init__(self):
    import blosc2

    from fixed_replay.replay import batch_kernels

    self.seconds = 0.0
    self._wrapped = []
    for module, name in (
      (batch_kernels, 'write_parts'),
      (batch_kernels, 'decode_stacks'),
      (unit_decoding, 'decode_units'),
      (batch_kernels, '_gather_uint8_stack4'),
      (batch_kernels, '_gather_pairs_uint8_stack4'),
      (blosc2, 'decompress2'),
    ):
      original = getattr(module, name)
      self._wrapped.append((module, name, original))
      setattr(module, name, self._timed(original))

  def _timed(self, function):
    def timed(*args, **kwargs):
      began = time.thread_time()
      try:
        return function(*args, **kwargs)
      finally:
        self.seconds += time.thread_time() - began

    return timed

  def restore(self):
    for module, name, original in self._wrapped:
      setattr(module, name, original)


def sample_store(store, seconds, num_checkpoints, check_suffixes, check_rows):
  """Rate, units per transition, GIL-free share, digest, threads' rates."""
  from fixed_replay.replay.compact_replay_buffer import CompactReplayBuffer

  rate, per_transition, gil_free, digest = sample_in_process(
    store, seconds, check_suffixes, check_rows
  )
  # One and two threads alternate, THREAD_REPEATS times: on a shared or
  # virtual machine one window of each swings by 20% either way.
  rates = {1: [], 2: []}
  for _ in range(THREAD_REPEATS):
    for workers in (1, 2):
      buffer = CompactReplayBuffer(
        store, batch_size=BATCH, sampling_threads=workers, seed=0
      )
      rates[workers].append(_rate(buffer, seconds))
      buffer.close()
  ratios = [
    two[0] / one[0] for one, two in zip(rates[1], rates[2], strict=True)
  ]
  background = {
    'one': np.median(rates[1], axis=0),
    'two': np.median(rates[2], axis=0),
    'ratios': ratios,
    'load': f'{os.getloadavg()[0]:.1f}',
  }
  return rate, per_transition, gil_free, digest, background


def sample_in_process(store, seconds, check_suffixes, check_rows):
  """Rate (per CPU-s, calling thread), units per transition, GIL-free
  share, and the digest of a batch at fixed indices."""
  from fixed_replay.replay.compact_replay_buffer import CompactReplayBuffer

  buffer = CompactReplayBuffer(
    store, batch_size=BATCH, sampling_threads=0, seed=0
  )
  _warm_up(buffer)
  source = buffer._source  # noqa: SLF001  (its decode counter)
  decoded_before = source.units_decoded
  clock = _GilFreeClock()
  count, began, cpu = 0, time.perf_counter(), time.process_time()
  thread_cpu = time.thread_time()
  while time.perf_counter() - began < seconds:
    buffer.sample_transition_batch()
    count += 1
  rate = count * BATCH / (time.process_time() - cpu)
  gil_free = clock.seconds / (time.thread_time() - thread_cpu)
  clock.restore()
  per_transition = (source.units_decoded - decoded_before) / (count * BATCH)
  batch = buffer.sample_transition_batch(
    indices=check_rows, suffixes=check_suffixes
  )
  digest = common.array_digest(dict(enumerate(batch)))
  buffer.close()
  return rate, per_transition, gil_free, digest


def bare_decoder(store, num_checkpoints):
  """(CPU-seconds a unit, 2-thread scaling) of the bare decoder."""
  decoder = _BareDecoder(store, num_checkpoints)
  result = decoder.unit_seconds(), decoder.two_thread_scaling()
  decoder.close()
  return result


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
  stored = compact_store.StoredCheckpoint(os.path.join(store, 'checkpoint_0'))
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
  size = _checkpoint_bytes(store)
  _replicate(store, _CHECKPOINTS.value)
  if check is None:
    check = _check_indices(store)
  sampled = common.measure(
    _setup,
    sample_store,
    (store, _SAMPLE_SECONDS.value, _CHECKPOINTS.value, check[0], check[1]),
    digest=_identity,
  )
  rate, per_transition, gil_free, digest, background = sampled.digest
  # Its own process: the peak RSS above is the buffer's alone.
  unit_seconds, machine = common.measure(
    _setup, bare_decoder, (store, _CHECKPOINTS.value), digest=_identity
  ).digest
  limit = 1 / (per_transition * unit_seconds)
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
      'machine': machine,
      'gil_free': gil_free,
    },
  )


def zstd_alone(source, store, num_frames=ZSTD_ALONE_FRAMES):
  """Frames/CPU-s of zstd alone compressing the checkpoint's first frames
  into the store's units, with its dictionary and level, in one thread."""
  from fixed_replay.convert import unit_compression
  from fixed_replay.io import npy_stream
  from fixed_replay.store import manifest as manifest_lib
  from fixed_replay.store import run_dictionary

  checkpoint = os.path.join(store, 'checkpoint_0')
  spec = manifest_lib.read_manifest(checkpoint)['observation']
  with open(run_dictionary.checkpoint_path(checkpoint), 'rb') as stream:
    dictionary = stream.read()
  compressor = unit_compression.UnitCompressor(
    dictionary, unit_compression.zstd_level(spec['clevel'])
  )
  path = os.path.join(source, '$store$_observation_ckpt.0.gz')
  frames = npy_stream.read_rows(path, 0, num_frames)
  rows = spec['block_rows']
  began = time.process_time()
  for start in range(0, num_frames, rows):
    compressor.compress(frames[start : start + rows])
  return num_frames / (time.process_time() - began)


def _wait_for_quiet(limit_s=90):
  """Waits (at most limit_s) for the 1-minute load average to fall below
  1: the conversions before ran on both cores."""
  began = time.perf_counter()
  while os.getloadavg()[0] >= 1.0 and time.perf_counter() - began < limit_s:
    time.sleep(2)


def frontier(games):
  """Each layout's size, conversion speed (and zstd's alone) and sampling
  speed: every conversion first, then, on a quiet machine, every sampling.
  Returns (game, layout, size vs gzip, transitions/CPU-s) rows."""
  stores = {}
  for game in games:
    source = str(common.DATA_DIR / f'busy_{game}')
    if not os.path.exists(os.path.join(source, 'add_count_ckpt.0.gz')):
      print(f'\n{game}: no data in {source} (see Usage)')
      continue
    for layout in _LAYOUTS.value:
      store = str(common.DATA_DIR / f'busy_store_{game}_{layout}')
      shutil.rmtree(store, ignore_errors=True)
      converted = common.measure(
        _setup, convert_one, (source, store, layout), digest=_identity
      )
      cpu = converted.user_s + converted.system_s
      alone = common.measure(
        _setup, zstd_alone, (source, store), digest=_identity
      ).digest
      stores[game, layout] = {
        'store': store,
        'size': _checkpoint_bytes(store) / _files_bytes(source),
        'convert': converted.digest / cpu,
        'zstd': alone,
      }
      _replicate(store, _CHECKPOINTS.value)
  _wait_for_quiet()
  rows, checks, references = [], {}, {}
  for (game, layout), row in stores.items():
    if layout == _LAYOUTS.value[0]:
      print(f'\n== {game}, sampled at {common.load_average()}')
      print(
        '| layout | size vs gzip | transitions/CPU-s | units/transition | '
        'convert frames/CPU-s | zstd alone frames/CPU-s | convert CPU vs '
        "zstd's | load |"
      )
      print('|---|---|---|---|---|---|---|---|')
    check = checks.setdefault(game, _check_indices(row['store']))
    rate, per_transition, _, digest = common.measure(
      _setup,
      sample_in_process,
      (row['store'], _SAMPLE_SECONDS.value, check[0], check[1]),
      digest=_identity,
    ).digest
    common.assert_same_digest(
      references.setdefault(game, digest), digest, layout
    )
    rows.append((game, layout, row['size'], rate))
    print(
      f'| {layout} | {row["size"]:.2f}x | {rate:,.0f} | '
      f'{per_transition:.2f} | {row["convert"]:,.0f} | {row["zstd"]:,.0f} | '
      f'{row["zstd"] / row["convert"]:.2f}x | {os.getloadavg()[0]:.2f} |'
    )
  for row in stores.values():
    shutil.rmtree(row['store'])
  return rows


def plot_frontier(rows, path):
  """Size vs gzip against transitions/CPU-s, a line per game."""
  import matplotlib

  matplotlib.use('Agg')
  from matplotlib import pyplot

  figure, axes = pyplot.subplots(figsize=(6, 4))
  for game in dict.fromkeys(row[0] for row in rows):
    mine = [row for row in rows if row[0] == game]
    axes.plot([r[3] for r in mine], [r[2] for r in mine], 'o-', label=game)
    for _, layout, size, rate in mine:
      axes.annotate(layout[5:], (rate, size), fontsize=7)
  axes.axhline(1.0, color='gray', linewidth=0.5)
  axes.axvline(TARGET_RATE, color='gray', linewidth=0.5)
  axes.set_xlabel('transitions per CPU-second (batch 32, one thread)')
  axes.set_ylabel("store size / Dopamine's gzip")
  axes.set_title('Frames a unit (labels): size against sampling speed')
  axes.legend()
  figure.tight_layout()
  figure.savefig(path, dpi=100)
  print(f'\nplot: {path}')


def _checkpoint_bytes(store):
  checkpoint = os.path.join(store, 'checkpoint_0')
  return sum(
    os.path.getsize(os.path.join(checkpoint, n)) for n in os.listdir(checkpoint)
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
  print(f'\n== {game}: gzip {gzip_bytes:,} bytes, {common.load_average()}')
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
  baseline = rows[-1]  # The last layout (units16 by default).
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
    '2 threads /wall-s (/CPU-s) | 2 vs 1 (wall, median (range) of '
    f'{THREAD_REPEATS}) | bare decoder 2 vs 1 | '
    'load | GIL-free share (2-thread ceiling) |'
  )
  print('|' + '---|' * 19)
  for row in rows:
    threads = row['background']
    (w1, c1), (w2, c2) = threads['one'], threads['two']
    ratios = threads['ratios']
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
      f'{w2:,.0f} ({c2:,.0f}) | {np.median(ratios):.2f}x '
      f'({min(ratios):.2f}-{max(ratios):.2f}) | {row["machine"]:.2f}x | '
      f'{threads["load"]} | {row["gil_free"]:.2f} '
      f'({1 / (1 - row["gil_free"] / 2):.2f}x) |'
    )
  return rows


def main(argv):
  del argv
  print(
    f'busy_store_benchmark {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}'
    f', {os.cpu_count()} cores, {common.load_average()}; '
    f'{_CHECKPOINTS.value} checkpoints, batch {BATCH}, target '
    f'{TARGET_RATE:,} transitions/CPU-s'
  )
  if not _FRONTIER.value:
    for game in _GAMES.value:
      run_game(game)
    return
  rows = frontier(_GAMES.value)
  if rows and _PLOT.value:
    plot_frontier(rows, _PLOT.value)


if __name__ == '__main__':
  app.run(main)
