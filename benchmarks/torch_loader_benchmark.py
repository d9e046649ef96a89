"""PyTorch DataLoader workers, the JAX route and TorchRL over the same data.

Samples stacked Breakout transitions (the benchmark checkpoint of common.py)
from its Dopamine files and from its compact store (`fixed-replay convert`),
each method in a fresh process, for `--seconds` after `--warmup_s` (worker
start, their checkpoint loading and background verification are not
counted):

* `loader_wN`: `DataLoader(fixed_replay.torch.ReplayDataset(...),
  batch_size=None, num_workers=N)` for N = 0 (the baseline: the buffer's own
  sampling thread in the training process), 1, 2 and the CPU count;
* `jax`: `fixed_replay.jax_batches.ReplayBatches` (CPU device);
* `torchrl`: `fixed_replay.torchrl.FixedReplayDataset.sample()`;
* `memmap` (store rows only): TorchRL's own `ReplayBuffer(LazyMemmapStorage,
  RandomSampler)` holding the same rows uncompressed. It returns single
  frames with no stacking, n-step return or valid-row rule, i.e. less work
  than the others: a lower bound on what an exact TorchRL equivalent costs;
* `floor`: a DataLoader over integers with 2 workers, in items/s times the
  batch size: the most transitions/s the DataLoader's own per-item machinery
  (pickling, queues, pinning thread) can pass at that batch size.

The worker counts alternate over `--rounds` rounds and each row reports the
median. Ratios are against `loader_w0` of the same data and batch size. CPU
is of the training process and its workers; RSS is the training process's
peak and the workers' at mid-run (pages shared after the fork counted in
each).

Usage:
  python benchmarks/torch_loader_benchmark.py --rows=50000
"""

import os
import shutil
import statistics
import tempfile
import time

from absl import app
from absl import flags
from absl import logging
import common
import numpy as np
import psutil
import torch.utils.data

_SECONDS = flags.DEFINE_float('seconds', 4.0, 'Timed seconds a method.')
_WARMUP_S = flags.DEFINE_float('warmup_s', 4.0, 'Untimed seconds first.')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Alternations of the loaders.')
_BATCH_SIZES = flags.DEFINE_list('batch_sizes', ['32', '128'], 'Batch sizes.')
_START_METHOD = flags.DEFINE_enum(
  'start_method', 'fork', ['fork', 'spawn', 'forkserver'], 'Workers start so.'
)
_DATA_DIR = flags.DEFINE_string(
  'data_dir', str(common.DATA_DIR), 'Where the benchmark checkpoint lives.'
)
_WORK_DIR = flags.DEFINE_string(
  'work_dir', None, 'Where the store and the memmap go (default: a temp dir).'
)

ATARI = dict(observation_shape=(84, 84), stack_size=4)


def _disk_bytes(directory):
  return sum(
    os.path.getsize(os.path.join(root, name))
    for root, _, names in os.walk(directory)
    for name in names
  )


def _children_rss():
  children = psutil.Process().children(recursive=True)
  return sum(child.memory_info().rss for child in children)


def _children_cpu():
  """CPU seconds of the live workers so far."""
  total = 0.0
  for child in psutil.Process().children(recursive=True):
    times = child.cpu_times()
    total += times.user + times.system
  return total


def _timed(iterator, size_of):
  """Pulls for --warmup_s, then for --seconds; returns the counts."""
  warm_until = time.perf_counter() + _WARMUP_S.value
  while time.perf_counter() < warm_until:
    next(iterator)
  began, cpu = time.perf_counter(), time.process_time() + _children_cpu()
  transitions, worker_rss, checked = 0, 0, False
  while (elapsed := time.perf_counter() - began) < _SECONDS.value:
    transitions += size_of(next(iterator))
    if not checked and elapsed > _SECONDS.value / 2:
      worker_rss, checked = _children_rss(), True
  return dict(
    transitions=transitions,
    wall=time.perf_counter() - began,
    cpu=time.process_time() + _children_cpu() - cpu,
    worker_rss=worker_rss,
  )


def _dopamine_batch_size(batch):
  return len(batch['indices'])


def run_loader(data_dir, batch_size, num_workers, flag_values):
  from torch.utils.data import DataLoader

  from fixed_replay.torch import ReplayDataset

  flags.FLAGS(flag_values)
  dataset = ReplayDataset(data_dir, batch_size=batch_size, seed=0, **ATARI)
  # The benchmark runs in a spawned process, whose default start method is
  # spawn; a user's script on Linux forks its workers (Python < 3.14).
  loader = DataLoader(
    dataset,
    batch_size=None,
    num_workers=num_workers,
    multiprocessing_context=_START_METHOD.value if num_workers else None,
  )
  outcome = _timed(iter(loader), _dopamine_batch_size)
  dataset.close()
  return outcome


def run_jax(data_dir, batch_size, flag_values):
  import jax

  from fixed_replay.jax_batches import ReplayBatches

  flags.FLAGS(flag_values)
  replay = ReplayBatches(data_dir, batch_size=batch_size, seed=0, **ATARI)

  def ready(batch):
    jax.block_until_ready(batch)
    return batch['indices'].shape[0]

  outcome = _timed(iter(replay), ready)
  replay.close()
  return outcome


def run_torchrl(data_dir, batch_size, flag_values):
  from fixed_replay.torchrl import FixedReplayDataset

  flags.FLAGS(flag_values)
  dataset = FixedReplayDataset(data_dir, batch_size=batch_size, seed=0, **ATARI)
  outcome = _timed(iter(dataset), len)
  dataset.close()
  return outcome


