"""Conversion throughput as workers are added: local processes against Ray.

Data: common.py's benchmark checkpoint (real Breakout, written by Dopamine,
`--rows` rows) under `--checkpoints` suffixes (hard links, so a run of
several checkpoints costs one file's disk), in a run directory under
benchmarks/data/ (git-ignored).

Measured, each `--repeats` times in turn, best wall time kept, all in this
process (fixed_replay.convert.convert.convert, the code of `fixed-replay
convert`):

  local N   worker processes (`--workers=N`), each checkpoint in one
            process, N = 1, 2 (a worker compresses with cores / N threads);
            the wall time includes spawning the workers (their start-up is
            also measured alone: N workers started, each running an empty
            call);
  ray N     a private local Ray with N CPUs (`--ray --workers=N`), one task
            per checkpoint on one CPU each (one compression thread). The
            cluster, whose worker processes start with it, is started
            before the clock and reused; its start and stop are timed apart
            and added in the last column, as `fixed-replay convert --ray`
            pays them once per command.

Frames per second of each against `local 1`, measured in the same run. Every
store is compared, byte for byte, with the first one.

Usage: python benchmarks/convert_scaling_benchmark.py [--rows=100000]
  [--checkpoints=4] [--repeats=2]
"""

import hashlib
import os
import shutil
import time

from absl import app
from absl import flags
from absl import logging
import common

from fixed_replay import distributed
from fixed_replay.convert import convert
from fixed_replay.convert import workers as worker_processes

_CHECKPOINTS = flags.DEFINE_integer(
  'checkpoints', 4, 'Checkpoints of the run (links to one checkpoint).'
)
_REPEATS = flags.DEFINE_integer('repeats', 2, 'Timed runs of each variant.')
_WORKER_COUNTS = (1, 2)


def build_run(rows, num_checkpoints):
  """A run of `num_checkpoints` suffixes, hard links to one checkpoint."""
  source = common.build_checkpoint(rows, game=common.GAME.value)
  run = common.DATA_DIR / f'scaling_{source.name}_x{num_checkpoints}'
  if run.exists() and len(os.listdir(run)) == 7 * num_checkpoints:
    return run
  shutil.rmtree(run, ignore_errors=True)
  run.mkdir(parents=True)
  for name in os.listdir(source):
    if name.endswith('_ckpt.0.gz'):
      for suffix in range(num_checkpoints):
        target = name.replace('_ckpt.0.gz', f'_ckpt.{suffix}.gz')
        os.link(source / name, run / target)
  return run


def store_digest(store):
  """sha256 over every file of the store but its locks, in path order."""
  digest = hashlib.sha256()
  for root, dirs, names in sorted(os.walk(store)):
    dirs.sort()
    for name in sorted(names):
      if name.startswith('.convert'):
        continue
      path = os.path.join(root, name)
      digest.update(os.path.relpath(path, store).encode())
      with open(path, 'rb') as stream:
        digest.update(stream.read())
  return digest.hexdigest()


def timed(run, work, name, **kwargs):
  """Best wall seconds of `repeats` conversions into fresh stores."""
  best, digest = float('inf'), None
  for repeat in range(_REPEATS.value):
    store = work / f'{name.replace(" ", "_")}_{repeat}'
    began = time.perf_counter()
    result = convert.convert(run, store, **kwargs)
    best = min(best, time.perf_counter() - began)
    digest = store_digest(store)
    frames = result.frames
    shutil.rmtree(store)
  return best, frames, digest


def pool_startup(workers, store):
  """Seconds to spawn a conversion pool and run an empty call in each."""
  began = time.perf_counter()
  pool, _ = worker_processes.start_pool(workers, [str(store)])
  try:
    list(pool.map(time.sleep, [0.0] * workers))
  finally:
    pool.shutdown(wait=True)
  return time.perf_counter() - began


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  rows, count = common.ROWS.value, _CHECKPOINTS.value
  run = build_run(rows, count)
  work = common.DATA_DIR / f'scaling_out_{os.getpid()}'
  work.mkdir()
  print(
    f'Conversion scaling: {count} checkpoints x {rows:,} rows of '
    f'{common.GAME.value} ({run}), best of {_REPEATS.value}'
  )
  print(f'{common.load_average()} at start ({os.cpu_count()} CPUs)')
  results, ray_costs, pool_costs = {}, {}, {}
  try:
    for workers in _WORKER_COUNTS:
      results[f'local {workers}'] = timed(
        run, work, f'local {workers}', workers=workers
      )
      pool_costs[workers] = pool_startup(workers, work)
    for workers in _WORKER_COUNTS:
      began = time.perf_counter()
      with distributed.cluster(num_cpus=workers) as info:
        started = time.perf_counter() - began
        results[f'ray {workers}'] = timed(run, work, f'ray {workers}', ray=info)
        stopping = time.perf_counter()
      ray_costs[f'ray {workers}'] = started + time.perf_counter() - stopping
  finally:
    shutil.rmtree(work, ignore_errors=True)
  print(f'{common.load_average()} at end\n')
  base_s, _, base_digest = results['local 1']
  print(
    f'{"variant":<10} {"wall s":>8} {"frames/s":>10} {"vs local 1":>11} '
    f'{"with Ray start+stop":>20}'
  )
  for name, (seconds, frames, digest) in results.items():
    same = '' if digest == base_digest else '  DIFFERENT BYTES'
    total = seconds + ray_costs.get(name, 0.0)
    with_ray = (
      f'{total:>8.2f} s {base_s / total:>5.2f}x' if name in ray_costs else ''
    )
    print(
      f'{name:<10} {seconds:>8.2f} {frames / seconds:>10,.0f} '
      f'{base_s / seconds:>10.2f}x {with_ray:>20}{same}'
    )
  for workers, seconds in pool_costs.items():
    print(
      f'local pool of {workers}: spawning the workers alone takes '
      f'{seconds:.1f} s (inside the local wall times)'
    )
  for name, seconds in ray_costs.items():
    print(f'{name}: Ray start and stop {seconds:.1f} s')
  digests = {digest for _, _, digest in results.values()}
  print(f'stores identical: {len(digests) == 1}')


if __name__ == '__main__':
  app.run(main)
