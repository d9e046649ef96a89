"""N processes over one store: what each holds, and what they share.

Processes that train one model (torchrun ranks, Ray Train workers, JAX
processes; DataLoader workers too) each open the store themselves. A store
of format 5 is read where it lies: what they share is page cache, once,
whatever their number; what each holds alone is its anonymous memory.

For `--processes` (1, 2 and 4 by default), that many fresh processes each
open the data at `--data` (a run's store, or a root of runs for a
ReplayMixture) with their rank's stream (ranks.py), sample batches of 32
for `--seconds`, and report:

* their anonymous memory (RssAnon), each;
* their file-backed resident memory (RssFile): the store's pages each
  maps, counted again in every process by the kernel, though held once;
* the machine's page cache (Cached in /proc/meminfo) before the processes
  start (emptied first, `--drop_caches`, when run as root) and when they
  have sampled: what they read together;
* transitions per CPU-second, each.

Usage: python benchmarks/shared_store_benchmark.py
  --data=benchmarks/data/compact_1000000x50 [--processes=1,2,4]
  [--seconds=10] [--mixture]
"""

import multiprocessing
import os
import time

from absl import app
from absl import flags
import common

_DATA = flags.DEFINE_string('data', None, 'A store, or a root of runs.')
_MIXTURE = flags.DEFINE_bool('mixture', False, '--data is a root of runs.')
_PROCESSES = flags.DEFINE_list('processes', ['1', '2', '4'], 'Process counts.')
_SECONDS = flags.DEFINE_float('seconds', 10.0, 'Sampling time a process.')
_DROP_CACHES = flags.DEFINE_bool(
  'drop_caches',
  True,
  'Empty the page cache before each count (root only; else it stays warm '
  'and "added" counts only pages not read before).',
)


def _status(field):
  return common._status_bytes(field)  # noqa: SLF001


def _cached():
  with open('/proc/meminfo') as meminfo:
    for line in meminfo:
      if line.startswith('Cached:'):
        return int(line.split()[1]) * 1024
  raise RuntimeError('no Cached in /proc/meminfo')


def _sample(data, mixture, rank, world_size, seconds, sampled, results):
  """One process: opens `data` as rank `rank`, samples, waits for the
  others (so all are resident at once), then reports."""
  import fixed_replay  # noqa: F401
  from fixed_replay import batches
  from fixed_replay import mixture as mixture_lib
  from fixed_replay import ranks

  anonymous = _status('RssAnon')
  arguments = ranks.seeded(
    {'batch_size': 32, 'seed': 0}, rank=rank, world_size=world_size
  )
  if mixture:
    sampler = mixture_lib.ReplayMixture(data, **arguments)
    sample = sampler.sample
  else:
    sampler = batches.open_buffer(data, dict(arguments, sampling_threads=0))
    sample = sampler.sample_transition_batch
  count, began, cpu = 0, time.perf_counter(), time.process_time()
  while time.perf_counter() - began < seconds:
    sample()
    count += 32
  rate = count / (time.process_time() - cpu)
  sampled.wait()  # Every process holds its pages now.
  results.put((rank, _status('RssAnon') - anonymous, _status('RssFile'), rate))
  sampled.wait()  # The parent has read the page cache.
  sampler.close()


def measure(data, mixture, world_size, seconds):
  """(page cache added, [(rank, anonymous, file-backed, rate)])."""
  context = multiprocessing.get_context('spawn')
  sampled = context.Barrier(world_size + 1)
  results = context.Queue()
  if _DROP_CACHES.value and os.access('/proc/sys/vm/drop_caches', os.W_OK):
    os.sync()
    with open('/proc/sys/vm/drop_caches', 'w') as drop:
      drop.write('1')  # The page cache only; the store is not touched.
  before = _cached()
  processes = [
    context.Process(
      target=_sample,
      args=(data, mixture, rank, world_size, seconds, sampled, results),
    )
    for rank in range(world_size)
  ]
  for process in processes:
    process.start()
  sampled.wait(timeout=1800)
  added = _cached() - before
  reports = sorted(results.get(timeout=60) for _ in processes)
  sampled.wait(timeout=60)
  for process in processes:
    process.join()
  return added, reports


def main(argv):
  del argv
  data, mixture = _DATA.value, _MIXTURE.value
  now = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
  print(
    f'shared_store_benchmark {now}, {os.cpu_count()} cores, '
    f'{common.load_average()}; '
    f'{"mixture of the runs under" if mixture else "the store"} {data}, '
    f'batch 32, {_SECONDS.value:.0f} s of sampling a process'
  )
  for count in map(int, _PROCESSES.value):
    added, reports = measure(data, mixture, count, _SECONDS.value)
    print(
      f'{count} process(es): page cache +{common.format_bytes(added)} in all'
    )
    for rank, anonymous, file_backed, rate in reports:
      print(
        f'  rank {rank}: anonymous +{common.format_bytes(anonymous)}, '
        f'file-backed {common.format_bytes(file_backed)}, '
        f'{rate:,.0f} transitions/CPU-s'
      )
  print(common.load_average())


if __name__ == '__main__':
  flags.mark_flag_as_required('data')
  app.run(main)
