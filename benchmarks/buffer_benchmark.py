"""FixedReplayBuffer against Dopamine's buffer and batch_rl's loading.

Five measurements on the 1M-row Breakout checkpoint of `common.py`, each
method in a fresh process:

1. Sampling throughput at batch 32 in Dopamine's layout (state (32, 84, 84,
   4)): Dopamine's `OutOfGraphReplayBuffer.sample_transition_batch` against
   ours, on the same loaded checkpoint. A digest of our batch is compared with
   Dopamine's batch at the same indices, so a wrong fast sampler cannot pass.
2. Loading a 50,000-row window through the buffer (`replay_capacity=50000`)
   against batch_rl's way (Dopamine `load` of everything, then a clip copy).
3. The stall at `reload_buffer()` with prefetching against without, on a run
   of hard links to the checkpoint (no disk used, our reads are read-only).
4. Resident memory with two 1M-row checkpoints loaded, against their arrays;
   and the refusal, before allocating, of batch_rl's default of five on a
   machine that cannot hold them.
5. The cost of the gzip CRC-32 and length check (`verify_checksums`, on by
   default) against the same loads without it, in the same run: the first
   load of a window (which then inflates the rest of the file), the whole
   file (the check comes free), and the stall at `reload_buffer()` when the
   next window loads and is checked in the background.

Usage: python benchmarks/buffer_benchmark.py [--rows=1000000] [--parts=...]
"""

import os
import time

from absl import app
from absl import flags
from absl import logging
import common
import reader_benchmark

_SAMPLE_BATCHES = flags.DEFINE_integer(
  'sample_batches', 3000, 'Minibatches timed per sampler.'
)
_PARTS = flags.DEFINE_list(
  'parts', ['1', '2', '3', '4', '5'], 'Which of the five measurements to run.'
)
_CHECK_REPEATS = flags.DEFINE_integer(
  'check_repeats', 2, 'Runs of each part 5 load (fresh process each; best).'
)
_TRAIN_SECONDS = flags.DEFINE_float(
  'train_seconds', 20.0, 'Sampling time between reloads in the stall test.'
)


def setup_dopamine():
  from dopamine.tf.replay_memory import circular_replay_buffer  # noqa: F401

  import fixed_replay  # noqa: F401


def setup_ours():
  from fixed_replay.replay import fixed_replay_buffer  # noqa: F401


def _result(value):
  """Passes a child's (small, picklable) return value back as the digest."""
  return value


def _time_sampling(sample, num_batches):
  sample()  # Warm-up (compiles our kernels once).
  began = time.perf_counter()
  for _ in range(num_batches):
    sample()
  return num_batches / (time.perf_counter() - began)


def sample_dopamine(directory, rows, num_batches, indices):
  """Dopamine's batches/s, and its batch at `indices` for the check."""
  from dopamine.tf.replay_memory import circular_replay_buffer

  buffer = circular_replay_buffer.OutOfGraphReplayBuffer(
    common.OBSERVATION_SHAPE, common.STACK_SIZE, rows, 32
  )
  buffer.load(str(directory), 0)
  rate = _time_sampling(buffer.sample_transition_batch, num_batches)
  batch = buffer.sample_transition_batch(len(indices), indices=indices)
  return rate, common.array_digest(dict(enumerate(batch)))


def sample_ours(directory, num_batches):
  """Our batches/s, the rows of a batch and its digest (suffix dropped)."""
  from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer

  buffer = FixedReplayBuffer(str(directory), 0, prefetch=False, seed=0)
  rate = _time_sampling(buffer.sample_transition_batch, num_batches)
  batch = buffer.sample_transition_batch(256)
  indices = batch[7]
  return rate, indices, common.array_digest(dict(enumerate(batch[:-1])))


def load_window_ours(directory, count, verify=True):
  from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer

  buffer = FixedReplayBuffer(
    str(directory),
    0,
    replay_capacity=count,
    prefetch=False,
    verify_checksums=verify,
  )
  return buffer.shard(0).window.store


def _link_run(directory, num_checkpoints):
  """A run of hard links to checkpoint 0 as suffixes 0..num_checkpoints-1."""
  run = common.DATA_DIR / f'{directory.name}_linked_x{num_checkpoints}'
  run.mkdir(exist_ok=True)
  for name in os.listdir(directory):
    if not name.endswith('_ckpt.0.gz'):
      continue
    for suffix in range(num_checkpoints):
      link = run / name.replace('_ckpt.0.gz', f'_ckpt.{suffix}.gz')
      if not link.exists():
        os.link(directory / name, link)
  return run


