"""Many games at once: a mixture of runs against one run, in one benchmark.

The data: one converted checkpoint of busy frames (benchmarks/data/busy_<G>,
random play written by Dopamine's writer; see busy_store_benchmark.py),
hard-linked into a root laid out as the DQN Replay Dataset is,
`--runs` runs of `--checkpoints` checkpoints, spread over as many ALE game
names (each checkpoint with its own manifest naming its folder's game).
Each measurement runs in a fresh process:

* one run: `FixedReplayBuffer` over one run's store, batch `--batch_size`,
  sampled in the calling thread (the baseline);
* the mixture: `fixed_replay.ReplayMixture` over every run, same batch
  size, every checkpoint of every run loaded;
* a control: the mixture again, every checkpoint decoding with one shared
  dictionary (see _setup_one_dictionary);
* a DataLoader with `--loader_workers` workers over the mixture
  (fixed_replay.torch.MixtureDataset), and over the one run
  (ReplayDataset: the baseline, the same imports): seconds to its first
  batch, and what each worker has written of its own (Private_Dirty: not
  the pages it shares with the parent or maps from the store) once all
  have sent batches.

Reported: seconds to open, transitions per CPU-second and minor page faults
a transition, and the memory held once opened and sampled: anonymous
(RssAnon: what the process allocated; the frames' files are mapped, not
anonymous) and all resident (VmHWM, the peak, imports included). Both
sample the same bytes, so a mixture batch's elements are checked against
the one run's buffer at their (checkpoint, row).

Usage: python benchmarks/mixture_benchmark.py [--runs=40] [--checkpoints=50]
  [--busy_game=MsPacman] [--seconds=10] [--origin=STORE/checkpoint_0]
  [--nocontrol] [--loader_workers=4]
"""

import os
import resource
import shutil
import time
import zlib

from absl import app
from absl import flags
import busy_store_benchmark
import common
import numpy as np

_RUNS = flags.DEFINE_integer('runs', 40, 'Runs of the mixture.')
# --checkpoints (50, checkpoints a run) is busy_store_benchmark's flag.
_CHECKPOINTS = busy_store_benchmark._CHECKPOINTS  # noqa: SLF001
_GAME = flags.DEFINE_string('busy_game', 'MsPacman', 'busy_<game> data.')
_SECONDS = flags.DEFINE_float('seconds', 10.0, 'Sampling time per method.')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 32, 'Transitions a batch.')
_ORIGIN = flags.DEFINE_string(
  'origin',
  None,
  "A stored checkpoint to hard-link instead of busy_<game>'s (e.g. "
  'benchmarks/data/compact_1000000x50/checkpoint_0, 1M rows).',
)
_LOADER_WORKERS = flags.DEFINE_integer(
  'loader_workers',
  4,
  'DataLoader workers over the mixture (fixed_replay.torch.MixtureDataset) '
  'for its first batch and their memory; 0 skips it.',
)
_CONTROL = flags.DEFINE_bool(
  'control', True, 'Also measure the one-dictionary control.'
)

# ALE games the runs are filed under, 5 runs each by default.
GAMES = (
  'Asterix',
  'Breakout',
  'Enduro',
  'MsPacman',
  'Pong',
  'Qbert',
  'Seaquest',
  'SpaceInvaders',
)
CHECKED = 64  # Mixture elements compared with the one run's buffer.


def _setup():
  from fixed_replay import mixture  # noqa: F401
  from fixed_replay.replay import fixed_replay_buffer  # noqa: F401


def _setup_one_dictionary():
  """The control: every checkpoint decodes with one digested dictionary.

  Not a way to run: here every run holds the same bytes (hard links and
  copies), while each of the dataset's trains its own. What it shows is the
  cost of decoding against the runs' dictionaries (one a run in format 4,
  one a checkpoint before: 2,000, 2 GB, far past the CPU's caches and TLB)
  instead of one.
  """
  _setup()
  from fixed_replay.store import run_dictionary

  def sharing(make):
    digested = {}

    def shared(data):
      key = zlib.crc32(data)
      if key not in digested:
        digested[key] = make(data)
      return digested[key]

    return shared

  # The run's dictionary, one a distinct content.
  run_dictionary._RunDictionary = sharing(run_dictionary._RunDictionary)  # noqa: SLF001


