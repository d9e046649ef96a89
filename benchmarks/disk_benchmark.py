"""Sampling from disk: a store out of the page cache, against the disk's limit.

Hard links make many runs one file's pages, always in memory, and hide the
disk. Here the data is `--runs` x `--checkpoints` distinct copies of a
store's checkpoints (`--store`, e.g. one `fixed-replay convert` made of
MsPacman's random play), each file dropped from the page cache
(`posix_fadvise(DONTNEED)`) before each cold measurement and read whole
before each hot one. Measured, one after the other in this process:

* the disk's own limit: random 4 KiB `pread`s over the copies' units
  files, from 1 and from 16 threads (reads a second, cold);
* one run (`FixedReplayBuffer`, sampled in the calling thread) and the
  mixture of every run (`fixed_replay.ReplayMixture`), each with the
  decoder's read-ahead (every run of a batch asked for before the first is
  read; `unit_decoding.READ_AHEAD`) and without it (one read at a time,
  the baseline), cold and hot, in turns.

Printed: transitions a wall-second and a CPU-second, read-ahead's ratio to
the baseline of the same run, and the cold rates against the disk's
16-thread rate (a transition is about one 4 KiB read), with the load
average. The copies are removed at the end unless `--keep`.

Usage: python benchmarks/disk_benchmark.py --store=STORE [--runs=4]
  [--checkpoints=25] [--batches=200] [--batch_size=32] [--keep]
"""

import concurrent.futures
import itertools
import os
import random
import shutil
import tempfile
import time

from absl import app
from absl import flags
import common

from fixed_replay import batches
from fixed_replay.mixture import ReplayMixture
from fixed_replay.store import manifest as manifest_lib
from fixed_replay.store import unit_decoding

_STORE = flags.DEFINE_string(
  'store', None, 'A store whose checkpoints to copy.'
)
_RUNS = flags.DEFINE_integer('runs', 4, 'Runs of the mixture.')
_CHECKPOINTS = flags.DEFINE_integer('checkpoints', 25, 'Checkpoints a run.')
_BATCHES = flags.DEFINE_integer('batches', 200, 'Batches a measurement.')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 32, 'Transitions a batch.')
_KEEP = flags.DEFINE_bool('keep', False, 'Keep the copies.')
_DIRECTORY = flags.DEFINE_string(
  'directory', None, 'Where to copy (default: a temporary directory).'
)
PAGE = 4096


def copy_runs(store, root, runs, checkpoints):
  """root/<game>/<run>: distinct copies of `store`'s checkpoints, in turn."""
  origins = sorted(manifest_lib.find_stored_checkpoints(store).items())
  game = manifest_lib.read_manifest(origins[0][1]).get(manifest_lib.GAME_KEY)
  directories = []
  for run in range(1, runs + 1):
    directory = os.path.join(root, game or 'MsPacman', str(run))
    os.makedirs(directory)
    for name in os.listdir(store):
      if os.path.isfile(os.path.join(store, name)):
        shutil.copy(os.path.join(store, name), directory)
    for suffix in range(checkpoints):
      origin = str(origins[suffix % len(origins)][1])
      target = os.path.join(directory, manifest_lib.checkpoint_dirname(suffix))
      shutil.copytree(origin, target)
      manifest = manifest_lib.read_manifest(origin)
      os.remove(os.path.join(target, manifest_lib.MANIFEST))
      manifest_lib.write_manifest(target, dict(manifest, suffix=suffix))
    directories.append(directory)
  return directories


def files_under(root):
  return [
    os.path.join(folder, name)
    for folder, _, names in os.walk(root)
    for name in names
  ]


def drop_from_cache(paths):
  for path in paths:
    descriptor = os.open(path, os.O_RDONLY)
    os.fsync(descriptor)  # A page not yet written back is not dropped.
    os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(descriptor)


def read_whole(paths):
  for path in paths:
    with open(path, 'rb') as f:
      while f.read(1 << 20):
        pass


