"""FixedReplayBuffer over Dopamine's gzip checkpoints, against Dopamine's.

Measures our buffer over the benchmark checkpoint of `common.py` (one full
Dopamine replay checkpoint, as the DQN Replay Dataset ships them) against a
baseline of the same run, each method in a fresh process so that its time
and peak memory are its own. WHY: these are the costs someone moving from
Dopamine's or batch_rl's buffer meets first, each with a check that makes a
fast but wrong method fail.

* sampling: minibatches/s at batch 32 (state (32, 84, 84, 4)) against
  Dopamine's `OutOfGraphReplayBuffer.sample_transition_batch` on the same
  checkpoint; Dopamine's batch at our batch's indices must equal ours.
* first_batch: the wait for the first minibatch from a `--window_rows`
  window of the full checkpoint (`replay_capacity`), verified (the default:
  the rest of each file is inflated to reach its gzip trailer) and with
  `verify_checksums=False`, against batch_rl's way: Dopamine's `load` of the
  whole checkpoint, then the window copied out (~7 GB at 1M rows;
  `--nobatch_rl` skips it, the ratios are then against the unverified
  load); with the peak RSS increase over imports. Windows must be equal.
* stall: how long `reload_buffer()` blocks after `--train_seconds` of
  sampling, with prefetching against without (the load itself), over a run
  of hard links to the checkpoint (no disk used; our reads are read-only).
* memory: the peak RSS increase with two checkpoints loaded against their
  arrays' bytes; and batch_rl's default of five under a `memory_budget` for
  four, refused before allocating (against one checkpoint's arrays).

Usage:
  python benchmarks/dopamine_files_benchmark.py [--rows=1000000]
    [--parts=sampling,first_batch,stall,memory] [--window_rows=50000]
    [--repeats=2] [--sample_batches=3000] [--train_seconds=20] [--nobatch_rl]
"""

import os
import time

from absl import app
from absl import flags
from absl import logging
import common

_PARTS = flags.DEFINE_list(
  'parts',
  ['sampling', 'first_batch', 'stall', 'memory'],
  'Which measurements to run, of sampling, first_batch, stall, memory.',
)
_WINDOW_ROWS = flags.DEFINE_integer(
  'window_rows', 50_000, 'Rows of the first_batch window, from row 0.'
)
_BATCH_RL = flags.DEFINE_bool(
  'batch_rl', True, "Also time batch_rl's load-then-clip (~7 GB at 1M rows)."
)
_REPEATS = flags.DEFINE_integer(
  'repeats', 2, 'Fresh-process runs per first_batch method, alternated.'
)
_SAMPLE_BATCHES = flags.DEFINE_integer(
  'sample_batches', 3000, 'Minibatches timed per sampler.'
)
_TRAIN_SECONDS = flags.DEFINE_float(
  'train_seconds', 20.0, 'Sampling time before each reload in the stall.'
)
_LINKED_CHECKPOINTS = 5  # batch_rl's default num_buffers_to_load.


def setup_dopamine():
  from dopamine.tf.replay_memory import circular_replay_buffer  # noqa: F401


def setup_ours():
  from fixed_replay.replay import fixed_replay_buffer  # noqa: F401


def _result(value):
  """Passes a child's small, picklable return value back as its digest."""
  return value


def _ours(directory, suffix, prefetch=False, **kwargs):
  from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer

  return FixedReplayBuffer(str(directory), suffix, prefetch=prefetch, **kwargs)


def _dopamine(directory, rows):
  """Dopamine's buffer with checkpoint 0 loaded, as batch_rl builds it."""
  from dopamine.tf.replay_memory import circular_replay_buffer

  buffer = circular_replay_buffer.OutOfGraphReplayBuffer(
    common.OBSERVATION_SHAPE, common.STACK_SIZE, rows, 32
  )
  buffer.load(str(directory), 0)
  return buffer


def _batches_per_s(sample, num_batches):
  sample()  # Warm-up (compiles our kernels once).
  began = time.perf_counter()
  for _ in range(num_batches):
    sample()
  return num_batches / (time.perf_counter() - began)


