"""Converting RL Unplugged shards: speed per core, memory, bytes per frame.

Data (built once under benchmarks/data/rlu_breakout_<N>/, git-ignored): real
Breakout played at random (actions held 1-6 steps, as common.py does),
written in RL Unplugged's format: GZIP TFRecord shards, one tf.train.Example
per episode, frames PNG-encoded by OpenCV. Three runs of it:

  small  one shard of N frames (checkpoint 0);
  large  one shard of 4N frames (the small shard's episodes four times, with
         new episode_idx): memory must not grow with the shard;
  pair   two shards of 4N frames (checkpoints 0 and 1), converted by two
         worker processes.

Measured, each in a fresh process (common.measure; TensorFlow and the
modules imported before the clock starts):

  1. the baseline: cv2.imdecode of the small shard's PNGs, one thread, in
     memory (frames per CPU-second), at the start and again after 2;
  2. `fixed-replay convert` of the pair run as it runs by default, one
     worker process per checkpoint (threads=1 each), into the compact store
     at the store's default (the same for every source: zstd units, clevel
     5) and at clevel 3 (this route's default before 2026-12-04), and into
     Dopamine's files at gzip level 2
     (the default) and 6: frames per CPU-second of the workers, less their
     start-up (imports, measured apart), against (1): target >= 70%;
  3. the small and the large shard converted in one process: the peak RSS
     above the imports, which must not grow with the shard;
  4. bytes per frame of the RL Unplugged input, the compact store, our
     Dopamine files, and Dopamine's own gzip (Python's gzip at level 9 over
     np.save of the same rows, which is what its save() writes), with that
     gzip's speed;
  5. the check `download` runs on each copied shard, on the large one,
     against TensorFlow's reader over the same records (CPU ratio).

Usage: python benchmarks/rlu_convert_benchmark.py [--frames=100000]
"""

import dataclasses
import gzip
import io
import os
import resource
import shutil
import time

from absl import app
from absl import flags
from absl import logging
import common
import numpy as np

_FRAMES = flags.DEFINE_integer(
  'frames', 100_000, 'Frames of the small shard (large: 4x, pair: 2 x 4x).'
)
_LARGE_FACTOR = 4
_TARGET = 0.70
_GAME = 'Breakout'


def setup():
  import cv2  # noqa: F401
  import tensorflow as tf  # noqa: F401

  from fixed_replay.convert import rlu_convert  # noqa: F401


# ---------------------------------------------------------------- data


