"""Do the loaders keep a training step fed, and what do segments cost?

All on one store of busy frames (random play of `--busy_game`, MsPacman, by
common.py at `--rows`, converted once; or any converted `--store`): static
frames such as Breakout's flatter every decoder. Each loader runs in a
fresh process: its first batch, `--warmup_s` untimed (workers starting,
checkpoints loading), then `--seconds` timed. The parts (`--parts`):

* fed: what a GPU user asks, is the training step ever kept waiting? Each
  batch goes into a stand-in step, `--gil_ms` of Python holding the GIL (as
  kernel launches do), then a GIL-free wait to the step's end (as waiting
  on the device does), at each `--steps` pair (batch:ms). Loaders:
  `DataLoader(ReplayDataset, batch_size=None, num_workers=N)`, N = 0, 1, 2,
  and `jax_batches.ReplayBatches` (CPU device here). "fed" is the loop's
  rate over the step alone's, in the same run (1.00: it never waited);
  "loader CPU" is the training process's CPU a batch beyond the step's
  (with workers, only the hand-off), the workers' own beside it.
* alone: where the time goes without a step: the same loaders and TorchRL's
  `FixedReplayDataset`, transitions a second and CPU (workers included)
  per 1,000, as ratios against the DataLoader with no workers.
* segments: sequence models draw segments (Decision Transformer's Atari
  settings: 30 steps, batch 128) over `--checkpoints` hard links of the
  store's first checkpoint. `SegmentSampler` steps per CPU-second against
  the same steps as independent transitions (FixedReplayBuffer, no
  sampling thread) at batch 32 and at 3,840 (as many steps a batch): the
  faster is the baseline. Peak RSS and anonymous memory of each. With the
  data built here, Decision Transformer's own loading is replayed on the
  Dopamine checkpoint (Dopamine's buffer `load`, then one
  `sample_transition_batch(indices=[i])` a row, every state kept), and
  projected to its published 500k steps from 1M-row checkpoints.

Usage:
  python benchmarks/loader_benchmark.py --rows=50000
  python benchmarks/loader_benchmark.py --store=STORE --parts=fed,alone
    [--steps=32:1,256:4] [--batch_sizes=32,128] [--checkpoints=50]
"""

import itertools
import os
import time

from absl import app
from absl import flags
from absl import logging
import common
import psutil

_PARTS = flags.DEFINE_list(
  'parts', ['fed', 'alone', 'segments'], 'Parts to run: fed, alone, segments.'
)
_STORE = flags.DEFINE_string(
  'store', None, 'A converted store to use instead of building busy frames.'
)
_BUSY_GAME = flags.DEFINE_string('busy_game', 'MsPacman', 'Game played.')
_SECONDS = flags.DEFINE_float('seconds', 4.0, 'Timed seconds a loader.')
_WARMUP_S = flags.DEFINE_float('warmup_s', 4.0, 'Untimed seconds first.')
_GIL_MS = flags.DEFINE_float(
  'gil_ms', 0.4, "The stand-in step's Python work holding the GIL, ms."
)
_STEPS = flags.DEFINE_list(
  'steps', ['32:1', '256:4'], 'batch:step ms pairs of the fed part.'
)
_BATCH_SIZES = flags.DEFINE_list(
  'batch_sizes', ['32', '128'], 'Batch sizes of the alone part.'
)
_CHECKPOINTS = flags.DEFINE_integer(
  'checkpoints', 50, 'Checkpoints of the segments part (hard links).'
)

SEGMENT_LENGTH, SEGMENT_BATCH = 30, 128
LOADERS = (('torch w0', 'torch', 0), ('torch w1', 'torch', 1))
LOADERS += (('torch w2', 'torch', 2), ('jax', 'jax', 0))


def _setup():
  import fixed_replay  # noqa: F401


def _identity(result):
  return result


def _workers_cpu():
  """CPU seconds of this process's live children so far."""
  times = [c.cpu_times() for c in psutil.Process().children(recursive=True)]
  return sum(t.user + t.system for t in times)


def stand_in_step(gil_s, step_s):
  """A GPU training step's shape: Python holding the GIL, then a wait that
  releases it (as a device synchronisation does) until `step_s` is up."""
  began = time.perf_counter()
  while time.perf_counter() - began < gil_s:
    pass
  time.sleep(max(0.0, step_s - (time.perf_counter() - began)))