def reload_stall(run, prefetch, train_seconds, capacity=None, verify=True):
  """Seconds reload_buffer() blocks after `train_seconds` of sampling."""
  from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer

  buffer = FixedReplayBuffer(
    str(run),
    None,
    num_buffers_to_load=1,
    prefetch=prefetch,
    seed=0,
    verify_checksums=verify,
    **({} if capacity is None else {'replay_capacity': capacity}),
  )
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


def hold_checkpoints(run, num_buffers):
  """Loads num_buffers checkpoints; returns the bytes of their arrays."""
  from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer

  buffer = FixedReplayBuffer(
    str(run), None, num_buffers_to_load=num_buffers, prefetch=False
  )
  return sum(buffer.shard(s).window.nbytes for s in buffer.loaded_suffixes)


def try_five(run):
  """batch_rl's default of five 1M checkpoints: the refusal's message."""
  from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer

  try:
    FixedReplayBuffer(str(run), None, num_buffers_to_load=5)
  except MemoryError as error:
    return str(error)
  return 'loaded (no refusal)'


def _sampling(directory, rows):
  common.wait_for_memory(8 * common.GIB)
  ours = common.measure(
    setup_ours, sample_ours, (directory, _SAMPLE_BATCHES.value), _result
  )
  ours_rate, indices, ours_digest = ours.digest
  common.wait_for_memory(8 * common.GIB)
  theirs = common.measure(
    setup_dopamine,
    sample_dopamine,
    (directory, rows, _SAMPLE_BATCHES.value, indices),
    _result,
  )
  dopamine_rate, dopamine_digest = theirs.digest
  common.assert_same_digest(dopamine_digest, ours_digest, 'ours vs Dopamine')
  return dopamine_rate, ours_rate


def _loading(directory, rows, count):
  common.wait_for_memory(16 * common.GIB)
  base = common.measure(
    reader_benchmark.setup_baseline,
    reader_benchmark.read_baseline,
    (directory, 0, count, rows),
    common.array_digest,
  )
  results = {}
  for verify in (True, False):
    results[verify] = common.measure(
      setup_ours,
      load_window_ours,
      (directory, count, verify),
      common.array_digest,
    )
    common.assert_same_digest(
      base.digest, results[verify].digest, 'window: ours vs batch_rl'
    )
  return base, results[True], results[False]


def _report_sampling(directory, rows):
  dopamine_rate, ours_rate = _sampling(directory, rows)
  ratio = ours_rate / dopamine_rate
  print('\n1. Sampling, batch 32, state (32, 84, 84, 4), one process each')
  print(f'   Dopamine sample_transition_batch: {dopamine_rate:9.0f} batches/s')
  print(f'   FixedReplayBuffer:                {ours_rate:9.0f} batches/s')
  print(f"   ratio {ratio:.1f}x; batches equal Dopamine's at the same rows")


def _report_loading(directory, rows):
  count = min(50_000, rows)
  base, checked, unchecked = _loading(directory, rows, count)
  print(f'\n2. Loading rows [0, {count:,}) through the buffer')
  for name, m in (
    ("batch_rl's way", base),
    ('FixedReplayBuffer, checked (default)', checked),
    ('FixedReplayBuffer, verify_checksums=False', unchecked),
  ):
    print(
      f'   {name:<42} {m.wall_s:7.2f} s, peak +'
      f'{common.format_bytes(m.peak_increase)} over imports'
    )
  for name, m in (('checked', checked), ('unchecked', unchecked)):
    print(
      f'   {name}: {base.wall_s / m.wall_s:.0f}x faster, '
      f'{base.peak_increase / m.peak_increase:.0f}x less peak memory'
    )
  print('   what the check adds: part 5')


def _report_stall(directory, rows):
  run = _link_run(directory, 4)
  common.wait_for_memory(16 * common.GIB)
  with_prefetch = common.measure(
    setup_ours, reload_stall, (run, True, _TRAIN_SECONDS.value), _result
  ).digest
  without = common.measure(
    setup_ours, reload_stall, (run, False, _TRAIN_SECONDS.value), _result
  ).digest
  print(
    f'\n3. reload_buffer() stall, one {rows:,}-row checkpoint per set, '
    f'after {_TRAIN_SECONDS.value:.0f} s of sampling'
  )
  print(f'   without prefetch {without:6.2f} s (the load itself)')
  print(f'   with prefetch    {with_prefetch:6.2f} s')