def sample_dopamine(directory, rows, num_batches, indices):
  """Dopamine's batches/s, and the digest of its batch at `indices`."""
  buffer = _dopamine(directory, rows)
  rate = _batches_per_s(buffer.sample_transition_batch, num_batches)
  batch = buffer.sample_transition_batch(len(indices), indices=indices)
  return rate, common.array_digest(dict(enumerate(batch)))


def sample_ours(directory, num_batches):
  """Our batches/s, a batch's indices and its digest (suffix dropped)."""
  buffer = _ours(directory, 0, seed=0)
  rate = _batches_per_s(buffer.sample_transition_batch, num_batches)
  batch = buffer.sample_transition_batch(256)
  return rate, batch[7], common.array_digest(dict(enumerate(batch[:-1])))


def first_batch_ours(directory, count, verify):
  """Builds the buffer over rows [0, count), samples one batch: its arrays."""
  buffer = _ours(directory, 0, replay_capacity=count, verify_checksums=verify)
  buffer.sample_transition_batch(32)
  return buffer.shard(0).window.store


def window_batch_rl(directory, rows, count):
  """batch_rl's way: Dopamine loads every array whole, the window is copied."""
  store = _dopamine(directory, rows)._store  # pylint: disable=protected-access
  return {name: array[:count].copy() for name, array in store.items()}


def reload_stall(run, prefetch, train_seconds):
  """The longest of two reload_buffer() blocks after sampling for a while."""
  buffer = _ours(run, None, num_buffers_to_load=1, prefetch=prefetch, seed=0)
  stalls = []
  for _ in range(2):
    deadline = time.perf_counter() + train_seconds
    while time.perf_counter() < deadline:
      buffer.sample_transition_batch()
    began = time.perf_counter()
    buffer.reload_buffer()
    stalls.append(time.perf_counter() - began)
  buffer.close()
  return max(stalls)


def hold_checkpoints(run, count, budget=None):
  """Loads `count` checkpoints: their arrays' bytes, or the refusal."""
  try:
    buffer = _ours(run, None, num_buffers_to_load=count, memory_budget=budget)
  except MemoryError as error:
    return str(error)
  return sum(buffer.shard(s).window.nbytes for s in buffer.loaded_suffixes)


def _wait(rows, checkpoints):
  """Waits for room for `checkpoints` checkpoints' frames and 1 GiB."""
  frame = common.OBSERVATION_SHAPE[0] * common.OBSERVATION_SHAPE[1]
  common.require_memory(int(checkpoints * rows * frame * 1.05) + common.GIB)


def _link_run(directory):
  """A run of hard links to checkpoint 0, as suffixes 0 to 4."""
  run = common.DATA_DIR / f'{directory.name}_linked_x{_LINKED_CHECKPOINTS}'
  run.mkdir(exist_ok=True)
  for name in os.listdir(directory):
    if name.endswith('_ckpt.0.gz'):
      for suffix in range(_LINKED_CHECKPOINTS):
        link = run / name.replace('_ckpt.0.gz', f'_ckpt.{suffix}.gz')
        if not link.exists():
          os.link(directory / name, link)
  return run


def _row(label, figure, ratio=''):
  print(f'  {label:<44} {figure:>24}  {ratio}')


def _sampling(directory, rows):
  _wait(rows, 1)
  ours_rate, indices, ours_digest = common.measure(
    setup_ours, sample_ours, (directory, _SAMPLE_BATCHES.value), _result
  ).digest
  _wait(rows, 1)
  dopamine_rate, dopamine_digest = common.measure(
    setup_dopamine,
    sample_dopamine,
    (directory, rows, _SAMPLE_BATCHES.value, indices),
    _result,
  ).digest
  common.assert_same_digest(dopamine_digest, ours_digest, 'ours vs Dopamine')
  print('\nsampling: batch 32, state (32, 84, 84, 4), one process each')
  _row('Dopamine sample_transition_batch', f'{dopamine_rate:.0f} batches/s')
  _row(
    'FixedReplayBuffer',
    f'{ours_rate:.0f} batches/s',
    f'{ours_rate / dopamine_rate:.1f}x Dopamine',
  )
  print("  batches equal Dopamine's at the same indices")


