"""PyTorch DataLoader over the buffer vs the buffer alone vs TorchRL.

Samples minibatches of 32 stacked Atari transitions from one compact store
(`fixed-replay convert` of the benchmark's real Breakout checkpoint, see
common.py) in four ways, each in a fresh process:

* `buffer`: CompactReplayBuffer.sample_transition_batch in one process, as
  ReplayDataset configures it (one batch thread): the baseline;
* `loader_w0`, `loader_w1`, `loader_w2`: fixed_replay.torch.ReplayDataset
  through `DataLoader(batch_size=None, num_workers=N)`;
* `torchrl` (when TorchRL imports): TorchRL's `ReplayBuffer` with
  `LazyMemmapStorage` + `RandomSampler` holding the same rows uncompressed
  (one frame, action, reward and terminal per row). It returns single frames
  with no stacking, n-step return or valid-row rule, i.e. less work than the
  others: a lower bound on what an exact TorchRL equivalent would cost.

It prints transitions/s (wall), CPU seconds per 1,000 transitions (the
training process and its workers), peak RSS of the training process, the
RSS of the workers, and bytes on disk, with each throughput as a ratio to
the baseline measured in the same run.

TorchRL is not a dependency: install it aside for this benchmark only, e.g.
  pip install --no-deps --target /tmp/torchrl_bench torchrl==0.14.1 \
      tensordict==0.14.3 hoptorch==0.1.4 importlib_metadata==10.2.0 \
      lazy-importer==0.1.0 orjson==3.13.0 pyvers==0.2.3
and pass --torchrl_path=/tmp/torchrl_bench.

Usage:
  python benchmarks/torch_loader_benchmark.py --rows=50000 \
      --torchrl_path=/tmp/torchrl_bench
"""

import os
import resource
import shutil
import sys
import tempfile
import time

from absl import app
from absl import flags
from absl import logging
import common
import numpy as np

_BATCHES = flags.DEFINE_integer('batches', 2000, 'Minibatches per method.')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 32, 'Transitions a batch.')
_DATA_DIR = flags.DEFINE_string(
  'data_dir', str(common.DATA_DIR), 'Where the benchmark checkpoint lives.'
)
_WORK_DIR = flags.DEFINE_string(
  'work_dir', None, 'Where the store and the memmap go (default: a temp dir).'
)
_TORCHRL_PATH = flags.DEFINE_string(
  'torchrl_path', None, 'A directory holding TorchRL (pip --target).'
)

ATARI = dict(observation_shape=(84, 84), stack_size=4)


def _disk_bytes(directory):
  return sum(
    os.path.getsize(os.path.join(root, name))
    for root, _, names in os.walk(directory)
    for name in names
  )


def _children_rss():
  import psutil

  children = psutil.Process().children(recursive=True)
  return sum(child.memory_info().rss for child in children)


def _children_cpu():
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def _timed(batches, num_batches):
  """Pulls num_batches from `batches`; returns (wall s, cpu s, worker rss)."""
  iterator = iter(batches)
  next(iterator)  # Not counted: first batch (worker start, thread start).
  began, cpu = time.perf_counter(), time.process_time()
  worker_rss = 0
  for count in range(num_batches):
    next(iterator)
    if count == num_batches // 2:
      worker_rss = _children_rss()
  return time.perf_counter() - began, time.process_time() - cpu, worker_rss


def run_buffer(store, num_batches, batch_size):
  from fixed_replay import batches

  buffer = batches.open_buffer(
    store, dict(ATARI, batch_size=batch_size, seed=0)
  )
  wall, cpu, _ = _timed(batches.sample(buffer), num_batches)
  buffer.close()
  return dict(wall=wall, cpu=cpu, worker_rss=0)


def run_loader(store, num_batches, batch_size, num_workers):
  from torch.utils.data import DataLoader

  from fixed_replay.torch import ReplayDataset

  dataset = ReplayDataset(store, batch_size=batch_size, seed=0, **ATARI)
  loader = DataLoader(dataset, batch_size=None, num_workers=num_workers)
  before = _children_cpu()
  iterator = iter(loader)
  wall, cpu, worker_rss = _timed(iterator, num_batches)
  del iterator  # Workers exit; their CPU time then counts as children's.
  dataset.close()
  return dict(
    wall=wall, cpu=cpu + _children_cpu() - before, worker_rss=worker_rss
  )


def run_torchrl(memmap_dir, rows_npz, num_batches, batch_size, torchrl_path):
  sys.path.append(torchrl_path)
  import tensordict
  import torch
  from torchrl.data import LazyMemmapStorage
  from torchrl.data import ReplayBuffer
  from torchrl.data.replay_buffers.samplers import RandomSampler

  arrays = np.load(rows_npz)
  rows = len(arrays['action'])
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

  wall, cpu, _ = _timed(endless(), num_batches)
  return dict(wall=wall, cpu=cpu, worker_rss=0, disk=_disk_bytes(memmap_dir))


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


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  checkpoint = str(
    common.build_checkpoint(common.ROWS.value, data_dir=_DATA_DIR.value)
  )
  work = _WORK_DIR.value or tempfile.mkdtemp(prefix='torch_loader_bench_')
  store = os.path.join(work, 'store')
  if not os.path.isdir(store):
    from fixed_replay.store import convert

    convert.convert(checkpoint, store, workers=0)
  print(
    f'{common.ROWS.value:,} Breakout rows, {_BATCHES.value} batches of '
    f'{_BATCH_SIZE.value}; {common.load_average()}; {os.cpu_count()} CPUs'
  )
  args = (store, _BATCHES.value, _BATCH_SIZE.value)
  results = {
    'buffer': common.measure(common._no_setup, run_buffer, args, _identity)
  }
  for workers in (0, 1, 2):
    results[f'loader_w{workers}'] = common.measure(
      common._no_setup, run_loader, args + (workers,), _identity
    )
  disks = {name: _disk_bytes(store) for name in results}
  if _TORCHRL_PATH.value:
    npz = os.path.join(work, 'rows.npz')
    _dopamine_rows(checkpoint, npz)
    memmap = os.path.join(work, 'memmap')
    shutil.rmtree(memmap, ignore_errors=True)
    results['torchrl'] = common.measure(
      common._no_setup,
      run_torchrl,
      (memmap, npz, _BATCHES.value, _BATCH_SIZE.value, _TORCHRL_PATH.value),
      _identity,
    )
    disks['torchrl'] = results['torchrl'].digest['disk']
  baseline = None
  print(
    f'{"method":<10} {"transitions/s":>14} {"ratio":>6} {"cpu s/1k":>9} '
    f'{"peak RSS":>9} {"workers RSS":>12} {"disk":>9}'
  )
  for name, measurement in results.items():
    outcome = measurement.digest
    rate = _BATCHES.value * _BATCH_SIZE.value / outcome['wall']
    baseline = baseline or rate
    cpu_per_k = outcome['cpu'] / (_BATCHES.value * _BATCH_SIZE.value) * 1000
    print(
      f'{name:<10} {rate:>14,.0f} {rate / baseline:>6.2f} {cpu_per_k:>9.3f} '
      f'{measurement.peak_rss / 2**20:>7.0f}Mi '
      f'{outcome["worker_rss"] / 2**20:>10.0f}Mi '
      f'{disks[name] / 2**20:>7.1f}Mi'
    )
  if not _WORK_DIR.value:
    shutil.rmtree(work)


if __name__ == '__main__':
  app.run(main)