def _report_memory(directory, rows):
  run = _link_run(directory, 4)
  common.wait_for_memory(16 * common.GIB)
  held = common.measure(setup_ours, hold_checkpoints, (run, 2), _result)
  arrays = held.digest
  ratio = held.peak_increase / arrays
  print(f'\n4. Two {rows:,}-row checkpoints loaded')
  print(
    f'   arrays {common.format_bytes(arrays)}, peak RSS increase '
    f'{common.format_bytes(held.peak_increase)}: {ratio:.3f}x the arrays'
  )
  run5 = _link_run(directory, 5)
  refused = common.measure(setup_ours, try_five, (run5,), _result)
  print(
    f'   five checkpoints (batch_rl default): "{refused.digest}" '
    f'(peak RSS increase {common.format_bytes(refused.peak_increase)})'
  )


def _check_cost(directory, rows, count):
  """(checked, unchecked): best Measurements of loading rows [0, count)."""
  results = {True: [], False: []}
  for _ in range(_CHECK_REPEATS.value):  # Alternated, so load changes hit both.
    for verify in (True, False):
      common.wait_for_memory(2 * count * 84 * 84 + common.GIB)
      results[verify].append(
        common.measure(
          setup_ours,
          load_window_ours,
          (directory, count, verify),
          common.array_digest,
        )
      )
  results = {v: min(m, key=lambda x: x.wall_s) for v, m in results.items()}
  common.assert_same_digest(
    results[True].digest, results[False].digest, 'checked vs unchecked'
  )
  return results[True], results[False]


def _report_check_cost(directory, rows):
  window = min(50_000, rows)
  print(
    '\n5. Cost of the gzip CRC-32 and length check (verify_checksums), '
    f'fresh process each, best of {_CHECK_REPEATS.value}, same run'
  )
  print(
    f'   {"load":<38} {"checked s":>9} {"unchecked s":>11} {"added s":>8} '
    f'{"ratio":>6}  peak RSS increase checked / unchecked'
  )
  for label, count in (
    (f'first load, rows [0, {window:,})', window),
    (f'first load, whole file ({rows:,} rows)', rows),
  ):
    checked, unchecked = _check_cost(directory, rows, count)
    print(
      f'   {label:<38} {checked.wall_s:9.2f} {unchecked.wall_s:11.2f} '
      f'{checked.wall_s - unchecked.wall_s:8.2f} '
      f'{checked.wall_s / unchecked.wall_s:5.1f}x  '
      f'{common.format_bytes(checked.peak_increase)} / '
      f'{common.format_bytes(unchecked.peak_increase)}'
    )
  run = _link_run(directory, 4)
  stalls = {}
  for verify in (True, False):
    common.wait_for_memory(16 * common.GIB)
    stalls[verify] = common.measure(
      setup_ours,
      reload_stall,
      (run, True, _TRAIN_SECONDS.value, window, verify),
      _result,
    ).digest
  label = f'reload_buffer() stall, {window:,}-row windows'
  print(
    f'   {label:<38} '
    f'{stalls[True]:9.2f} {stalls[False]:11.2f} '
    f'{stalls[True] - stalls[False]:8.2f}         (after '
    f'{_TRAIN_SECONDS.value:.0f} s of sampling; checked in the background)'
  )


_PARTS_BY_NAME = {
  '1': ('sampling throughput', _report_sampling),
  '2': ('loading a window', _report_loading),
  '3': ('reload stall', _report_stall),
  '4': ('resident memory', _report_memory),
  '5': ('cost of the CRC check', _report_check_cost),
}


def main(argv):
  del argv
  directory = common.build_checkpoint(common.ROWS.value, common.SEED.value)
  rows = common.ROWS.value
  print(f'\nFixedReplayBuffer benchmark on {directory} ({rows:,} rows)')
  print(f'{common.load_average()} at start ({os.cpu_count()} CPUs)')
  for part in _PARTS.value:
    name, report = _PARTS_BY_NAME[part]
    logging.info('%s/%d %s', part, len(_PARTS_BY_NAME), name)
    report(directory, rows)
  print(f'\n{common.load_average()} at end')


if __name__ == '__main__':
  app.run(main)