def _example(frames, actions, rewards, terminal, checkpoint, episode):
  import cv2
  import tensorflow as tf

  pngs = [cv2.imencode('.png', f)[1].tobytes() for f in frames]
  discounts = [1.0] * len(actions)
  if terminal:
    discounts[-1] = 0.0

  def ints(values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

  def floats(values):
    return tf.train.Feature(float_list=tf.train.FloatList(value=values))

  total = float(np.sum(rewards))
  feature = {
    'checkpoint_idx': ints([checkpoint]),
    'episode_idx': ints([episode]),
    'episode_return': floats([total]),
    'clipped_episode_return': floats([total]),
    'observations': tf.train.Feature(bytes_list=tf.train.BytesList(value=pngs)),
    'actions': ints(actions),
    'unclipped_rewards': floats(rewards),
    'clipped_rewards': floats(rewards),
    'discounts': floats(discounts),
  }
  example = tf.train.Example(features=tf.train.Features(feature=feature))
  return example.SerializeToString()


def _play_shard(path, num_frames, seed):
  """Plays Breakout into one shard of `num_frames` frames (checkpoint 0)."""
  from dopamine.discrete_domains import atari_lib
  import tensorflow as tf

  env = atari_lib.create_atari_environment(_GAME)
  env.environment.reset(seed=seed)
  rng = np.random.default_rng(seed)
  written, episode = 0, 0
  with tf.io.TFRecordWriter(str(path), options='GZIP') as writer:
    while written < num_frames:
      observation = env.reset()[..., 0]
      frames, actions, rewards = [], [], []
      action, repeat, terminal = 0, 0, False
      limit = min(common.MAX_EPISODE_STEPS, num_frames - written)
      while not terminal and len(actions) < limit:
        if repeat == 0:
          action = int(rng.integers(env.action_space.n))
          repeat = int(rng.integers(1, common.MAX_ACTION_REPEAT + 1))
        repeat -= 1
        frames.append(observation)
        observation, reward, terminal, _ = env.step(action)
        observation = observation[..., 0]
        actions.append(action)
        rewards.append(float(np.clip(reward, -1, 1)))
      writer.write(_example(frames, actions, rewards, terminal, 0, episode))
      written += len(actions)
      episode += 1
  return written, episode


def _relabelled(source, target, copies, checkpoint, first_episode):
  """Writes `copies` of a shard's records with new labels."""
  import tensorflow as tf
  from tensorflow.core.example import example_pb2

  from fixed_replay.sources.rlu import rlu_shards

  episode = first_episode
  with tf.io.TFRecordWriter(str(target), options='GZIP') as writer:
    for _ in range(copies):
      for _, data in rlu_shards.read_records(str(source)):
        example = example_pb2.Example.FromString(data)
        feature = example.features.feature
        feature['checkpoint_idx'].int64_list.value[0] = checkpoint
        feature['episode_idx'].int64_list.value[0] = episode
        writer.write(example.SerializeToString())
        episode += 1


def _build(directory, num_frames):
  """Writes small (played), then large and pair (relabelled copies)."""
  from fixed_replay.sources.rlu import rlu_shards

  name = lambda number, total: rlu_shards.shard_name(1, number, total)
  for run in ('small', 'large', 'pair'):
    (directory / run / _GAME).mkdir(parents=True)
  small = directory / 'small' / _GAME / name(0, 1)
  frames, episodes = _play_shard(small, num_frames, seed=0)
  logging.info('Played %d frames in %d episodes', frames, episodes)
  large = directory / 'large' / _GAME / name(0, 1)
  _relabelled(small, large, _LARGE_FACTOR, 0, 0)
  # Two large shards: worker start-up is then small against the work.
  os.link(large, directory / 'pair' / _GAME / name(0, 2))
  _relabelled(
    small,
    directory / 'pair' / _GAME / name(1, 2),
    _LARGE_FACTOR,
    1,
    _LARGE_FACTOR * episodes,
  )


def build_data(num_frames):
  """Returns benchmarks/data/rlu_breakout_<N>/, writing it if needed."""
  directory = common.DATA_DIR / f'rlu_{_GAME.lower()}_{num_frames}_v2'
  if directory.exists():
    return directory
  staging = directory.with_name(f'.{directory.name}.staging-{os.getpid()}')
  staging.mkdir(parents=True)
  try:
    common.run_in_subprocess(_build, staging, num_frames)
    staging.rename(directory)
  finally:
    if staging.exists():
      shutil.rmtree(staging)
  return directory


# ---------------------------------------------------------- measurements


def decode_only(path):
  """cv2.imdecode of every PNG of a shard, one thread: (frames, cpu, wall)."""
  import cv2

  from fixed_replay.sources.rlu import rlu_shards

  pngs = [
    frame
    for episode in rlu_shards.iter_episodes(str(path))
    for frame in episode.frames
  ]
  out = np.empty((1024, 84, 84), np.uint8)
  cpu, wall = time.process_time(), time.perf_counter()
  for i, png in enumerate(pngs):
    out[i % 1024] = cv2.imdecode(
      np.frombuffer(png, np.uint8), cv2.IMREAD_UNCHANGED
    )
  return len(pngs), time.process_time() - cpu, time.perf_counter() - wall


def convert_run(
  source, store, output_format, workers, clevel=None, gzip_level=None
):
  """Converts a run; returns frames, bytes, CPU of this process and workers."""
  from fixed_replay.convert import rlu_convert
  from fixed_replay.convert.convert_options import ConvertOptions

  options = ConvertOptions(output_format=output_format)
  if clevel is not None:
    options = dataclasses.replace(options, clevel=clevel)
  if gzip_level is not None:
    options = dataclasses.replace(options, gzip_level=gzip_level)
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  result = rlu_convert.convert_rlu(
    str(source), str(store), options=options, workers=workers
  )
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  children_cpu = (after.ru_utime - before.ru_utime) + (
    after.ru_stime - before.ru_stime
  )
  return {
    'frames': result.frames,
    'store_bytes': result.store_bytes,
    'source_bytes': result.source_bytes,
    'children_cpu': children_cpu,
    'children_peak_rss': after.ru_maxrss * 1024,
  }


def verify_copy(path):
  """download's check of a copied shard: every record read to the end."""
  from fixed_replay.convert import download

  return download.verify_shard(str(path)), os.path.getsize(path)


def tensorflow_read(path):
  """The baseline of (5): TensorFlow's reader over every record."""
  import tensorflow as tf

  records = tf.compat.v1.io.tf_record_iterator(
    str(path), tf.io.TFRecordOptions('GZIP')
  )
  return sum(1 for _ in records), os.path.getsize(path)


def dopamine_gzip(store, suffix=0):
  """Python gzip level 9 of the rows' np.save: (bytes, frames, seconds)."""
  from fixed_replay.sources.dopamine import checkpoints

  files = checkpoints.find_checkpoints(str(store))[suffix]
  window = checkpoints.read_checkpoint(files)
  total, began = 0, time.perf_counter()
  for array in window.store.values():
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    total += len(gzip.compress(buffer.getvalue(), compresslevel=9))
  seconds = time.perf_counter() - began
  for array in (np.array(window.add_count), window.invalid_range):
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    total += len(gzip.compress(buffer.getvalue(), compresslevel=9))
  return total, len(window.store['observation']), seconds


# ---------------------------------------------------------------- report


def _cpu(measurement, extra=0.0):
  return measurement.user_s + measurement.system_s + extra


def _mib(num_bytes):
  return f'{num_bytes / (1 << 20):7.1f} MiB'


def worker_startup():
  """What a conversion worker imports before its first frame."""
  import cv2  # noqa: F401

  from fixed_replay.convert import convert  # noqa: F401
  from fixed_replay.convert import rlu_convert  # noqa: F401


def _wait(seconds):
  time.sleep(seconds)


def pool_startup(workers):
  """CPU seconds a spawned conversion worker spends starting, on average."""
  import concurrent.futures
  import multiprocessing

  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  with concurrent.futures.ProcessPoolExecutor(
    workers,
    mp_context=multiprocessing.get_context('spawn'),
    initializer=worker_startup,
  ) as pool:
    list(pool.map(_wait, [1.0] * workers))
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  return cpu / workers


def _no_setup():
  pass


def _baseline(shard):
  frames, cpu, wall = common.measure(setup, decode_only, (shard,), _same).digest
  return frames, frames / cpu, frames / wall


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  num_frames = _FRAMES.value
  data = build_data(num_frames)
  work = common.DATA_DIR / f'rlu_out_{os.getpid()}'
  print(f'RL Unplugged conversion benchmark, {_GAME} at random, {data}')
  print(f'{common.load_average()} at start ({os.cpu_count()} CPUs)')
  small_shard = next((data / 'small' / _GAME).iterdir())
  base_frames, first_rate, first_wall = _baseline(small_shard)
  print(
    f'\n1. PNG decode only (cv2.imdecode, 1 thread, in memory): '
    f'{base_frames:,} frames, {first_rate:,.0f} frames per CPU-second '
    f'({first_wall:,.0f}/s wall); measured again after 2'
  )
  startup_cpu = common.measure(_no_setup, pool_startup, (2,), _same).digest
  sizes, peaks = {}, {}
  try:
    print(
      '\n2. fixed-replay convert of the pair run as it runs by default: one '
      'worker process\n   per checkpoint and core (threads=1 each). Per core = '
      'frames per CPU-second of\n   the workers, less their start-up '
      f'(imports: {startup_cpu:.1f} CPU-s each, measured apart)'
    )
    measured = {}
    variants = {
      'compact': ('compact', None, None),
      'compact, clevel 3': ('compact', 3, None),
      'dopamine': ('dopamine', None, None),
      'dopamine, gzip 6': ('dopamine', None, 6),
    }
    for label, (output_format, clevel, gzip_level) in variants.items():
      store = work / f'pair_{output_format}_{clevel}_{gzip_level}'
      measured[label] = common.measure(
        setup,
        convert_run,
        (data / 'pair' / _GAME, store, output_format, 2, clevel, gzip_level),
        _same,
      )
    _, second_rate, _ = _baseline(small_shard)
    base_rate = (first_rate + second_rate) / 2
    print(
      f'   decode-only again: {second_rate:,.0f} frames per CPU-second; '
      f'baseline = mean {base_rate:,.0f}'
    )
    print(
      f'  {"output":<17} {"frames":>9} {"wall s":>7} {"frames/s":>9} '
      f'{"CPU s":>7} {"per core":>9} {"vs decode":>9} {"worker RSS":>11} '
      f'{"B/frame":>8}'
    )
    for output_format, m in measured.items():
      result = m.digest
      cpu = result['children_cpu'] - 2 * startup_cpu
      per_core = result['frames'] / cpu
      ratio = per_core / base_rate
      verdict = 'PASS' if ratio >= _TARGET else 'FAIL'
      print(
        f'  {output_format:<17} {result["frames"]:>9,} {m.wall_s:>7.1f} '
        f'{result["frames"] / m.wall_s:>9,.0f} {cpu:>7.1f} {per_core:>9,.0f} '
        f'{ratio:>8.0%} {_mib(result["children_peak_rss"]):>11} '
        f'{result["store_bytes"] / result["frames"]:>8.1f}  '
        f'(target >= {_TARGET:.0%}: {verdict})'
      )

    print(
      '\n3. memory: one shard converted in one process (threads = cores), '
      f'the {_LARGE_FACTOR}x larger shard against the small one'
    )
    print(
      f'  {"shard":<6} {"output":<9} {"frames":>9} {"wall s":>7} '
      f'{"frames/s":>9} {"peak RSS +":>11}'
    )
    for run in ('small', 'large'):
      for output_format in ('compact', 'dopamine'):
        store = work / f'{run}_{output_format}'
        m = common.measure(
          setup,
          convert_run,
          (data / run / _GAME, store, output_format, 0),
          _same,
        )
        result = m.digest
        peaks[run, output_format] = m.peak_increase
        sizes[run, output_format] = result
        print(
          f'  {run:<6} {output_format:<9} {result["frames"]:>9,} '
          f'{m.wall_s:>7.1f} {result["frames"] / m.wall_s:>9,.0f} '
          f'{_mib(m.peak_increase):>11}'
        )
    for output_format in ('compact', 'dopamine'):
      small = peaks['small', output_format]
      large = peaks['large', output_format]
      print(
        f'  {output_format}: peak RSS above the imports {_mib(small).strip()}'
        f' -> {_mib(large).strip()} with a {_LARGE_FACTOR}x larger shard '
        f'(x{large / small:.2f})'
      )

    gzip_bytes, gzip_frames, gzip_seconds = common.measure(
      setup, dopamine_gzip, (work / 'small_dopamine',), _same
    ).digest
    small = sizes['small', 'compact']
    print('\n4. bytes per frame (small shard; all files of each form)')
    dopamine = sizes['small', 'dopamine']
    forms = [
      ('RL Unplugged shard (PNG in GZIP TFRecord)', small['source_bytes']),
      ('compact store (the default)', small['store_bytes']),
      ('Dopamine files, ours (zlib-ng level 2)', dopamine['store_bytes']),
      ("Dopamine's own gzip (Python gzip level 9)", gzip_bytes),
    ]
    for label, size in forms:
      print(f'  {label:<50} {size / small["frames"]:8.1f}')
    print(
      f"  (Dopamine's gzip written at {gzip_frames / gzip_seconds:,.0f} "
      'frames/s)'
    )
    print(
      f'  input / compact store: '
      f'{small["source_bytes"] / small["store_bytes"]:.1f}x; '
      f"compact store / Dopamine's gzip: "
      f'{small["store_bytes"] / gzip_bytes:.2f}x'
    )
    large_shard = next((data / 'large' / _GAME).iterdir())
    m = common.measure(setup, verify_copy, (large_shard,), _same)
    base = common.measure(setup, tensorflow_read, (large_shard,), _same)
    records, size = m.digest
    assert base.digest == m.digest, (base.digest, m.digest)
    frames = sizes['large', 'compact']['frames']
    print(
      f"\n5. download's check of a copy (large shard, every record read, "
      f'CRCs checked): {records:,} episodes, {size / 1e6:,.0f} MB in '
      f'{m.wall_s:.1f} s ({size / 1e6 / m.wall_s:,.0f} MB/s, '
      f'{frames / m.wall_s:,.0f} frames/s); CPU {_cpu(m):.2f} s against '
      f"{_cpu(base):.2f} s for TensorFlow's reader: {_cpu(m) / _cpu(base):.2f}x"
    )
  finally:
    shutil.rmtree(work, ignore_errors=True)
  print(f'\n{common.load_average()} at end')


def _same(result):
  return result


if __name__ == '__main__':
  app.run(main)