def _private_dirty(pid):
  """Bytes process `pid` has written itself (not shared with its parent)."""
  with open(f'/proc/{pid}/smaps_rollup') as rollup:
    for line in rollup:
      if line.startswith('Private_Dirty:'):
        return int(line.split()[1]) * 1024
  raise RuntimeError(f'no Private_Dirty for {pid}')


def loader(path, batch_size, workers, whole_mixture):
  """(seconds to the first batch, each worker's own written bytes once
  every worker has sent two batches) of a DataLoader over the mixture at
  `path`, or over the one run there (the baseline: same imports, one run's
  buffer)."""
  from torch.utils import data

  from fixed_replay import torch as fixed_replay_torch

  kind = fixed_replay_torch.ReplayDataset
  if whole_mixture:
    kind = fixed_replay_torch.MixtureDataset
  dataset = kind(path, batch_size=batch_size, seed=0)
  began = time.perf_counter()
  iterator = iter(
    data.DataLoader(dataset, batch_size=None, num_workers=workers)
  )
  next(iterator)
  first = time.perf_counter() - began
  for _ in range(2 * workers):
    next(iterator)
  dirty = [_private_dirty(w.pid) for w in iterator._workers]  # noqa: SLF001
  del iterator
  return first, dirty


def _identity(result):
  return result


def _status(field):
  return common._status_bytes(field)  # noqa: SLF001