def _open(kind, store, batch_size, workers):
  """(batches, transitions a batch, close) of one loader over `store`."""
  from fixed_replay import batches

  if kind == 'step':  # No data: the step alone.
    return itertools.repeat(None), batch_size, lambda: None
  if kind == 'jax':
    import jax

    from fixed_replay.jax_batches import ReplayBatches

    replay = ReplayBatches(store, batch_size=batch_size, seed=0)
    return map(jax.block_until_ready, replay), batch_size, replay.close
  if kind == 'torchrl':
    from fixed_replay.torchrl import FixedReplayDataset

    dataset = FixedReplayDataset(store, batch_size=batch_size, seed=0)
    return iter(dataset), batch_size, dataset.close
  if kind == 'segments':
    from fixed_replay.segments import SegmentSampler

    sampler = SegmentSampler(
      store, segment_length=SEGMENT_LENGTH, batch_size=batch_size, seed=0
    )
    size = batch_size * SEGMENT_LENGTH
    return batches.repeated(sampler.sample), size, sampler.close
  if kind == 'transitions':
    buffer = batches.open_buffer(
      store, {'batch_size': batch_size, 'sampling_threads': 0, 'seed': 0}
    )
    sample = buffer.sample_transition_batch
    return batches.repeated(sample), batch_size, buffer.close
  from torch.utils.data import DataLoader

  from fixed_replay.torch import ReplayDataset

  dataset = ReplayDataset(store, batch_size=batch_size, seed=0)
  # This process is spawned, so its workers would be too; a user's script
  # on Linux forks them (Python < 3.14).
  context = 'fork' if workers else None
  loader = DataLoader(
    dataset, None, num_workers=workers, multiprocessing_context=context
  )
  return iter(loader), batch_size, dataset.close


def run(kind, store, batch_size, workers, step_s, timing):
  """One loader in this process: its first batch, `warmup_s` untimed, then
  `seconds` timed, each batch followed by a stand-in step of `step_s`
  (None: no step). Returns the counts as a dict."""
  warmup_s, seconds, gil_s = timing
  began = time.perf_counter()
  iterator, size, close = _open(kind, store, batch_size, workers)
  next(iterator)
  first = time.perf_counter() - began
  for phase_s in (warmup_s, seconds):  # Untimed, then timed.
    began, cpu, count = time.perf_counter(), time.process_time(), 0
    workers_cpu = _workers_cpu()
    while time.perf_counter() - began < phase_s:
      next(iterator)
      if step_s:
        stand_in_step(gil_s, step_s)
      count += 1
  outcome = dict(
    batches=count,
    transitions=count * size,
    wall=time.perf_counter() - began,
    cpu=time.process_time() - cpu,
    workers_cpu=_workers_cpu() - workers_cpu,
    first=first,
  )
  close()
  return outcome


def _measure(kind, store, batch_size, workers=0, step_s=None):
  """common.Measurement of `run` in a fresh process, its counts as digest."""
  timing = (_WARMUP_S.value, _SECONDS.value, _GIL_MS.value / 1000)
  args = (kind, store, batch_size, workers, step_s, timing)
  return common.measure(_setup, run, args, _identity)


def fed_part(store):
  """Prints the fed table: every loader in the loop, at each step."""
  print(
    f'\nFed: stand-in steps ({_GIL_MS.value:g} ms holding the GIL, then a '
    f'GIL-free wait); {common.load_average()}'
  )
  print(
    f'{"batch":>5} {"step":>5} {"loader":<10} {"steps/s":>8} {"fed":>5} '
    f'{"loader CPU ms/batch":>20} {"workers CPU ms/batch":>21}'
  )
  for pair in _STEPS.value:
    batch_size, step_ms = int(pair.split(':')[0]), float(pair.split(':')[1])
    alone = _measure('step', store, batch_size, step_s=step_ms / 1000).digest
    alone_rate = alone['batches'] / alone['wall']
    alone_cpu = alone['cpu'] / alone['batches']
    for name, kind, workers in LOADERS:
      fed = _measure(kind, store, batch_size, workers, step_ms / 1000).digest
      rate = fed['batches'] / fed['wall']
      print(
        f'{batch_size:>5} {step_ms:>3g}ms {name:<10} {rate:>8,.0f} '
        f'{rate / alone_rate:>5.2f} '
        f'{(fed["cpu"] / fed["batches"] - alone_cpu) * 1e3:>20.3f} '
        f'{fed["workers_cpu"] / fed["batches"] * 1e3:>21.3f}',
        flush=True,
      )
    print(
      f'{batch_size:>5} {step_ms:>3g}ms {"step alone":<10} '
      f'{alone_rate:>8,.0f} {1:>5.2f} {alone_cpu * 1e3:>20.3f} (the step)'
    )


def alone_part(store):
  """Prints the loaders alone, no step, against the DataLoader's w0."""
  print(f'\nAlone: no step; {common.load_average()}')
  print(
    f'{"batch":>5} {"loader":<10} {"transitions/s":>14} {"ratio":>6} '
    f'{"CPU ms/1k":>10} {"peak RSS":>9}'
  )
  for batch_size in map(int, _BATCH_SIZES.value):
    baseline = None
    for name, kind, workers in LOADERS + (('torchrl', 'torchrl', 0),):
      measurement = _measure(kind, store, batch_size, workers)
      outcome = measurement.digest
      rate = outcome['transitions'] / outcome['wall']
      baseline = baseline or rate
      cpu = outcome['cpu'] + outcome['workers_cpu']
      print(
        f'{batch_size:>5} {name:<10} {rate:>14,.0f} {rate / baseline:>6.2f} '
        f'{cpu / outcome["transitions"] * 1e6:>10.2f} '
        f'{measurement.peak_rss / 2**20:>7.0f}Mi',
        flush=True,
      )


