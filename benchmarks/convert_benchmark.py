"""Converting RL Unplugged shards: speed per core, scaling, memory, bytes.

`fixed-replay convert` turns RL Unplugged's GZIP TFRecord shards (an
Example per episode, PNG frames) into a store. Decoding the PNGs is its
floor, so its speed is judged against that floor in the same run; its memory
must not grow with the shard (real shards hold about 1M frames).

Data (built once under benchmarks/data/rlu_breakout_<N>/): Breakout played
at random as common.py plays it, in RL Unplugged's format: `small`, a shard
of N frames; `large`, a shard of 4N (small's episodes four times); `pair`,
two shards of 4N frames (checkpoints 0 and 1).

Measured, each in a fresh process (common.measure, imports before the clock):

  1. the baseline: cv2.imdecode of the small shard's PNGs (one thread, in
     memory) in frames per CPU-second, at the start and the end (drift);
  2. the pair run converted by 1 and 2 local worker processes, and with
     `--ray` by a private local Ray of 1 and 2 CPUs: wall time and frames per
     second against 1 worker (Ray's start and stop timed apart), and frames
     per CPU-second of the workers (their imports included) against (1);
  3. the small and the large shard converted in one process: the peak RSS
     above the imports (the ratio should stay near 1), bytes per frame;
  4. the check: the small store's frames, padding rows aside, equal the
     shard's PNGs decoded by OpenCV, in order.

Usage: python benchmarks/convert_benchmark.py [--frames=100000] [--ray]
"""

import contextlib
import hashlib
import os
import resource
import shutil
import time

from absl import app
from absl import flags
from absl import logging
import common
import numpy as np

from fixed_replay.sources.rlu import rlu_shards

_FRAMES = flags.DEFINE_integer(
  'frames', 100_000, 'Frames of the small shard (large: 4x, pair: 2 x 4x).'
)
_RAY = flags.DEFINE_boolean(
  'ray', False, 'Also convert the pair run on a private local Ray.'
)
_LARGE_FACTOR = 4
_WORKER_COUNTS = (1, 2)
_GAME = 'Breakout'


def setup():
  import cv2  # noqa: F401
  import tensorflow as tf  # noqa: F401

  from fixed_replay.convert import rlu_convert  # noqa: F401


# ---------------------------------------------------------------- data


def _example(frames, actions, rewards, terminal, episode):
  """One episode as RL Unplugged writes it (a serialized tf.train.Example)."""
  import cv2
  import tensorflow as tf

  train, total = tf.train, float(np.sum(rewards))
  ints = lambda v: train.Feature(int64_list=train.Int64List(value=v))
  floats = lambda v: train.Feature(float_list=train.FloatList(value=v))
  pngs = [cv2.imencode('.png', frame)[1].tobytes() for frame in frames]
  feature = {
    'checkpoint_idx': ints([0]),
    'episode_idx': ints([episode]),
    'episode_return': floats([total]),
    'clipped_episode_return': floats([total]),
    'observations': train.Feature(bytes_list=train.BytesList(value=pngs)),
    'actions': ints(actions),
    'unclipped_rewards': floats(rewards),
    'clipped_rewards': floats(rewards),
    'discounts': floats([1.0] * (len(actions) - 1) + [float(not terminal)]),
  }
  example = train.Example(features=train.Features(feature=feature))
  return example.SerializeToString()


def _play_shard(path, num_frames, seed=0):
  """Plays Breakout into one shard of `num_frames` frames; returns episodes."""
  from dopamine.discrete_domains import atari_lib
  import tensorflow as tf

  env = atari_lib.create_atari_environment(_GAME)
  env.environment.reset(seed=seed)
  rng = np.random.default_rng(seed)
  written = episode = 0
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
      writer.write(_example(frames, actions, rewards, terminal, episode))
      written += len(actions)
      episode += 1
  return episode