def run_memmap(memmap_dir, rows_npz, batch_size, flag_values):
  import tensordict
  import torch
  from torchrl.data import LazyMemmapStorage
  from torchrl.data import ReplayBuffer
  from torchrl.data.replay_buffers.samplers import RandomSampler

  flags.FLAGS(flag_values)
  arrays = np.load(rows_npz)
  rows = len(arrays['action'])
  shutil.rmtree(memmap_dir, ignore_errors=True)
  storage = LazyMemmapStorage(rows, scratch_dir=memmap_dir)
  replay = ReplayBuffer(
    storage=storage, sampler=RandomSampler(), batch_size=batch_size
  )
  chunk = 10_000
  for start in range(0, rows, chunk):
    replay.extend(
      tensordict.TensorDict(
        {
          name: torch.from_numpy(
            np.ascontiguousarray(arrays[name][start : start + chunk])
          )
          for name in ('observation', 'action', 'reward', 'terminal')
        },
        batch_size=[min(chunk, rows - start)],
      )
    )
  del arrays
  torch.manual_seed(0)

  def endless():
    while True:
      yield replay.sample()

  outcome = _timed(endless(), len)
  outcome['disk'] = _disk_bytes(memmap_dir)
  return outcome


class Integers(torch.utils.data.IterableDataset):
  """An endless dataset of ints: the DataLoader's own cost alone."""

  def __iter__(self):
    return iter(range(10**12))


def run_floor(batch_size, flag_values):
  flags.FLAGS(flag_values)
  loader = torch.utils.data.DataLoader(
    Integers(), batch_size=None, num_workers=2
  )
  iterator = iter(loader)
  outcome = _timed(iterator, lambda item: batch_size)
  del iterator
  return outcome


def _dopamine_rows(checkpoint, npz):
  """The checkpoint's rows as arrays (what TorchRL's storage holds)."""
  import gzip

  arrays = {}
  for name in ('observation', 'action', 'reward', 'terminal'):
    path = os.path.join(checkpoint, f'$store$_{name}_ckpt.0.gz')
    with gzip.open(path) as stream:
      arrays[name] = np.load(stream)
  np.savez(npz, **arrays)


def _identity(outcome):
  return outcome


def _median(measurements):
  """The measurement of median rate, with the peak RSS its process had."""
  rates = [m.digest['transitions'] / m.digest['wall'] for m in measurements]
  return measurements[rates.index(statistics.median_low(rates))]


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  flag_values = [
    'benchmark',
    f'--seconds={_SECONDS.value}',
    f'--warmup_s={_WARMUP_S.value}',
    f'--start_method={_START_METHOD.value}',
  ]
  checkpoint = str(
    common.build_checkpoint(common.ROWS.value, data_dir=_DATA_DIR.value)
  )
  work = _WORK_DIR.value or tempfile.mkdtemp(prefix='torch_loader_bench_')
  store = os.path.join(work, 'store')
  if not os.path.isdir(store):
    from fixed_replay.store import convert

    convert.convert(checkpoint, store, workers=0)
  npz = os.path.join(work, 'rows.npz')
  if not os.path.exists(npz):
    _dopamine_rows(checkpoint, npz)
  memmap = os.path.join(work, 'memmap')
  cpus = os.cpu_count()
  worker_counts = sorted({0, 1, 2, cpus})
  print(
    f'{common.ROWS.value:,} Breakout rows; {_WARMUP_S.value:g} s warm-up, '
    f'{_SECONDS.value:g} s timed a method, median of {_ROUNDS.value} '
    f'rounds for the loaders; {common.load_average()}; {cpus} CPUs'
  )
  print(
    f'{"data":<9} {"batch":>5} {"method":<10} {"transitions/s":>14} '
    f'{"ratio":>6} {"cpu ms/1k":>10} {"peak RSS":>9} {"workers RSS":>12} '
    f'{"disk":>9}'
  )
  for batch_size in map(int, _BATCH_SIZES.value):
    for kind, data_dir in (('store', store), ('dopamine', checkpoint)):
      rounds = {f'loader_w{count}': [] for count in worker_counts}
      for _ in range(_ROUNDS.value):
        for count in worker_counts:
          rounds[f'loader_w{count}'].append(
            common.measure(
              common._no_setup,
              run_loader,
              (data_dir, batch_size, count, flag_values),
              _identity,
            )
          )
      results = {name: _median(runs) for name, runs in rounds.items()}
      for name, function in (('jax', run_jax), ('torchrl', run_torchrl)):
        results[name] = common.measure(
          common._no_setup,
          function,
          (data_dir, batch_size, flag_values),
          _identity,
        )
      disk = _disk_bytes(data_dir)
      disks = {name: disk for name in results}
      if kind == 'store':
        results['memmap'] = common.measure(
          common._no_setup,
          run_memmap,
          (memmap, npz, batch_size, flag_values),
          _identity,
        )
        disks['memmap'] = results['memmap'].digest['disk']
        results['floor'] = common.measure(
          common._no_setup, run_floor, (batch_size, flag_values), _identity
        )
        disks['floor'] = 0
      baseline = None
      for name, measurement in results.items():
        outcome = measurement.digest
        rate = outcome['transitions'] / outcome['wall']
        baseline = baseline or rate
        cpu_per_k = outcome['cpu'] / outcome['transitions'] * 1e6
        print(
          f'{kind:<9} {batch_size:>5} {name:<10} {rate:>14,.0f} '
          f'{rate / baseline:>6.2f} {cpu_per_k:>10.2f} '
          f'{measurement.peak_rss / 2**20:>7.0f}Mi '
          f'{outcome["worker_rss"] / 2**20:>10.0f}Mi '
          f'{disks[name] / 2**20:>7.1f}Mi',
          flush=True,
        )
  if not _WORK_DIR.value:
    shutil.rmtree(work)


if __name__ == '__main__':
  app.run(main)
