"""Is the training step ever kept waiting? PyTorch workers, JAX, TorchRL.

The first table (`--tables=fed`, the default) answers the question a GPU
user asks. A training loop takes each batch into a stand-in for a GPU step:
`--gil_ms` of Python holding the GIL (as kernel launches do), then a
GIL-free wait to the end of the step (as waiting on the device does). Each
loader runs that loop on a busy-frame store (`--busy_game`, MsPacman) and on
Breakout, at batch 32 with a 1 ms step and at batch 256 with a 4 ms step
(`--steps`): `DataLoader(ReplayDataset(...), batch_size=None,
num_workers=N)` for N = 0, 1 and 2, and `jax_batches.ReplayBatches` (device
prefetch, CPU device here). "fed" is the loop's rate over the step's rate
alone, measured in the same run: 1.00 means the step never waited for data.
"loader CPU" is the training process's own CPU per batch beyond the step
alone: for N = 0 and JAX all the sampling (its thread), for workers the
hand-off. The workers' CPU per batch is beside it.

The second table (`--tables=alone`) is the loader alone, no step:
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
  python benchmarks/torch_loader_benchmark.py --rows=50000 --tables=alone
"""

import itertools
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
  'work_dir', None, 'Where the stores and the memmap go (default: a temp dir).'
)
_TABLES = flags.DEFINE_list(
  'tables', ['fed'], "'fed' (a loop with a stand-in step) and/or 'alone'."
)
_BUSY_GAME = flags.DEFINE_string(
  'busy_game', 'MsPacman', 'The busy-frame game of the fed table.'
)
_GIL_MS = flags.DEFINE_float(
  'gil_ms', 0.4, "The stand-in step's Python work holding the GIL, ms."
)
_STEPS = flags.DEFINE_list(
  'steps', ['32:1', '256:4'], 'batch:step ms pairs of the fed table.'
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


def _front_door(name, data_dir, batch_size, num_workers):
  """(batches, size_of, close) of a front door over `data_dir`.

  'torch': a DataLoader over ReplayDataset with `num_workers` workers;
  'jax': jax_batches.ReplayBatches, each batch waited for on the device.
  """
  if name == 'jax':
    import jax

    from fixed_replay.jax_batches import ReplayBatches

    replay = ReplayBatches(data_dir, batch_size=batch_size, seed=0, **ATARI)

    def ready(batch):
      jax.block_until_ready(batch)
      return batch['indices'].shape[0]

    return iter(replay), ready, replay.close
  from torch.utils.data import DataLoader

  from fixed_replay.torch import ReplayDataset

  dataset = ReplayDataset(data_dir, batch_size=batch_size, seed=0, **ATARI)
  # The benchmark runs in a spawned process, whose default start method is
  # spawn; a user's script on Linux forks its workers (Python < 3.14).
  loader = DataLoader(
    dataset,
    batch_size=None,
    num_workers=num_workers,
    multiprocessing_context=_START_METHOD.value if num_workers else None,
  )
  return iter(loader), lambda batch: len(batch['indices']), dataset.close


def run_front_door(name, data_dir, batch_size, num_workers, flag_values):
  """Batches a front door gives as fast as it can (`_timed`)."""
  flags.FLAGS(flag_values)
  batches, size_of, close = _front_door(name, data_dir, batch_size, num_workers)
  outcome = _timed(batches, size_of)
  close()
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


def stand_in_step(gil_s, step_s):
  """A GPU training step's shape: Python work holding the GIL, then a wait.

  The wait (to `step_s` after the start) releases the GIL, as a device
  synchronisation does, so a sampling thread may run in it.
  """
  began = time.perf_counter()
  while time.perf_counter() - began < gil_s:
    pass
  left = step_s - (time.perf_counter() - began)
  if left > 0:
    time.sleep(left)


def _fed_loop(iterator, step_s, flag_values):
  """Steps on each batch for --warmup_s, then --seconds; returns the counts."""
  flags.FLAGS(flag_values)
  gil_s = _GIL_MS.value / 1000
  warm_until = time.perf_counter() + _WARMUP_S.value
  while time.perf_counter() < warm_until:
    next(iterator)
    stand_in_step(gil_s, step_s)
  began, cpu = time.perf_counter(), time.process_time()
  workers_cpu, steps = _children_cpu(), 0
  while time.perf_counter() - began < _SECONDS.value:
    next(iterator)
    stand_in_step(gil_s, step_s)
    steps += 1
  return dict(
    steps=steps,
    wall=time.perf_counter() - began,
    cpu=time.process_time() - cpu,
    workers_cpu=_children_cpu() - workers_cpu,
  )


def fed_step_alone(step_s, flag_values):
  return _fed_loop(itertools.repeat(0), step_s, flag_values)


def fed_front_door(
  name, data_dir, batch_size, num_workers, step_s, flag_values
):
  """A front door feeding the loop of stand-in steps (`_fed_loop`)."""
  flags.FLAGS(flag_values)
  batches, _, close = _front_door(name, data_dir, batch_size, num_workers)
  outcome = _fed_loop(batches, step_s, flag_values)
  close()
  return outcome


def fed_table(stores, flag_values):
  """Prints the fed table: every loader in the loop, each data and step."""
  print(
    f'\nFed: a loop of stand-in steps ({_GIL_MS.value:g} ms holding the GIL, '
    f'then a GIL-free wait); {_WARMUP_S.value:g} s warm-up, '
    f'{_SECONDS.value:g} s timed, each in a fresh process; '
    f'{common.load_average()}'
  )
  print(
    f'{"data":<10} {"batch":>5} {"step":>5} {"loader":<8} {"steps/s":>8} '
    f'{"fed":>5} {"loader CPU ms/batch":>20} {"workers CPU ms/batch":>21}'
  )
  for pair in _STEPS.value:
    batch_size, step_ms = (float(x) for x in pair.split(':'))
    batch_size, step_s = int(batch_size), step_ms / 1000
    alone = common.measure(
      common._no_setup, fed_step_alone, (step_s, flag_values), _identity
    ).digest
    alone_rate = alone['steps'] / alone['wall']
    alone_cpu = alone['cpu'] / alone['steps']
    for game, store in stores.items():
      runs = {f'torch w{n}': ('torch', n) for n in (0, 1, 2)}
      runs['jax'] = ('jax', 0)
      for name, (front_door, num_workers) in runs.items():
        args = (front_door, store, batch_size, num_workers, step_s, flag_values)
        outcome = common.measure(
          common._no_setup, fed_front_door, args, _identity
        ).digest
        rate = outcome['steps'] / outcome['wall']
        loader_cpu = outcome['cpu'] / outcome['steps'] - alone_cpu
        print(
          f'{game:<10} {batch_size:>5} {step_ms:>4g}ms {name:<8} '
          f'{rate:>8,.0f} {rate / alone_rate:>5.2f} '
          f'{loader_cpu * 1e3:>20.3f} '
          f'{outcome["workers_cpu"] / outcome["steps"] * 1e3:>21.3f}',
          flush=True,
        )
    print(
      f'{"step alone":<10} {batch_size:>5} {step_ms:>4g}ms {"":<8} '
      f'{alone_rate:>8,.0f} {1:>5.2f} {alone_cpu * 1e3:>20.3f} (the step)'
    )


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


def alone_table(checkpoint, store, work, flag_values):
  """Prints the loader-alone table (no step) on Breakout."""
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
              run_front_door,
              ('torch', data_dir, batch_size, count, flag_values),
              _identity,
            )
          )
      results = {name: _median(runs) for name, runs in rounds.items()}
      results['jax'] = common.measure(
        common._no_setup,
        run_front_door,
        ('jax', data_dir, batch_size, 0, flag_values),
        _identity,
      )
      results['torchrl'] = common.measure(
        common._no_setup,
        run_torchrl,
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


def _stored(checkpoint, store):
  """`checkpoint` converted into `store` (once)."""
  if not os.path.isdir(store):
    from fixed_replay.convert import convert

    convert.convert(checkpoint, store, workers=0)
  return store


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  flag_values = [
    'benchmark',
    f'--seconds={_SECONDS.value}',
    f'--warmup_s={_WARMUP_S.value}',
    f'--start_method={_START_METHOD.value}',
    f'--gil_ms={_GIL_MS.value}',
  ]
  rows = common.ROWS.value
  checkpoint = str(common.build_checkpoint(rows, data_dir=_DATA_DIR.value))
  work = _WORK_DIR.value or tempfile.mkdtemp(prefix='torch_loader_bench_')
  store = _stored(checkpoint, os.path.join(work, 'store'))
  print(
    f'{rows:,}-row checkpoints; {os.cpu_count()} CPUs; 10M Python integer '
    f'additions take {common.python_speed():.2f} CPU-s here'
  )
  if 'fed' in _TABLES.value:
    busy = common.build_checkpoint(
      rows, data_dir=_DATA_DIR.value, game=_BUSY_GAME.value
    )
    busy_store = _stored(str(busy), os.path.join(work, 'busy_store'))
    fed_table({_BUSY_GAME.value: busy_store, 'Breakout': store}, flag_values)
  if 'alone' in _TABLES.value:
    alone_table(checkpoint, store, work, flag_values)
  if not _WORK_DIR.value:
    shutil.rmtree(work)


if __name__ == '__main__':
  app.run(main)