def disk_reads_a_second(paths, threads, seconds=3.0):
  """Random 4 KiB preads a second over `paths`, cold, from `threads`: each
  page at most once (read again, it would come from memory)."""
  drop_from_cache(paths)
  files = [os.open(p, os.O_RDONLY) for p in paths]
  pages = [
    (descriptor, page * PAGE)
    for descriptor, path in zip(files, paths, strict=True)
    for page in range(os.path.getsize(path) // PAGE)
  ]
  random.Random(0).shuffle(pages)
  for descriptor in files:  # Read-ahead would read more than asked.
    os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_RANDOM)
  taken = itertools.count()  # Its next() is atomic: one page a reader.
  deadline = time.perf_counter() + seconds

  def reader(_):
    count = 0
    while time.perf_counter() < deadline:
      at = next(taken)
      if at >= len(pages):
        break
      os.pread(pages[at][0], PAGE, pages[at][1])
      count += 1
    return count

  began = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    total = sum(pool.map(reader, range(threads)))
  rate = total / (time.perf_counter() - began)
  for descriptor in files:
    os.close(descriptor)
  return rate


def sample_rate(sample, batches_count, batch_size):
  """(transitions a wall-second, a CPU-second) of `batches_count` samples."""
  began, cpu = time.perf_counter(), time.process_time()
  for _ in range(batches_count):
    sample()
  wall, cpu = time.perf_counter() - began, time.process_time() - cpu
  transitions = batches_count * batch_size
  return transitions / wall, transitions / max(cpu, 1e-9)


def main(argv):
  del argv
  root = _DIRECTORY.value or tempfile.mkdtemp(prefix='disk_benchmark_')
  runs = copy_runs(_STORE.value, root, _RUNS.value, _CHECKPOINTS.value)
  paths = files_under(root)
  units = [p for p in paths if p.endswith('.units')]
  size = sum(os.path.getsize(p) for p in paths)
  print(
    f'{len(runs)} runs x {_CHECKPOINTS.value} distinct checkpoints, '
    f'{common.format_bytes(size)} in {root}; {common.load_average()}'
  )
  disk = {t: disk_reads_a_second(units, t, 2.0) for t in (1, 16)}
  print(
    f'the disk: {disk[1]:,.0f} random 4 KiB reads/s from 1 thread, '
    f'{disk[16]:,.0f} from 16'
  )
  size = _BATCH_SIZE.value
  one = batches.open_buffer(
    runs[0], {'sampling_threads': 0, 'batch_size': size, 'seed': 0}
  )
  mixture = ReplayMixture(root, batch_size=size, seed=0, reload_every=None)
  samplers = {
    'one run': one.sample_transition_batch,
    f'mixture of {len(runs)}': mixture.sample,
  }
  every = unit_decoding.FUNCTIONS
  for sampler in samplers.values():
    sampler()  # Compiled and warm before any timing.
  for name, sample in samplers.items():
    for temperature, prepare in (
      ('cold', drop_from_cache),
      ('hot', read_whole),
    ):
      rates = {'baseline': [], 'read-ahead': []}
      for _ in range(2):  # In turns: a drift in the machine hits both.
        for mode in rates:
          read_ahead = mode == 'read-ahead'
          unit_decoding.FUNCTIONS = (
            every if read_ahead else every[: unit_decoding.READ_AHEAD]
          )
          prepare(paths)
          rates[mode].append(sample_rate(sample, _BATCHES.value, size))
      for mode, measured in rates.items():
        wall = max(r[0] for r in measured)
        cpu = max(r[1] for r in measured)
        extra = (
          f', {wall / disk[16]:.2f}x the disk' if temperature == 'cold' else ''
        )
        print(
          f'{name}, {temperature}, {mode}: {wall:,.0f} transitions/wall-s, '
          f'{cpu:,.0f} /CPU-s{extra}'
        )
      ratio = max(r[0] for r in rates['read-ahead']) / max(
        r[0] for r in rates['baseline']
      )
      print(f'{name}, {temperature}: read-ahead {ratio:.2f}x the baseline')
  unit_decoding.FUNCTIONS = every
  one.close()
  mixture.close()
  print(common.load_average())
  if not _KEEP.value:
    shutil.rmtree(root)


if __name__ == '__main__':
  flags.mark_flag_as_required('store')
  app.run(main)