def _relabelled(source, target, checkpoint, first_episode):
  """Writes `_LARGE_FACTOR` copies of a shard's records with new labels."""
  import tensorflow as tf
  from tensorflow.core.example import example_pb2

  episode = first_episode
  with tf.io.TFRecordWriter(str(target), options='GZIP') as writer:
    for _ in range(_LARGE_FACTOR):
      for _, data in rlu_shards.read_records(str(source)):
        example = example_pb2.Example.FromString(data)
        feature = example.features.feature
        feature['checkpoint_idx'].int64_list.value[0] = checkpoint
        feature['episode_idx'].int64_list.value[0] = episode
        writer.write(example.SerializeToString())
        episode += 1


def _build(directory, num_frames):
  for run in ('small', 'large', 'pair'):
    (directory / run / _GAME).mkdir(parents=True)
  small = shard(directory, 'small')
  episodes = _play_shard(small, num_frames)
  _relabelled(small, shard(directory, 'large'), 0, 0)
  pair = directory / 'pair' / _GAME
  os.link(shard(directory, 'large'), pair / rlu_shards.shard_name(1, 0, 2))
  _relabelled(
    small, pair / rlu_shards.shard_name(1, 1, 2), 1, _LARGE_FACTOR * episodes
  )


def shard(directory, run):
  return directory / run / _GAME / rlu_shards.shard_name(1, 0, 1)


def build_data(num_frames):
  """Returns benchmarks/data/rlu_breakout_<N>/, writing it if needed."""
  directory = common.DATA_DIR / f'rlu_{_GAME.lower()}_{num_frames}'
  if directory.exists():
    return directory
  staging = directory.with_name(f'.{directory.name}.staging-{os.getpid()}')
  staging.mkdir(parents=True)
  try:
    common.run_in_subprocess(_build, staging, num_frames)
    staging.rename(directory)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return directory


# ---------------------------------------------------------- measurements


def _pngs(path):
  return [f for e in rlu_shards.iter_episodes(str(path)) for f in e.frames]


def decode_rate(path):
  """cv2.imdecode of every PNG of a shard, one thread: frames per CPU-s."""
  import cv2

  pngs = _pngs(path)
  cpu = time.process_time()
  for png in pngs:
    cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_UNCHANGED)
  return len(pngs) / (time.process_time() - cpu)


def convert_run(source, store, workers, ray_cpus=0):
  """Converts a run: frames, bytes, workers' CPU s, wall s, Ray start+stop s.

  With `workers` = 0 the conversion runs in this process (its CPU is then
  the measurement's own); with `ray_cpus`, on a private local Ray (default
  ConvertOptions: a compact store).
  """
  from fixed_replay import distributed
  from fixed_replay.convert import rlu_convert
  from fixed_replay.convert.convert_options import ConvertOptions

  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  began = time.perf_counter()
  cluster = distributed.cluster(num_cpus=ray_cpus) if ray_cpus else None
  with cluster or contextlib.nullcontext() as info:
    converting = time.perf_counter()
    result = rlu_convert.convert_rlu(
      source, store, options=ConvertOptions(), workers=workers, ray=info
    )
    stopping = time.perf_counter()
  ray_s = (converting - began) + (time.perf_counter() - stopping)
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  return {
    'frames': result.frames,
    'store_bytes': result.store_bytes,
    'source_bytes': result.source_bytes,
    'cpu': cpu,
    'wall': stopping - converting,
    'ray': ray_s if ray_cpus else 0.0,
  }


def frames_match(path, store):
  """Whether the store's frames, zero padding aside, are the decoded PNGs."""
  import cv2

  from fixed_replay.convert import checkpoint_source

  expected, actual, count = hashlib.sha256(), hashlib.sha256(), 0
  for png in _pngs(path):
    frame = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_UNCHANGED)
    expected.update(np.ascontiguousarray(frame).tobytes())
  slices = (
    frames
    for source in checkpoint_source.stored_sources(str(store))
    for frames in source.open().frame_slices(4096)
  )
  for frames in slices:
    kept = frames[frames.reshape(len(frames), -1).any(axis=1)]
    actual.update(np.ascontiguousarray(kept).tobytes())
    count += len(kept)
  return expected.digest() == actual.digest(), count


