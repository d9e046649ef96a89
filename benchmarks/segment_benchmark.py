"""Segments for sequence models against independent transitions, one store.

Decision Transformer's Atari settings (30 steps a segment, batch 128) over
every checkpoint of a compact store of busy frames: `--checkpoints` (50)
checkpoints, hard links of one converted from benchmarks/data/busy_<G>
(random play written by Dopamine's writer; see busy_store_benchmark.py for
how to generate it). Each measurement runs in a fresh process:

* segments: `SegmentSampler` time to the first batch, then steps (segments x
  30) per CPU-second of the process and its peak RSS;
* steps drawn as independent transitions (`FixedReplayBuffer`, no sampling
  thread) at batch 32 and at batch 128 x 30 = 3,840 (as many steps a batch
  as the segments'): transitions per CPU-second, measured in the same run;
  the faster of the two is the baseline of the ratio;
* Decision Transformer's own loader (atari/create_dataset.py), its method
  replayed on the same checkpoint: Dopamine's OutOfGraphReplayBuffer `load`
  (batch_rl's buffer wraps it; batch_rl itself does not import on today's
  Dopamine), then one `sample_transition_batch(indices=[i])` per row, each
  stacked state kept in a Python list. Measured: the load, the seconds and
  resident bytes a row; projected to its published 500k steps of 1M-row
  checkpoints (every row is read before its first batch).

Usage:
  python benchmarks/segment_benchmark.py [--busy_game=MsPacman] [--seconds=10]
    [--store_dir=benchmarks/data/compact_1000000x50]
"""

import os
import sys
import time

from absl import app
from absl import flags
import busy_store_benchmark
import common

_GAME = flags.DEFINE_string('busy_game', 'MsPacman', 'busy_<game> data.')
# --checkpoints (50) is busy_store_benchmark's flag.
_CHECKPOINTS = busy_store_benchmark._CHECKPOINTS  # noqa: SLF001
_SECONDS = flags.DEFINE_float('seconds', 10.0, 'Sampling time per method.')
_STORE_DIR = flags.DEFINE_string(
  'store_dir',
  None,
  "Measure over this store instead (e.g. compact_store_benchmark.py's "
  'benchmarks/data/compact_1000000x50); skips the Decision Transformer '
  'loader, which needs busy_<game>.',
)

SEGMENT_LENGTH = 30
BATCH = 128
TARGET_RATIO = 3.0
TARGET_RAM = 2 << 30


def _store(game, num_checkpoints):
  """The converted store of busy_<game>, with num_checkpoints checkpoints."""
  source = os.path.join(common.DATA_DIR, f'busy_{game}')
  store = os.path.join(common.DATA_DIR, f'segments_{game}_store')
  if not os.path.isdir(store):
    busy_store_benchmark.convert_one(source, store, 'units1')
  busy_store_benchmark._replicate(store, num_checkpoints)  # noqa: SLF001
  return store


def sample_segments(store, seconds):
  """(s to the first batch, steps per CPU-s, segments, digest)."""
  from fixed_replay import segments

  began = time.perf_counter()
  sampler = segments.SegmentSampler(
    store, segment_length=SEGMENT_LENGTH, batch_size=BATCH, seed=0
  )
  sampler.sample()
  first = time.perf_counter() - began
  suffixes = len(set(sampler.buffer.loaded_suffixes))
  count, began, cpu = 0, time.perf_counter(), time.process_time()
  while time.perf_counter() - began < seconds:
    sampler.sample()
    count += 1
  rate = count * BATCH * SEGMENT_LENGTH / (time.process_time() - cpu)
  # What grows with the rows: each row's small arrays (action, reward,
  # terminal), valid-row entry, unit offset, and return-to-go (the unit
  # CRCs stay in their file, mapped). Dictionaries and batches do not.
  source = sampler.buffer.source
  held = sum(
    stored.frames.anchors.nbytes
    + stored.num_rows
    * (stored.arrays.row_bytes(['action', 'reward', 'terminal']) + 4)
    for stored in source._stored  # noqa: SLF001
  ) + sum(
    steps.return_to_go.nbytes
    for steps in sampler._steps.values()  # noqa: SLF001
  )
  sampler.close()
  return first, rate, suffixes, held


def sample_transitions(store, seconds, batch_size):
  """(s to the first batch, transitions per CPU-s)."""
  from fixed_replay import batches

  began = time.perf_counter()
  buffer = batches.open_buffer(
    store, {'batch_size': batch_size, 'sampling_threads': 0, 'seed': 0}
  )
  buffer.sample_transition_batch()
  first = time.perf_counter() - began
  count, began, cpu = 0, time.perf_counter(), time.process_time()
  while time.perf_counter() - began < seconds:
    buffer.sample_transition_batch()
    count += 1
  rate = count * batch_size / (time.process_time() - cpu)
  buffer.close()
  return first, rate


