"""Inflate throughput of each gzip backend on the benchmark observation file.

Decompresses `$store$_observation_ckpt.0.gz` of the benchmark checkpoint to
the end (output discarded, CRC checked) with `GzipStream` on every backend of
`fixed_replay.io.gzip_stream.BACKENDS`, and with the standard library's
`gzip.GzipFile.read` in chunks for reference. Prints GB/s of uncompressed
output; this is what orders the backends in gzip_stream.py.

Usage: python benchmarks/inflate_backends.py [--rows=1000000] [--repeats=3]
"""

import gzip
import os
import statistics
import time

from absl import app
from absl import flags
from absl import logging
import common

_REPEATS = flags.DEFINE_integer('repeats', 3, 'Runs per backend.')
_CHUNK_BYTES = 1 << 20  # GzipFile.read size, as a streaming reader would use.
STDLIB = 'gzip.GzipFile'


def inflate_with_stream(path, backend):
  """Returns uncompressed bytes of `path`, read with GzipStream."""
  from fixed_replay.io.gzip_stream import GzipStream

  with GzipStream(path, backend=backend) as stream:
    return stream.read_to_end()


def inflate_with_gzipfile(path):
  """Returns uncompressed bytes of `path`, read with gzip.GzipFile."""
  total = 0
  with gzip.GzipFile(path, 'rb') as stream:
    while chunk := stream.read(_CHUNK_BYTES):
      total += len(chunk)
  return total


def _time(function, *args):
  """Returns (wall seconds, CPU seconds of this process, result)."""
  wall, cpu = time.perf_counter(), time.process_time()
  result = function(*args)
  return time.perf_counter() - wall, time.process_time() - cpu, result


def main(argv):
  del argv
  from fixed_replay.io import gzip_stream
  from fixed_replay.sources.dopamine import checkpoints

  directory = common.build_checkpoint(
    common.ROWS.value, common.SEED.value, game=common.GAME.value
  )
  path = checkpoints.find_checkpoints(str(directory))[0].store_paths[
    'observation'
  ]
  readers = {
    name: (inflate_with_stream, path, name) for name in gzip_stream.BACKENDS
  }
  readers[STDLIB] = (inflate_with_gzipfile, path)

  load_before = common.load_average()
  times = {name: [] for name in readers}
  cpu_times = {name: [] for name in readers}
  sizes = set()
  for repeat in range(_REPEATS.value):
    for name, (function, *args) in readers.items():  # Interleaved runs.
      seconds, cpu_seconds, size = _time(function, *args)
      logging.info(
        '%s run %d: %.2f s (%.2f s CPU)', name, repeat + 1, seconds, cpu_seconds
      )
      times[name].append(seconds)
      cpu_times[name].append(cpu_seconds)
      sizes.add(size)
  load_after = common.load_average()
  if len(sizes) != 1:
    raise AssertionError(f'backends disagree on the size: {sorted(sizes)}')
  size = sizes.pop()

  print(f'\nInflate throughput of {path}')
  print(
    f'{os.path.getsize(path) / 1e6:.1f} MB gzip -> {size / 1e9:.3f} GB '
    f'(ratio {size / os.path.getsize(path):.0f}:1)'
  )
  print(f'{load_before} at start, {load_after} at end ({os.cpu_count()} CPUs)')
  print(
    f'{_REPEATS.value} interleaved runs each; GB/s of uncompressed output '
    'from the best and median wall time, and from the least CPU time (less '
    'sensitive to other load). Page cache warm.'
  )
  print(
    f'  {"backend":<14} {"best s":>7} {"best GB/s":>10} {"median GB/s":>12} '
    f'{"CPU GB/s":>9}'
  )
  by_speed = sorted(readers, key=lambda name: min(times[name]))
  for name in by_speed:
    best, median = min(times[name]), statistics.median(times[name])
    print(
      f'  {name:<14} {best:7.2f} {size / best / 1e9:10.2f} '
      f'{size / median / 1e9:12.2f} {size / min(cpu_times[name]) / 1e9:9.2f}'
    )
  configured = list(gzip_stream.BACKENDS)
  measured = [name for name in by_speed if name in gzip_stream.BACKENDS]
  print(
    f'gzip_stream order {configured}; measured fastest first {measured}: '
    + ('same' if configured == measured else 'DIFFERENT')
  )


if __name__ == '__main__':
  app.run(main)
