"""Sampling from disk: a store out of the page cache, against the disk's limit.

Hard links make many runs one file's pages, always in memory, and hide the
disk. Here the data is `--runs` x `--checkpoints` distinct copies of a
store's checkpoints (`--store`, e.g. one `fixed-replay convert` made of
MsPacman's random play), each file dropped from the page cache
(`posix_fadvise(DONTNEED)`) before each cold measurement and read whole
before each hot one. Measured, one after the other in this process:

* the disk's own limit: random 4 KiB `pread`s over the copies' units
  files, from 1 and from 16 threads (reads a second, cold);
* the mixture's open, cold: seconds and bytes read from the disk;
* one run (`FixedReplayBuffer`) and the mixture of every run
  (`fixed_replay.ReplayMixture`), cold and hot, three ways in turns: in
  one thread without the decoder's read-ahead (one read at a time: the
  baseline), in one thread with it (every run of a batch asked for before
  the first is read; `unit_decoding.READ_AHEAD`), and with 2 sampling
  threads (the default);
* a DataLoader of `--workers` workers over the mixture
  (`fixed_replay.torch.MixtureDataset`), cold, without and with
  read-ahead, timed from when every worker has given two batches.

Printed: transitions a wall-second against the first way's and the disk's
16-thread rate (a transition is about one 4 KiB read), transitions a
CPU-second (for the DataLoader, the whole machine's busy CPU), 4 KiB pages
read from the disk a transition (the machine's, /proc/vmstat) and minor
page faults a transition (this process's), with the load average. The
copies are removed at the end unless `--keep`.

Usage: python benchmarks/disk_benchmark.py --store=STORE [--runs=4]
  [--checkpoints=25] [--batches=200] [--batch_size=32] [--workers=4]
  [--nohot] [--keep] [--open_only]
"""

import concurrent.futures
import functools
import itertools
import os
import random
import resource
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
_WORKERS = flags.DEFINE_integer('workers', 4, "The DataLoader's workers.")
_HOT = flags.DEFINE_bool(
  'hot',
  True,
  'Also measure hot (each file read whole first: not for data '
  'larger than RAM).',
)
_KEEP = flags.DEFINE_bool('keep', False, 'Keep the copies.')
_OPEN_ONLY = flags.DEFINE_bool(
  'open_only', False, 'The open alone, on copies with units hard-linked.'
)
_DIRECTORY = flags.DEFINE_string(
  'directory', None, 'Where to copy (default: a temporary directory).'
)
PAGE = 4096
# Batches taken before a timing: those sampling threads drew ahead.
_SKIPPED = 64


def _copy(source, target):
  """Opening reads no unit: under --open_only they are hard links."""
  link = _OPEN_ONLY.value and source.endswith('.units')
  (os.link if link else shutil.copy2)(source, target)


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
      shutil.copytree(origin, target, copy_function=_copy)
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


def pages_read():
  """4 KiB pages the machine has read from its disks (/proc/vmstat)."""
  with open('/proc/vmstat') as vmstat:
    counters = dict(line.split() for line in vmstat)
  return int(counters['pgpgin']) // 4  # Counted in KiB.


def busy_cpu_seconds():
  """CPU-seconds the whole machine has spent busy (/proc/stat)."""
  with open('/proc/stat') as stat:
    ticks = [int(t) for t in stat.readline().split()[1:]]
  idle = ticks[3] + ticks[4]  # idle, iowait
  return (sum(ticks[:8]) - idle) / os.sysconf('SC_CLK_TCK')


def costs(transitions, pages, faults):
  """', P pages read, F minor faults a transition' of counters' deltas."""
  return (
    f', {pages / transitions:.2f} pages read and '
    f'{faults / transitions:.2f} minor faults a transition'
  )


def sample_rate(sample, batches_count, batch_size):
  """(transitions a wall-second, a CPU-second, costs) of `batches_count`
  samples in this process."""
  for _ in range(_SKIPPED):  # Batches its threads drew ahead, before.
    sample()
  pages, faults = pages_read(), resource.getrusage(resource.RUSAGE_SELF)
  began, cpu = time.perf_counter(), time.process_time()
  for _ in range(batches_count):
    sample()
  wall, cpu = time.perf_counter() - began, time.process_time() - cpu
  transitions = batches_count * batch_size
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults.ru_minflt
  spent = costs(transitions, pages_read() - pages, faults)
  return transitions / wall, transitions / max(cpu, 1e-9), spent