def decision_transformers_loader(source, rows):
  """(s to load one checkpoint, s a row, resident bytes a kept state)."""
  from dopamine.replay_memory import circular_replay_buffer

  began = time.perf_counter()
  buffer = circular_replay_buffer.OutOfGraphReplayBuffer(
    observation_shape=(84, 84), stack_size=4, replay_capacity=rows, batch_size=1
  )
  buffer.load(source, '0')
  loaded = time.perf_counter() - began
  resident = common._status_bytes('VmRSS')  # noqa: SLF001
  # The rows Dopamine lets it read (stacks and next states inside).
  read = range(3, int(buffer.add_count) - 2)
  states, began = [], time.perf_counter()
  for row in read:
    state = buffer.sample_transition_batch(batch_size=1, indices=[row])[0]
    states.append(state.transpose((0, 3, 1, 2))[0])
  per_row = (time.perf_counter() - began) / len(read)
  grown = common._status_bytes('VmRSS') - resident  # noqa: SLF001
  per_state = grown / len(read)
  return loaded, per_row, per_state


def _measure(function, *args):
  """Measurement of function(*args) in a fresh process, its result kept."""
  identity = busy_store_benchmark._identity  # noqa: SLF001
  return common.measure(busy_store_benchmark._setup, function, args, identity)  # noqa: SLF001


def _rows(store):
  from fixed_replay.store import manifest as manifest_lib

  found = manifest_lib.find_stored_checkpoints(store)
  return sum(
    manifest_lib.read_manifest(directory)['num_rows']
    for directory in found.values()
  )


def main(argv):
  del argv
  sys.path.insert(0, os.path.dirname(__file__))
  store = _STORE_DIR.value or _store(_GAME.value, _CHECKPOINTS.value)
  rows = _rows(store)
  print(
    f'segment_benchmark {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}'
    f', {os.cpu_count()} cores, {common.load_average()}; {store}, '
    f'{rows:,} rows; segments of '
    f'{SEGMENT_LENGTH} steps, batch {BATCH}'
  )
  seconds = _SECONDS.value
  segments_run = _measure(sample_segments, store, seconds)
  first, rate, suffixes, held = segments_run.digest
  baselines = {
    size: _measure(sample_transitions, store, seconds, size)
    for size in (32, BATCH * SEGMENT_LENGTH)
  }
  print(common.load_average())
  print(
    f'segments:    {rate:10,.0f} steps/CPU-s, first batch {first:.1f} s, '
    f'peak RSS {common.format_bytes(segments_run.peak_rss)} (target <= '
    f'{common.format_bytes(TARGET_RAM)}; anonymous '
    f'+{common.format_bytes(segments_run.anonymous)}), checkpoints loaded '
    f'{suffixes}'
  )
  # A whole run: 50 checkpoints of 1M rows, the rest of the RSS unchanged.
  projected = segments_run.peak_rss + held / rows * (50_000_000 - rows)
  print(
    f'  grows by {held / rows:.1f} B a row: 50 checkpoints of 1M rows would '
    f'peak near {common.format_bytes(projected)}'
  )
  for size, run in baselines.items():
    transition_first, transition_rate = run.digest
    print(
      f'transitions: {transition_rate:10,.0f} transitions/CPU-s at batch '
      f'{size:,} ({rate / transition_rate:.2f}x), first batch '
      f'{transition_first:.1f} s, peak RSS {common.format_bytes(run.peak_rss)}'
    )
  best = max(run.digest[1] for run in baselines.values())
  ratio = rate / best
  print(
    f'ratio: {ratio:.2f}x the steps per CPU-second of independent '
    f'transitions at the faster batch size (target >= {TARGET_RATIO:.0f}x): '
    f'{"met" if ratio >= TARGET_RATIO else "NOT met"}'
  )
  if _STORE_DIR.value:
    return
  checkpoint_rows = rows // _CHECKPOINTS.value
  loaded, per_row, per_state = _measure(
    decision_transformers_loader,
    os.path.join(common.DATA_DIR, f'busy_{_GAME.value}'),
    checkpoint_rows,
  ).digest
  # Its published Atari runs: 500k steps read from 1M-row checkpoints.
  steps, file_rows = 500_000, 1_000_000
  print(
    f"Decision Transformer's loader, measured on one {checkpoint_rows:,}-row "
    f'checkpoint: load {loaded:.1f} s, {per_row * 1e6:.0f} us and '
    f'{per_state:,.0f} resident B a row; for its 500k steps of 1M-row '
    f'checkpoints: first batch after about '
    f'{loaded * file_rows / checkpoint_rows + per_row * steps:,.0f} s, '
    f'{common.format_bytes(per_state * steps + file_rows * 84 * 84)} '
    f"(the states, and one checkpoint's frames)"
  )


if __name__ == '__main__':
  app.run(main)
