"""Converts one checkpoint atomically: partial directory, check, rename.

Whoever runs it (this process, a worker process, a Ray task) gets the same
bytes: a checkpoint is written into `.partial_checkpoint_<N>` of the store,
verified by its output (compact_output.py or dopamine_output.py) and only
then renamed into place; on any failure the partial directory is removed.
"""

import os
import shutil
import time

from absl import logging

from fixed_replay.errors import CheckpointError
from fixed_replay.store import checkpoint_source
from fixed_replay.store import compact_output
from fixed_replay.store import destination
from fixed_replay.store import dopamine_output
from fixed_replay.store import manifest as manifest_lib
from fixed_replay.store import workers as worker_processes


def output_of(options):
  """The output ConvertOptions.output_format names."""
  if options.output_format == 'compact':
    return compact_output.CompactOutput()
  if options.output_format == 'dopamine':
    return dopamine_output.DopamineOutput()
  raise ValueError(
    f'output_format {options.output_format!r} is not compact or dopamine'
  )


def convert_checkpoint(files, store_dir, options, threads=1):
  """Converts one checkpoint into the store (`checkpoint_<suffix>`).

  Args:
    files: a source (checkpoint_source.py) or checkpoints.CheckpointFiles.
    store_dir: str, the store.
    options: ConvertOptions.
    threads: int, threads compressing blocks.

  Returns:
    dict with suffix, rows, seconds.

  Raises:
    CheckpointError: if the source is damaged, the result fails its check,
      or the store cannot be written (naming the path and the cause).
  """
  began = time.perf_counter()
  source = checkpoint_source.as_source(files)
  output = output_of(options)
  final = output.final_path(store_dir, source.suffix)
  partial = os.path.join(store_dir, manifest_lib.partial_dirname(source.suffix))
  try:
    if os.path.exists(partial):
      shutil.rmtree(partial)
    os.mkdir(partial)
    try:
      num_rows, written = output.write(source, partial, options, threads)
      output.verify(partial, written)
      if output.exists(store_dir, source.suffix):
        raise CheckpointError(final, 'appeared while converting: not replaced')
      if not worker_processes.parent_alive():
        os._exit(1)  # The conversion was killed: leave nothing behind.
      output.commit(partial, store_dir, source.suffix)
      compact_output.fsync_directory(store_dir)
    finally:
      if os.path.exists(partial):
        shutil.rmtree(partial, ignore_errors=True)
  except OSError as error:  # Sources are read through CheckpointError.
    raise destination.error(final, error) from error
  return {
    'suffix': source.suffix,
    'rows': num_rows,
    'seconds': time.perf_counter() - began,
  }


def remove_partials(store_dir):
  """Deletes partial checkpoints of killed conversions (ours by name)."""
  for name in os.listdir(store_dir):
    if manifest_lib.is_partial_dirname(name):
      logging.info('Removing %s, left by an interrupted conversion', name)
      shutil.rmtree(os.path.join(store_dir, name))