def _replicated(store, num_checkpoints):
  """A store of `num_checkpoints` hard links of `store`'s checkpoint 0, each
  with its own manifest, and of its dictionary (built once, in data/)."""
  from fixed_replay.store import manifest as manifest_lib

  name = os.path.basename(os.path.normpath(store))
  target = common.DATA_DIR / f'segments_{name}_{num_checkpoints}'
  dictionary = os.path.join(store, manifest_lib.RUN_DICTIONARY_FILE)
  linked = target / manifest_lib.RUN_DICTIONARY_FILE
  os.makedirs(target, exist_ok=True)
  if os.path.exists(dictionary) and not linked.exists():
    os.link(dictionary, linked)
  origin = os.path.join(store, manifest_lib.checkpoint_dirname(0))
  common.link_checkpoints(origin, target, range(num_checkpoints))
  return str(target)


def decision_transformers_loader(checkpoint, rows):
  """(s to load one checkpoint, s a row, resident bytes a kept state) of
  Decision Transformer's way: Dopamine's buffer, one row a call."""
  from dopamine.tf.replay_memory import circular_replay_buffer

  began = time.perf_counter()
  buffer = circular_replay_buffer.OutOfGraphReplayBuffer(
    observation_shape=(84, 84), stack_size=4, replay_capacity=rows, batch_size=1
  )
  buffer.load(checkpoint, '0')
  loaded = time.perf_counter() - began
  resident = psutil.Process().memory_info().rss
  read = range(3, int(buffer.add_count) - 2)  # The rows Dopamine allows.
  states, began = [], time.perf_counter()
  for row in read:
    state = buffer.sample_transition_batch(batch_size=1, indices=[row])[0]
    states.append(state.transpose((0, 3, 1, 2))[0])
  per_row = (time.perf_counter() - began) / len(read)
  grown = psutil.Process().memory_info().rss - resident
  return loaded, per_row, grown / len(read)


def segments_part(store, checkpoint, rows):
  """Prints segments against independent transitions (and DT's loader)."""
  data = _replicated(store, _CHECKPOINTS.value)
  print(
    f'\nSegments of {SEGMENT_LENGTH} steps, batch {SEGMENT_BATCH}, over '
    f'{_CHECKPOINTS.value} checkpoints ({data}); {common.load_average()}'
  )
  runs = {'segments': _measure('segments', data, SEGMENT_BATCH)}
  for size in (32, SEGMENT_BATCH * SEGMENT_LENGTH):
    runs[f'transitions, batch {size:,}'] = _measure('transitions', data, size)
  rates = {
    n: m.digest['transitions'] / m.digest['cpu'] for n, m in runs.items()
  }
  baseline = max(rate for name, rate in rates.items() if name != 'segments')
  for name, measurement in runs.items():
    print(
      f'{name:<25} {rates[name]:>10,.0f} steps/CPU-s '
      f'({rates[name] / baseline:.2f}x the faster transitions), first batch '
      f'{measurement.digest["first"]:.1f} s, peak RSS '
      f'{common.format_bytes(measurement.peak_rss)}, anonymous '
      f'+{common.format_bytes(measurement.anonymous)}'
    )
  if checkpoint is None:
    return
  args = (checkpoint, rows)
  loaded, per_row, per_state = common.measure(
    _setup, decision_transformers_loader, args, _identity
  ).digest
  steps, file_rows = 500_000, 1_000_000  # Its published Atari runs.
  print(
    f"Decision Transformer's loader on one {rows:,}-row checkpoint: load "
    f'{loaded:.1f} s, {per_row * 1e6:.0f} us and {per_state:,.0f} resident '
    f'B a row; for its 500k steps from 1M-row checkpoints, first batch after '
    f'about {loaded * file_rows / rows + per_row * steps:,.0f} s, holding '
    f'{common.format_bytes(per_state * steps + file_rows * 84 * 84)}'
  )


def _data():
  """(store, its Dopamine checkpoint or None, rows of a checkpoint)."""
  from fixed_replay.store import manifest as manifest_lib

  checkpoint = None
  store = _STORE.value
  if store is None:
    rows, game = common.ROWS.value, _BUSY_GAME.value
    checkpoint = str(common.build_checkpoint(rows, game=game))
    store = checkpoint + '_store'
    if not os.path.isdir(store):
      from fixed_replay.convert import convert

      convert.convert(checkpoint, store, workers=0)
  first = os.path.join(store, manifest_lib.checkpoint_dirname(0))
  return store, checkpoint, manifest_lib.read_manifest(first)['num_rows']


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  store, checkpoint, rows = _data()
  print(
    f'{store}: {rows:,}-row checkpoints; {os.cpu_count()} CPUs; '
    f'{_WARMUP_S.value:g} s warm-up, {_SECONDS.value:g} s timed a loader'
  )
  if 'fed' in _PARTS.value:
    fed_part(store)
  if 'alone' in _PARTS.value:
    alone_part(store)
  if 'segments' in _PARTS.value:
    segments_part(store, checkpoint, rows)
  print(common.load_average())


if __name__ == '__main__':
  app.run(main)
