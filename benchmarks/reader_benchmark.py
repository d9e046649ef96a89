"""Reading a window of a replay checkpoint: batch_rl's way against ours.

batch_rl's way: Dopamine's `OutOfGraphReplayBuffer.load` inflates every array
of the checkpoint whole, then `array[start:start + count].copy()` keeps the
window (batch_rl clips a loaded buffer this way). Ours:
`fixed_replay.sources.dopamine.checkpoints.read_checkpoint` inflates only
up to the window's end and writes straight into arrays of the window's
size. Ours reads with `verify=False` here: the window alone, as batch_rl's
way has no such option; what checking the rest of the file adds (the
default) is measured by buffer_benchmark.py part 5.

Cases: (a) rows [0, window_rows) and (b) the whole file. Each run is a fresh
process; its peak RSS is the kernel's high-water mark, and "increase" is that
peak minus the RSS right after the method's imports (TensorFlow alone is ~0.5
GiB for batch_rl's way). Both methods' results are compared (CRC-32 of every
array plus sampled rows) so a wrong read cannot pass as a fast one.

Usage: python benchmarks/reader_benchmark.py [--rows=1000000] [--repeats=2]
"""

import dataclasses
import importlib
import os
import statistics

from absl import app
from absl import flags
from absl import logging
import common
import numpy as np

_REPEATS = flags.DEFINE_integer(
  'repeats', 2, 'Runs per method and case (fresh process each).'
)
_WINDOW_ROWS = flags.DEFINE_integer(
  'window_rows', 50_000, 'Rows of the window case (a), read from row 0.'
)

# Targets the reader is held to (see the README).
WINDOW_SPEEDUP_TARGET = 50.0
WINDOW_MEMORY_TARGET = 15.0
WHOLE_SPEEDUP_TARGET = 5.0
WHOLE_OVERHEAD_TARGET = 1.05  # Peak increase at most arrays + 5%.
BASELINE_CAPACITY = 1_000_000  # As batch_rl constructs its buffers.


def setup_baseline():
  importlib.import_module('dopamine.tf.replay_memory.circular_replay_buffer')


def setup_ours():
  importlib.import_module('fixed_replay.sources.dopamine.checkpoints')


def read_baseline(directory, start, count, capacity):
  """batch_rl's way: load every array whole, then copy the window out."""
  from dopamine.tf.replay_memory import circular_replay_buffer

  buffer = circular_replay_buffer.OutOfGraphReplayBuffer(
    common.OBSERVATION_SHAPE, common.STACK_SIZE, capacity, 32
  )
  buffer.load(str(directory), 0)
  # pylint: disable-next=protected-access
  return {
    name: array[start : start + count].copy()
    for name, array in buffer._store.items()
  }


def read_ours(directory, start, count):
  from fixed_replay.sources.dopamine import checkpoints

  files = checkpoints.find_checkpoints(str(directory))[0]
  window = checkpoints.read_checkpoint(
    files,
    start,
    count,
    observation_shape=common.OBSERVATION_SHAPE,
    observation_dtype=np.uint8,
    verify=False,  # The window alone; see buffer_benchmark.py part 5.
  )
  return window.store


@dataclasses.dataclass
class Runs:
  """The measurements of one method on one case."""

  measurements: list = dataclasses.field(default_factory=list)

  @property
  def best(self):
    return min(self.measurements, key=lambda m: m.wall_s)

  @property
  def best_s(self):
    return self.best.wall_s

  @property
  def median_s(self):
    return statistics.median(m.wall_s for m in self.measurements)

  @property
  def peak_rss(self):
    return max(m.peak_rss for m in self.measurements)

  @property
  def peak_increase(self):
    return max(m.peak_increase for m in self.measurements)


def _measure_case(directory, start, count, capacity, arrays_bytes):
  """Runs both methods `--repeats` times, alternating; returns their Runs."""
  window_bytes = arrays_bytes * count // capacity
  methods = {
    'batch_rl': (
      setup_baseline,
      read_baseline,
      (directory, start, count, max(capacity, BASELINE_CAPACITY)),
      arrays_bytes + window_bytes + common.GIB,
    ),
    'ours': (
      setup_ours,
      read_ours,
      (directory, start, count),
      window_bytes + common.GIB // 2,
    ),
  }
  runs = {name: Runs() for name in methods}
  digests = {}
  for repeat in range(_REPEATS.value):
    for name, (setup, read, args, needed) in methods.items():
      common.wait_for_memory(needed)
      logging.info(
        'rows [%d, %d): %s, run %d', start, start + count, name, repeat + 1
      )
      measurement = common.measure(setup, read, args, common.array_digest)
      logging.info(
        '  %.2f s, peak RSS %s (+%s over imports)',
        measurement.wall_s,
        common.format_bytes(measurement.peak_rss),
        common.format_bytes(measurement.peak_increase),
      )
      runs[name].measurements.append(measurement)
      digests.setdefault(name, measurement.digest)
      common.assert_same_digest(
        digests[name], measurement.digest, f'{name} run {repeat + 1}'
      )
  common.assert_same_digest(
    digests['batch_rl'], digests['ours'], 'ours vs batch_rl'
  )
  return runs


