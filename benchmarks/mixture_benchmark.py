"""Many games at once: a mixture of runs against one run, one store shared.

Training on many games samples a `ReplayMixture` over every checkpoint of
every run: it should cost about what one run costs a transition and hold
little a run beyond the frames' files, which it maps where they lie. Data:
one converted checkpoint (`--origin`, else `--busy_game` played at `--rows`
by common.py, converted) hard-linked into a root laid out as the DQN Replay
Dataset is, `--runs` runs of `--checkpoints` checkpoints under ALE game
names, each run its own copy of the run dictionary (as distinct runs have).
The parts (`--parts`), in fresh processes:

* mixture: `FixedReplayBuffer` over one run, sampled in the calling thread
  (the baseline), against `ReplayMixture` over every run: seconds to open,
  transitions per CPU-second, minor page faults a transition, anonymous
  memory held once sampled (RssAnon) and peak RSS. Mixture elements are
  checked against the one run's buffer at their (checkpoint, row).
* loader: DataLoaders of `--loader_workers` workers (0 skips it) over the
  mixture (`MixtureDataset`) and the one run (`ReplayDataset`, baseline):
  seconds to the first batch, and what each worker wrote itself
  (Private_Dirty: not pages shared with its parent or mapped from files).
* shared: ranks training one model (torchrun, Ray Train, JAX) each open the
  store. For each of `--processes`, that many sample the one run, each its
  rank's stream, then report together: anonymous memory (each its own),
  file-backed resident memory (counted in each, held once), rate against
  the first count's rank 0, and the page cache they added (emptied first
  when run as root).

Usage:
  python benchmarks/mixture_benchmark.py --runs=4 --checkpoints=10
    --seconds=6 --origin=STORE/checkpoint_0 --loader_workers=0
  python benchmarks/mixture_benchmark.py [--runs=40] [--checkpoints=50]
    [--busy_game=MsPacman] [--seconds=10] [--parts=mixture,loader,shared]

The whole dataset's count under a desktop's limits: `ulimit -Sn 1024;
python benchmarks/mixture_benchmark.py --runs=300 --parts=mixture ...`.
"""

import multiprocessing
import os
import resource
import shutil
import time

from absl import app
from absl import flags
from absl import logging
import common
import numpy as np

_PARTS = flags.DEFINE_list('parts', ['mixture', 'loader', 'shared'], 'Parts.')
_RUNS = flags.DEFINE_integer('runs', 40, 'Runs of the mixture.')
_CHECKPOINTS = flags.DEFINE_integer('checkpoints', 50, 'Checkpoints a run.')
_GAME = flags.DEFINE_string('busy_game', 'MsPacman', 'Game played (no origin).')
_SECONDS = flags.DEFINE_float('seconds', 10.0, 'Sampling time per method.')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 32, 'Transitions a batch.')
_ORIGIN = flags.DEFINE_string('origin', None, 'A stored checkpoint to link.')
_LOADER_WORKERS = flags.DEFINE_integer('loader_workers', 4, 'Its workers.')
_PROCESSES = flags.DEFINE_list('processes', ['1', '2', '4'], 'Processes.')

# ALE games the runs are filed under, in turn.
GAMES = ('Asterix', 'Breakout', 'Enduro', 'MsPacman', 'Pong', 'Qbert')
GAMES += ('Seaquest', 'SpaceInvaders')
CHECKED = 64  # Mixture elements compared with the one run's buffer.


def _setup():
  from fixed_replay import mixture  # noqa: F401
  from fixed_replay.replay import fixed_replay_buffer  # noqa: F401


def _proc(field, path='/proc/self/status'):
  """A field of /proc/self/status (or of another file of /proc), in bytes."""
  with open(path) as lines:
    for line in lines:
      if line.startswith(field + ':'):
        return int(line.split()[1]) * 1024
  raise RuntimeError(f'no {field} in {path}')