def loader_rate(root, workers, batches_count, batch_size):
  """(transitions a wall-second, a busy CPU-second of the machine, costs)
  of a DataLoader of `workers` over the mixture of `root`'s runs, from when
  each worker has given two batches (they open the mixture first)."""
  import torch

  from fixed_replay.torch import MixtureDataset

  dataset = MixtureDataset(
    root,
    batch_size=batch_size,
    seed=0,
    reload_every=None,
    num_batches=batches_count + 2 * workers,
  )
  loader = torch.utils.data.DataLoader(
    dataset, batch_size=None, num_workers=workers
  )
  for taken, _ in enumerate(loader, 1):
    if taken == 2 * workers:
      began, busy, pages = time.perf_counter(), busy_cpu_seconds(), pages_read()
  wall = time.perf_counter() - began
  busy = busy_cpu_seconds() - busy
  transitions = batches_count * batch_size
  dataset.close()
  # The workers' faults are theirs: only the machine's reads are counted.
  spent = (
    f', {(pages_read() - pages) / transitions:.2f} pages read a transition'
  )
  return transitions / wall, transitions / max(busy, 1e-9), spent


def open_cost(root, paths, batch_size):
  """'the mixture opens, cold: S s, B read' (a ReplayMixture of root)."""
  drop_from_cache(paths)
  pages, began = pages_read(), time.perf_counter()
  mixture = ReplayMixture(
    root, batch_size=batch_size, seed=0, reload_every=None
  )
  seconds = time.perf_counter() - began
  read = (pages_read() - pages) * PAGE
  return mixture, (
    f'the mixture opens, cold: {seconds:.2f} s, '
    f'{common.format_bytes(read)} read from the disk'
  )


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
  if _OPEN_ONLY.value:
    units = sorted(set(units))[:1]  # Links of one file: the same pages.
  disk = {t: disk_reads_a_second(units, t, 2.0) for t in (1, 16)}
  print(
    f'the disk: {disk[1]:,.0f} random 4 KiB reads/s from 1 thread, '
    f'{disk[16]:,.0f} from 16'
  )
  size = _BATCH_SIZE.value
  mixture, opened = open_cost(root, paths, size)
  print(opened)
  mixture.close()
  if _OPEN_ONLY.value:
    if not _KEEP.value:
      shutil.rmtree(root)
    return
  every = unit_decoding.FUNCTIONS
  one_by_one = every[: unit_decoding.READ_AHEAD]  # No read-ahead.
  sampled = []  # What to close at the end.

  def one_run(threads):
    buffer = batches.open_buffer(
      runs[0], {'sampling_threads': threads, 'batch_size': size, 'seed': 0}
    )
    sampled.append(buffer)
    return functools.partial(sample_rate, buffer.sample_transition_batch)

  def mixture_of(threads):
    opened = ReplayMixture(
      root,
      batch_size=size,
      seed=0,
      reload_every=None,
      sampling_threads=threads,
    )
    sampled.append(opened)
    return functools.partial(sample_rate, opened.sample)

  # {measurement: {variant: (decoder functions, measure)}}: the first
  # variant is the baseline of the others.
  loader = functools.partial(loader_rate, root, _WORKERS.value)
  measured = {
    'one run': {
      'one thread, no read-ahead': (one_by_one, one_run(0)),
      'one thread': (every, one_run(0)),
      '2 sampling threads': (every, one_run(2)),
    },
    f'mixture of {len(runs)}': {
      'one thread, no read-ahead': (one_by_one, mixture_of(1)),
      'one thread': (every, mixture_of(1)),
      '2 sampling threads': (every, mixture_of(2)),
    },
    f'DataLoader of {_WORKERS.value} workers over the mixture': {
      'no read-ahead': (one_by_one, loader),
      'read-ahead': (every, loader),
    },
  }
  temperatures = [('cold', drop_from_cache), ('hot', read_whole)]
  for temperature, prepare in temperatures[: 2 if _HOT.value else 1]:
    for name, variants in measured.items():
      if temperature == 'hot' and name.startswith('DataLoader'):
        continue  # Its workers reopen the mixture each pass: cold only.
      rates = {variant: [] for variant in variants}
      for _ in range(2):  # In turns: a drift in the machine hits all.
        for variant, (functions, measure) in variants.items():
          unit_decoding.FUNCTIONS = functions  # Forked workers inherit it.
          prepare(paths)
          rates[variant].append(measure(_BATCHES.value, size))
      baseline = max(next(iter(rates.values())))[0]
      for variant, results in rates.items():
        best = max(results)  # The faster turn, with its costs.
        against = f'{best[0] / baseline:.2f}x the first'
        if temperature == 'cold':
          against += f', {best[0] / disk[16]:.2f}x the disk'
        print(
          f'{name}, {temperature}, {variant}: {best[0]:,.0f} transitions/'
          f'wall-s ({against}), {max(r[1] for r in results):,.0f} /CPU-s'
          f'{best[2]}'
        )
  unit_decoding.FUNCTIONS = every
  for opened in sampled:
    opened.close()
  print(common.load_average())
  if not _KEEP.value:
    shutil.rmtree(root)


if __name__ == '__main__':
  flags.mark_flag_as_required('store')
  app.run(main)
