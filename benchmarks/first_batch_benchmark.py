"""Time to first batch: a 50,000-row window of a 1M-row Dopamine checkpoint.

What a researcher waits for when an experiment starts: a fresh process whose
imports are done builds `FixedReplayBuffer(replay_suffix=0,
replay_capacity=50_000)` over one full 1M-row checkpoint and samples one
minibatch. Measured with checksums off (`verify_checksums=False`, data
verified once) and on (the default, which inflates the rest of every file to
reach its gzip trailer), each in a fresh process, against two baselines of
the same run:

* the whole observation file inflated by the fastest inflater installed
  (isal or zlib-ng, straight `decompressobj` calls into a discarded buffer):
  what checking the file cannot go below;
* batch_rl's way: Dopamine's `load` of the whole checkpoint, then the window
  clipped out (`--nobatch_rl` skips it: it needs ~7 GB and ~20 s).

Targets (issue 16): unverified at most 0.75 s; verified within 1.25x the
whole-file inflate plus 0.5 s.

Usage: python benchmarks/first_batch_benchmark.py [--rows=1000000]
  [--count=50000] [--repeats=3]
"""

import os
import time

from absl import app
from absl import flags
from absl import logging
import common
import reader_benchmark

COUNT = flags.DEFINE_integer('count', 50_000, 'Rows of the window.')
BATCH_RL = flags.DEFINE_bool(
  'batch_rl', True, "Also time batch_rl's load-then-clip (about 7 GB)."
)


def setup_buffer():
  """Imports what a training process has imported before its buffer."""
  from fixed_replay.replay import fixed_replay_buffer  # noqa: F401


def first_batch(directory, count, verify):
  """Builds the buffer over one window and samples one minibatch."""
  from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer

  buffer = FixedReplayBuffer(
    str(directory),
    0,
    replay_capacity=count,
    prefetch=False,
    verify_checksums=verify,
  )
  batch = buffer.sample_transition_batch(32)
  return int(batch[0].sum())


def _fastest_module():
  from fixed_replay.io import gzip_stream

  return gzip_stream.BACKENDS[gzip_stream.DEFAULT_BACKEND]


def setup_inflate():
  _fastest_module()


def inflate_whole_file(path):
  """Inflates a gzip file to its end with plain decompressobj calls."""
  module = _fastest_module()
  decompressor = module.decompressobj(31)
  total = 0
  with open(path, 'rb') as raw:
    while chunk := raw.read(1 << 20):
      data = chunk
      while data:
        total += len(decompressor.decompress(data, 64 << 20))
        data = decompressor.unconsumed_tail
  if not decompressor.eof:
    raise RuntimeError(f'{path}: no gzip end of stream')
  return total


def _times(setup, function, args, repeats):
  results = [common.measure(setup, function, args) for _ in range(repeats)]
  walls = sorted(result.wall_s for result in results)
  return walls[0], walls[len(walls) // 2], results


def main(argv):
  del argv
  rows, count = common.ROWS.value, COUNT.value
  repeats = flags.FLAGS.repeats  # reader_benchmark.py defines it.
  directory = common.build_checkpoint(rows, game=common.GAME.value)
  observation = os.path.join(directory, '$store$_observation_ckpt.0.gz')
  started = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
  print(
    f'First batch, {count:,}-row window of a {rows:,}-row '
    f'{common.GAME.value} checkpoint ({os.path.getsize(observation) / 1e6:.0f}'
    f' MB of gzip frames); {started}, {os.cpu_count()} CPUs; best / median '
    f'of {repeats} fresh processes, imports done'
  )
  inflate_best, inflate_median, results = _times(
    setup_inflate, inflate_whole_file, (observation,), repeats
  )
  cpu = min(result.user_s + result.system_s for result in results)
  print(
    f'  inflate whole observation file:   {inflate_best:6.2f} / '
    f'{inflate_median:6.2f} s, {cpu:.2f} CPU-s'
  )
  for verify in (False, True):
    best, median, results = _times(
      setup_buffer, first_batch, (directory, count, verify), repeats
    )
    cpu = min(result.user_s + result.system_s for result in results)
    label = 'verified (default)' if verify else 'verify_checksums=False'
    if verify:
      target = 1.25 * inflate_best + 0.5
      versus = f'target <= {target:.2f} s (1.25x inflate + 0.5 s)'
    else:
      versus = 'target <= 0.75 s'
    print(
      f'  first batch, {label:22s} {best:6.2f} / {median:6.2f} s, '
      f'{cpu:.2f} CPU-s; {versus}'
    )
  if BATCH_RL.value:
    common.wait_for_memory(12 * common.GIB)
    baseline = common.measure(
      reader_benchmark.setup_baseline,
      reader_benchmark.read_baseline,
      (directory, 0, count, rows),
    )
    print(
      f"  batch_rl's load-then-clip:        {baseline.wall_s:6.2f} s "
      '(window only, no batch)'
    )


if __name__ == '__main__':
  logging.set_verbosity(logging.WARNING)
  app.run(main)