def build_root(num_runs, num_checkpoints, origin):
  """ROOT/<game>/<run>/checkpoint_<s>/: hard links of `origin`, each with
  its own manifest, and a copy of its run dictionary a run."""
  from fixed_replay.store import manifest as manifest_lib
  from fixed_replay.store import run_dictionary

  manifest = manifest_lib.read_manifest(origin)
  name = f'mixture_{manifest["num_rows"]}_rows_{num_runs}x{num_checkpoints}'
  root = os.path.join(common.DATA_DIR, name)
  for run in range(num_runs):
    game = GAMES[run % len(GAMES)]
    run_dir = os.path.join(root, game, str(run // len(GAMES) + 1))
    common.link_checkpoints(origin, run_dir, range(num_checkpoints), game=game)
    dictionary = run_dictionary.checkpoint_path(origin)
    copy = os.path.join(run_dir, manifest_lib.RUN_DICTIONARY_FILE)
    if os.path.exists(dictionary) and not os.path.exists(copy):
      shutil.copy(dictionary, copy)
  return root


def _rate(sample, seconds):
  """(transitions per CPU-second, minor page faults a transition) of
  sample() for `seconds` of wall time, after one untimed call."""
  sample()
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  count, began, cpu = 0, time.perf_counter(), time.process_time()
  while time.perf_counter() - began < seconds:
    count += len(sample()['indices'])
  rate = count / (time.process_time() - cpu)
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
  return rate, faults / count


def _open_run(run_dir, arguments):
  """(the buffer of one run, a sample() giving named arrays)."""
  from fixed_replay import batches

  buffer = batches.open_buffer(run_dir, dict(arguments, sampling_threads=0))
  return buffer, lambda: batches.named(buffer, buffer.sample_transition_batch())


def sample(path, batch_size, seconds, check_dir=None):
  """((open s, maps, open files), (rate, faults), anonymous bytes held,
  details) of one run's
  buffer at `path`, or, given `check_dir` (one run: the reference), of the
  mixture over the root `path`, its elements then checked against it."""
  from fixed_replay import batches
  from fixed_replay import mixture

  anonymous = _proc('RssAnon')
  began = time.perf_counter()
  if check_dir is None:
    sampler, draw = _open_run(path, {'batch_size': batch_size, 'seed': 0})
  else:
    sampler = mixture.ReplayMixture(path, batch_size=batch_size, seed=0)
    draw = sampler.sample
  opened = time.perf_counter() - began
  with open('/proc/self/maps') as maps:
    held_maps = sum(1 for _ in maps)
  files = len(os.listdir('/proc/self/fd'))
  opened = (opened, held_maps, files)
  rate = _rate(draw, seconds)
  held = _proc('RssAnon') - anonymous
  if check_dir is None:
    return opened, rate, held, sampler.num_valid_transitions
  batch = sampler.sample(CHECKED)
  sampler.close()
  buffer = batches.open_buffer(check_dir, {'sampling_threads': 0})
  where = dict(indices=batch['indices'], suffixes=batch['suffix'])
  drawn = buffer.sample_transition_batch(CHECKED, **where)
  expected = batches.named(buffer, drawn)
  same = all(np.array_equal(expected[k], batch[k]) for k in expected)
  games = len(set(batch['game_id'].tolist()))
  return opened, rate, held, (len(sampler.runs), games, same)


def loader(path, batch_size, workers, whole):
  """(s to the first batch, each worker's Private_Dirty bytes once every
  worker has sent two batches) of a DataLoader over the mixture at `path`
  (`whole`) or over the one run there."""
  from torch.utils import data

  from fixed_replay.torch import MixtureDataset
  from fixed_replay.torch import ReplayDataset

  kind = MixtureDataset if whole else ReplayDataset
  dataset = kind(path, batch_size=batch_size, seed=0)
  began = time.perf_counter()
  iterator = iter(data.DataLoader(dataset, None, num_workers=workers))
  next(iterator)
  first = time.perf_counter() - began
  for _ in range(2 * workers):
    next(iterator)
  pids = [worker.pid for worker in iterator._workers]  # noqa: SLF001
  return first, [
    _proc('Private_Dirty', f'/proc/{p}/smaps_rollup') for p in pids
  ]


def _rank(rank, run_dir, world_size, seconds, sampled, results):
  """One of `world_size` processes: opens `run_dir` as rank `rank`,
  samples, waits for the others (all resident at once), reports."""
  import fixed_replay  # noqa: F401
  from fixed_replay import ranks

  anonymous = _proc('RssAnon')
  arguments = ranks.seeded({'batch_size': 32, 'seed': 0}, rank, world_size)
  buffer, sample = _open_run(run_dir, arguments)
  rate, _ = _rate(sample, seconds)
  sampled.wait()
  results.put((rank, _proc('RssAnon') - anonymous, _proc('RssFile'), rate))
  sampled.wait()  # The parent has read the page cache.
  buffer.close()


def shared_store(run_dir, world_size, seconds):
  """(page cache added, [(rank, anonymous, file-backed, rate)])."""
  context = multiprocessing.get_context('spawn')
  sampled, results = context.Barrier(world_size + 1), context.Queue()
  if os.access('/proc/sys/vm/drop_caches', os.W_OK):
    os.sync()
    with open('/proc/sys/vm/drop_caches', 'w') as drop:
      drop.write('1')  # The page cache only; nothing is written.
  before = _proc('Cached', '/proc/meminfo')
  args = (run_dir, world_size, seconds, sampled, results)
  processes = [
    context.Process(target=_rank, args=(r, *args)) for r in range(world_size)
  ]
  for process in processes:
    process.start()
  sampled.wait(timeout=1800)
  added = _proc('Cached', '/proc/meminfo') - before
  reports = sorted(results.get(timeout=60) for _ in processes)
  sampled.wait(timeout=60)
  for process in processes:
    process.join()
  return added, reports


def _origin():
  """--origin, else the busy game's checkpoint converted (once)."""
  if _ORIGIN.value:
    return _ORIGIN.value
  checkpoint = str(common.build_checkpoint(common.ROWS.value, game=_GAME.value))
  if not os.path.isdir(checkpoint + '_store'):
    from fixed_replay.convert import convert

    convert.convert(checkpoint, checkpoint + '_store', workers=0)
  return os.path.join(checkpoint + '_store', 'checkpoint_0')


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  runs, num_checkpoints = _RUNS.value, _CHECKPOINTS.value
  seconds, batch_size, parts = _SECONDS.value, _BATCH_SIZE.value, _PARTS.value
  origin = _origin()
  root = build_root(runs, num_checkpoints, origin)
  run_dir = os.path.join(root, GAMES[0], '1')
  print(
    f'{runs} runs x {num_checkpoints} checkpoints, hard links of {origin}; '
    f'batch {batch_size}, {seconds:g} s of sampling each; '
    f'{os.cpu_count()} CPUs, {common.load_average()}'
  )
  if 'mixture' in parts:
    print(f'\nOne run against the mixture; {common.load_average()}')
    measured = {}
    for name, args in (
      ('one run', (run_dir, batch_size, seconds)),
      ('mixture', (root, batch_size, seconds, run_dir)),
    ):
      # tuple(): the digest keeps the result (a tuple) as it is.
      measured[name] = common.measure(_setup, sample, args, tuple)
      (opened, maps, files), (rate, faults), held, _ = measured[name].digest
      baseline = measured['one run'].digest[1][0]
      print(
        f'{name}: open {opened:6.1f} s ({maps:,} maps, {files:,} open '
        f'files), {rate:9,.0f} transitions/CPU-s ({rate / baseline:.2f}x one '
        f'run), {faults:.3f} minor faults a transition, anonymous '
        f'+{common.format_bytes(held)}, peak RSS '
        f'{common.format_bytes(measured[name].peak_rss)}'
      )
    valid = measured['one run'].digest[3] * _RUNS.value
    _, _, held, (num_runs, games, same) = measured['mixture'].digest
    print(
      f'mixture: {num_runs} runs, {valid:,} valid transitions, '
      f'{held / valid:.2f} anonymous B a transition; {games} games in a '
      f"batch of {CHECKED}; elements equal the one run's: {same}"
    )
    if not same:
      raise AssertionError("mixture elements differ from the one run's")
  workers = _LOADER_WORKERS.value
  if 'loader' in parts and workers:
    print(f'\nDataLoader, {workers} workers; {common.load_average()}')
    for name, path in (('one run', run_dir), ('mixture', root)):
      args = (path, batch_size, workers, name == 'mixture')
      first, dirty = common.measure(_setup, loader, args, tuple).digest
      print(
        f'over the {name}: first batch in {first:.1f} s; each worker wrote '
        '(Private_Dirty) ' + ', '.join(map(common.format_bytes, dirty))
      )
  if 'shared' in parts:
    print(f'\nProcesses over one run ({run_dir}); {common.load_average()}')
    counts, alone = list(map(int, _PROCESSES.value)), None
    for count in counts:
      added, reports = shared_store(run_dir, count, seconds)
      print(f'{count} process(es): page cache +{common.format_bytes(added)}')
      for rank, anonymous, file_backed, rate in reports:
        alone = alone or rate
        print(
          f'  rank {rank}: anonymous +{common.format_bytes(anonymous)}, '
          f'file-backed {common.format_bytes(file_backed)}, {rate:,.0f} '
          f'transitions/CPU-s ({rate / alone:.2f}x rank 0 of {counts[0]})'
        )
  print(common.load_average())


if __name__ == '__main__':
  app.run(main)