def _same(result):  # common.measure's digest: the result itself.
  return result


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  data = build_data(_FRAMES.value)
  work = common.DATA_DIR / f'convert_out_{os.getpid()}'
  small, large = shard(data, 'small'), shard(data, 'large')
  print(f'Converting RL Unplugged shards of {_GAME} at random ({data})')
  print(f'{common.load_average()} at start ({os.cpu_count()} CPUs)')
  first = common.measure(setup, decode_rate, (small,), _same).digest
  try:
    runs = {f'local {n}': (n, 0) for n in _WORKER_COUNTS}
    if _RAY.value:
      runs.update({f'ray {n}': (None, n) for n in _WORKER_COUNTS})
    scaling = {}
    for name, (workers, ray_cpus) in runs.items():
      store = work / name.replace(' ', '_')
      args = (data / 'pair' / _GAME, store, workers, ray_cpus)
      scaling[name] = common.measure(setup, convert_run, args, _same)
      shutil.rmtree(store)
    memory = {}
    for run, path in (('small', small), ('large', large)):
      memory[run] = common.measure(
        setup, convert_run, (path.parent, work / run, 0), _same
      )
    matched, stored = common.measure(
      setup, frames_match, (small, work / 'small'), _same
    ).digest
    last = common.measure(setup, decode_rate, (small,), _same).digest
  finally:
    shutil.rmtree(work, ignore_errors=True)
  print(f'{common.load_average()} at end\n')
  base = (first + last) / 2
  print(
    f'1. baseline, cv2.imdecode of {_FRAMES.value:,} PNGs (1 thread): '
    f'{first:,.0f} then {last:,.0f} frames per CPU-second, mean {base:,.0f}'
  )
  print(f'\n2. pair run (2 shards x {_LARGE_FACTOR}x) into a compact store')
  print(
    f'  {"variant":<8} {"frames":>9} {"wall s":>7} {"frames/s":>9} '
    f'{"vs local 1":>10} {"frames/CPU-s":>12} {"vs decode":>9}'
  )
  one = scaling['local 1'].digest['wall']
  for name, m in scaling.items():
    r, wall = m.digest, m.digest['wall']
    frames = r['frames']
    per_cpu = f'{frames / r["cpu"]:>12,.0f} {frames / r["cpu"] / base:>8.0%}'
    line = (
      f'  {name:<8} {frames:>9,} {wall:>7.1f} {frames / wall:>9,.0f} '
      f'{one / wall:>9.2f}x {"" if r["ray"] else per_cpu}'
    )
    print(line.rstrip())
    if r['ray']:
      print(
        f'    + Ray start and stop {r["ray"]:.1f} s: '
        f'{one / (wall + r["ray"]):.2f}x of local 1 with them'
      )
  print('\n3. one shard in one process')
  print(
    f'  {"shard":<6} {"frames":>9} {"wall s":>7} {"frames/s":>9} '
    f'{"peak RSS +":>11} {"input B/frame":>13} {"store B/frame":>13}'
  )
  for run, m in memory.items():
    r, frames = m.digest, m.digest['frames']
    print(
      f'  {run:<6} {frames:>9,} {r["wall"]:>7.1f} {frames / r["wall"]:>9,.0f} '
      f'{m.peak_increase / (1 << 20):>7.1f} MiB '
      f'{r["source_bytes"] / frames:>13.1f} {r["store_bytes"] / frames:>13.1f}'
    )
  ratio = memory['large'].peak_increase / memory['small'].peak_increase
  print(
    f'  peak RSS above the imports, {_LARGE_FACTOR}x larger shard against '
    f'the small one: x{ratio:.2f}'
  )
  print(
    f'\n4. small store frames equal the decoded PNGs: {matched} '
    f'({stored:,} non-padding frames)'
  )
  if not matched:
    raise AssertionError('the converted store differs from the decoded PNGs')


if __name__ == '__main__':
  app.run(main)