def _verdict(ok):
  return 'PASS' if ok else 'FAIL'


def _print_case(title, runs):
  print(f'\n{title}')
  header = (
    f'  {"method":<9} {"best s":>8} {"median s":>9} {"user s":>7} '
    f'{"sys s":>6} {"peak RSS":>11} {"increase":>11}'
  )
  print(header)
  for name, run in runs.items():
    print(
      f'  {name:<9} {run.best_s:8.2f} {run.median_s:9.2f} '
      f'{run.best.user_s:7.2f} {run.best.system_s:6.2f} '
      f'{common.format_bytes(run.peak_rss):>11} '
      f'{common.format_bytes(run.peak_increase):>11}'
    )


def _ratios(runs):
  base, ours = runs['batch_rl'], runs['ours']
  return (
    base.best_s / ours.best_s,
    base.peak_rss / ours.peak_rss,
    base.peak_increase / ours.peak_increase,
  )


def main(argv):
  del argv
  from fixed_replay.sources.dopamine import checkpoints

  directory = common.build_checkpoint(
    common.ROWS.value, common.SEED.value, game=common.GAME.value
  )
  files = checkpoints.find_checkpoints(str(directory))[0]
  headers = checkpoints.read_store_headers(files)
  rows = headers['observation'].num_rows
  arrays_bytes = sum(h.nbytes for h in headers.values())
  file_bytes = sum(os.path.getsize(p) for p in files.store_paths.values())
  window = min(_WINDOW_ROWS.value, rows)

  load_before = common.load_average()
  window_runs = _measure_case(directory, 0, window, rows, arrays_bytes)
  whole_runs = _measure_case(directory, 0, rows, rows, arrays_bytes)
  load_after = common.load_average()

  print(f'\nReader benchmark on {directory}')
  print(
    f'{rows:,} rows; $store$_ arrays {common.format_bytes(arrays_bytes)} '
    f'uncompressed, {file_bytes / 1e6:.1f} MB gzip'
  )
  print(f'{load_before} at start, {load_after} at end ({os.cpu_count()} CPUs)')
  print(
    f'Fresh process per run, {_REPEATS.value} runs each; time: best and '
    'median wall time, user/sys CPU of the best run (sys is mostly page '
    'faults); memory: highest of the runs; increase = peak RSS - RSS after '
    'imports. Page cache warm. Results of both methods checked equal.'
  )
  if rows != common.FULL_ROWS:
    print(f'Targets are set for {common.FULL_ROWS:,} rows; this is a trial.')
  _print_case(f'(a) rows [0, {window:,})', window_runs)
  speedup, rss_ratio, increase_ratio = _ratios(window_runs)
  print(
    f'  speed-up x{speedup:.1f} (target >= {WINDOW_SPEEDUP_TARGET:g}x: '
    f'{_verdict(speedup >= WINDOW_SPEEDUP_TARGET)}); '
    f'peak memory x{increase_ratio:.1f} less by increase (target >= '
    f'{WINDOW_MEMORY_TARGET:g}x: '
    f'{_verdict(increase_ratio >= WINDOW_MEMORY_TARGET)}), x{rss_ratio:.1f} '
    'by peak RSS'
  )
  _print_case(f'(b) whole file, rows [0, {rows:,})', whole_runs)
  speedup, rss_ratio, increase_ratio = _ratios(whole_runs)
  overhead = whole_runs['ours'].peak_increase / arrays_bytes
  print(
    f'  speed-up x{speedup:.1f} (target >= {WHOLE_SPEEDUP_TARGET:g}x: '
    f'{_verdict(speedup >= WHOLE_SPEEDUP_TARGET)}); '
    f'peak memory x{increase_ratio:.2f} less by increase, x{rss_ratio:.2f} '
    'by peak RSS'
  )
  print(
    f'  arrays {common.format_bytes(arrays_bytes)}; ours increase / arrays '
    f'= {overhead:.3f} (target <= {WHOLE_OVERHEAD_TARGET:g}: '
    f'{_verdict(overhead <= WHOLE_OVERHEAD_TARGET)}); ours peak RSS / '
    f'arrays = {whole_runs["ours"].peak_rss / arrays_bytes:.3f}'
  )


if __name__ == '__main__':
  app.run(main)