def build_root(game, num_runs, num_checkpoints, origin=None):
  """ROOT/<game>/<run>/checkpoint_<s>/: hard links of one converted one
  (`origin`, else busy_<game> converted)."""
  from fixed_replay.convert import convert
  from fixed_replay.store import manifest as manifest_lib
  from fixed_replay.store import run_dictionary

  name = game
  if origin is None:
    source = os.path.join(common.DATA_DIR, f'busy_{game}')
    converted = os.path.join(common.DATA_DIR, f'mixture_{game}_store')
    if not os.path.isdir(converted):
      convert.convert(source, converted, workers=0)
    origin = os.path.join(converted, manifest_lib.checkpoint_dirname(0))
  else:
    rows = manifest_lib.read_manifest(origin)['num_rows']
    name = f'{rows}_rows'
  root = os.path.join(
    common.DATA_DIR, f'mixture_{name}_{num_runs}x{num_checkpoints}'
  )
  for run in range(num_runs):
    folder_game = GAMES[run % len(GAMES)]
    run_dir = os.path.join(root, folder_game, str(run // len(GAMES) + 1))
    busy_store_benchmark.link_checkpoints(
      origin, run_dir, range(num_checkpoints), game=folder_game
    )
    # Format 4: each run its own copy of the dictionary (distinct pages).
    dictionary = run_dictionary.checkpoint_path(origin)
    copy = os.path.join(run_dir, manifest_lib.RUN_DICTIONARY_FILE)
    if os.path.exists(dictionary) and not os.path.exists(copy):
      shutil.copy(dictionary, copy)
  return root


def _rate(sample, seconds):
  """(transitions per CPU-second, minor page faults a transition) of
  sample() for `seconds` of wall time, after one untimed call (which may
  compile the kernels, in the first process after a change to them)."""
  sample()
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  count, began, cpu = 0, time.perf_counter(), time.process_time()
  while time.perf_counter() - began < seconds:
    count += len(sample()['indices'])
  rate = count / (time.process_time() - cpu)
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
  return rate, faults / count


def one_run(run_dir, batch_size, seconds):
  """(open s, transitions per CPU-s, anonymous bytes held, digest)."""
  from fixed_replay import batches

  anonymous = _status('RssAnon')
  began = time.perf_counter()
  buffer = batches.open_buffer(
    run_dir, {'batch_size': batch_size, 'sampling_threads': 0, 'seed': 0}
  )
  opened = time.perf_counter() - began
  rate = _rate(
    lambda: batches.named(buffer, buffer.sample_transition_batch()), seconds
  )
  held = _status('RssAnon') - anonymous
  return opened, rate, held, buffer.num_valid_transitions


def whole_mixture(root, batch_size, seconds, check_dir):
  """Like one_run, for the mixture; and its elements checked."""
  from fixed_replay import batches
  from fixed_replay import mixture

  anonymous = _status('RssAnon')
  began = time.perf_counter()
  sampler = mixture.ReplayMixture(root, batch_size=batch_size, seed=0)
  opened = time.perf_counter() - began
  rate = _rate(sampler.sample, seconds)
  held = _status('RssAnon') - anonymous
  batch = sampler.sample(CHECKED)
  games = len(set(batch['game_id'].tolist()))
  sampler.close()
  # Every run holds the same bytes: one run's buffer is the reference.
  buffer = batches.open_buffer(check_dir, {'sampling_threads': 0})
  expected = batches.named(
    buffer,
    buffer.sample_transition_batch(
      CHECKED, indices=batch['indices'], suffixes=batch['suffix']
    ),
  )
  same = all(np.array_equal(expected[k], batch[k]) for k in expected)
  return opened, rate, held, (len(sampler.runs), games, same)


def main(argv):
  del argv
  runs, num_checkpoints = _RUNS.value, _CHECKPOINTS.value
  seconds, batch_size = _SECONDS.value, _BATCH_SIZE.value
  root = build_root(_GAME.value, runs, num_checkpoints, _ORIGIN.value)
  run_dir = os.path.join(root, GAMES[0], '1')
  print(
    f'mixture_benchmark {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}'
    f', {os.cpu_count()} cores, {common.load_average()}; {runs} runs x '
    f'{num_checkpoints} checkpoints of '
    f'{_ORIGIN.value or "busy_" + _GAME.value} (hard links), '
    f'batch {batch_size}, {seconds:.0f} s of sampling each'
  )
  single = common.measure(
    _setup, one_run, (run_dir, batch_size, seconds), _identity
  )
  mixed = common.measure(
    _setup, whole_mixture, (root, batch_size, seconds, run_dir), _identity
  )
  control = _CONTROL.value and common.measure(
    _setup_one_dictionary,
    whole_mixture,
    (root, batch_size, seconds, run_dir),
    _identity,
  )
  workers = _LOADER_WORKERS.value
  loaded = workers and [
    common.measure(_setup, loader, (path, batch_size, workers, mix), _identity)
    for path, mix in ((run_dir, False), (root, True))
  ]
  print(common.load_average())
  opened, rate, held, valid = single.digest
  rows = valid * runs
  (rate, faults), (m_rate, m_faults) = rate, mixed.digest[1]
  print(
    f'one run:  open {opened:6.1f} s, {rate:9,.0f} transitions/CPU-s, '
    f'{faults:.3f} minor faults a transition, '
    f'anonymous +{common.format_bytes(held)}, peak RSS '
    f'{common.format_bytes(single.peak_rss)}; {valid:,} valid transitions'
  )
  m_opened, _, m_held, (num_runs, games, same) = mixed.digest
  print(
    f'mixture:  open {m_opened:6.1f} s, {m_rate:9,.0f} transitions/CPU-s, '
    f'{m_faults:.3f} minor faults a transition, '
    f'anonymous +{common.format_bytes(m_held)}, peak RSS '
    f'{common.format_bytes(mixed.peak_rss)}; {num_runs} runs, '
    f'{num_runs * num_checkpoints:,} checkpoints, {rows:,} valid '
    f'transitions; {games} games in a batch of {CHECKED}'
  )
  print(
    f'ratio: mixture / one run = {m_rate / rate:.2f}x transitions per '
    f'CPU-second; anonymous memory {m_held / rows:.1f} B a valid '
    f"transition; mixture elements equal the one run's at the same "
    f'(checkpoint, row): {same}'
  )
  if control:
    print(
      f'control, one dictionary for every checkpoint: '
      f'{control.digest[1][0]:,.0f} transitions/CPU-s = '
      f'{control.digest[1][0] / rate:.2f}x one run'
    )
  for name, measurement in zip(
    ('one run', 'mixture'), loaded or [], strict=False
  ):
    first, dirty = measurement.digest
    print(
      f'DataLoader, {workers} workers over the {name}: first batch in '
      f'{first:.1f} s; each worker wrote (Private_Dirty) '
      + ', '.join(common.format_bytes(d) for d in dirty)
    )


if __name__ == '__main__':
  app.run(main)