def _first_batch(directory, rows):
  count = min(_WINDOW_ROWS.value, rows)
  ours = (setup_ours, first_batch_ours)
  methods = {
    'FixedReplayBuffer, verified (default)': ours + ((directory, count, True),),
    'FixedReplayBuffer, unverified': ours + ((directory, count, False),),
  }
  if _BATCH_RL.value:
    batch_rl = (setup_dopamine, window_batch_rl, (directory, rows, count))
    methods["batch_rl's way (load, clip)"] = batch_rl
  runs = {name: [] for name in methods}
  for _ in range(_REPEATS.value):  # Alternated: load changes hit all.
    for name, (setup, function, args) in methods.items():
      _wait(rows, 1.1)
      runs[name].append(
        common.measure(setup, function, args, common.array_digest)
      )
  base_name = list(runs)[-1]
  expected = runs[base_name][0].digest
  for name, measurements in runs.items():
    for measurement in measurements:
      common.assert_same_digest(expected, measurement.digest, name)
  print(
    f'\nfirst_batch: rows [0, {count:,}) of {rows:,}; best time, highest '
    f'peak RSS increase of {_REPEATS.value} fresh processes; windows equal;\n'
    f'  ratios against {base_name}'
    + (' (it samples no batch)' if _BATCH_RL.value else '')
  )
  base_s = min(m.wall_s for m in runs[base_name])
  base_peak = max(m.peak_increase for m in runs[base_name])
  for name, measurements in runs.items():
    wall_s = min(m.wall_s for m in measurements)
    peak = max(m.peak_increase for m in measurements)
    _row(
      name,
      f'{wall_s:6.2f} s, +{common.format_bytes(peak)}',
      f'speed-up {base_s / wall_s:4.1f}x, memory {base_peak / peak:4.1f}x less',
    )


def _stall(directory, rows):
  run = _link_run(directory)
  stalls = {}
  for prefetch in (False, True):
    _wait(rows, 2)
    stalls[prefetch] = common.measure(
      setup_ours, reload_stall, (run, prefetch, _TRAIN_SECONDS.value), _result
    ).digest
  print(
    f'\nstall: reload_buffer(), one {rows:,}-row checkpoint per set, after '
    f'{_TRAIN_SECONDS.value:g} s of sampling'
  )
  _row('without prefetch (the load itself)', f'{stalls[False]:.3f} s')
  _row(
    'with prefetch',
    f'{stalls[True]:.3f} s',
    f'{stalls[True] / stalls[False]:.3f}x the load',
  )


def _memory(directory, rows):
  run = _link_run(directory)
  _wait(rows, 2)
  held = common.measure(setup_ours, hold_checkpoints, (run, 2), _result)
  arrays = held.digest
  print(f'\nmemory: {rows:,}-row checkpoints, peak RSS increase over imports')
  _row(
    'two checkpoints loaded',
    f'+{common.format_bytes(held.peak_increase)}',
    f'{held.peak_increase / arrays:.3f}x their arrays '
    f'({common.format_bytes(arrays)})',
  )
  budget = int(arrays / 2 * 4.5)  # Holds four checkpoints, not five.
  refused = common.measure(
    setup_ours, hold_checkpoints, (run, 5, budget), _result
  )
  if not isinstance(refused.digest, str):
    raise AssertionError(f'five checkpoints loaded under budget {budget}')
  _row(
    'five under a budget for four: refused',
    f'+{common.format_bytes(refused.peak_increase)}',
    f'{refused.peak_increase / (arrays / 2):.3f}x one checkpoint',
  )
  print(f'  "{refused.digest.splitlines()[0]}"')


_PARTS_BY_NAME = {
  'sampling': _sampling,
  'first_batch': _first_batch,
  'stall': _stall,
  'memory': _memory,
}


def main(argv):
  del argv
  parts = [_PARTS_BY_NAME[part] for part in _PARTS.value]  # Fails early.
  rows = common.ROWS.value
  directory = common.build_checkpoint(
    rows, common.SEED.value, game=common.GAME.value
  )
  print(f'\nDopamine checkpoint files: {directory} ({rows:,} rows)')
  print(f'{common.load_average()} at start ({os.cpu_count()} CPUs)')
  for name, part in zip(_PARTS.value, parts, strict=True):
    logging.info('Measuring %s', name)
    part(directory, rows)
  print(f'\n{common.load_average()} at end')


if __name__ == '__main__':
  app.run(main)
