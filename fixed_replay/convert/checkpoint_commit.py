"""Converts one checkpoint atomically: partial directory, check, rename.

Whoever runs it (this process, a worker process, a Ray task) gets the same
bytes: a checkpoint is written into `.partial_checkpoint_<N>` of the store,
verified by its output (compact_output.py or dopamine_output.py) and only
then renamed into place; on any failure the partial directory is removed.
"""

import os
import shutil
import time
from typing import Any
from typing import Protocol

from absl import logging

from fixed_replay.convert import compact_output
from fixed_replay.convert import destination
from fixed_replay.convert import dopamine_output
from fixed_replay.convert import workers as worker_processes
from fixed_replay.convert.checkpoint_source import CheckpointSource
from fixed_replay.convert.convert_options import ConvertOptions
from fixed_replay.errors import CheckpointError
from fixed_replay.store import manifest as manifest_lib


class ConverterOutput(Protocol):
  """What a conversion writes: a store's checkpoints in one format.

  A checkpoint is written into a partial directory, verified, then committed
  (renamed into place) by convert_checkpoint; the other methods answer what
  a store already holds, so that a rerun skips what is done.
  """

  def final_path(self, store_dir: str, suffix: int) -> str:
    """Where checkpoint `suffix` is once committed (its presence: done)."""
    ...

  def exists(self, store_dir: str, suffix: int) -> bool: ...

  def stored_source(self, store_dir: str, suffix: int) -> dict | None:
    """manifest['source'] of a stored checkpoint, or None if absent."""
    ...

  def check_existing(
    self, store_dir: str, source: CheckpointSource, options: ConvertOptions
  ) -> None:
    """Raises CheckpointError unless the stored checkpoint is this one."""
    ...

  def clean(self, store_dir: str) -> None:
    """Tidies what an interrupted conversion left, before converting."""
    ...

  def prepare(self, store_dir: str, sources: list) -> None:
    """Writes what the run's checkpoints share, before they convert."""
    ...

  def write(
    self,
    source: CheckpointSource,
    partial: str,
    options: ConvertOptions,
    threads: int,
  ) -> tuple[int, Any]:
    """Writes into `partial`; returns (rows, what verify needs)."""
    ...

  def verify(self, partial: str, written: Any) -> None: ...

  def commit(self, partial: str, store_dir: str, suffix: int) -> None: ...

  def remove(self, store_dir: str, suffix: int) -> None: ...

  def stored_bytes(self, store_dir: str, suffix: int) -> int: ...

  def run_bytes(self, store_dir: str) -> int:
    """Bytes of what the run's checkpoints share (prepare's)."""
    ...

  def stored_rows(self, store_dir: str, suffix: int) -> int: ...


def output_of(options: ConvertOptions) -> ConverterOutput:
  """The output ConvertOptions.output_format names."""
  if options.output_format == 'compact':
    return compact_output.CompactOutput()
  if options.output_format == 'dopamine':
    return dopamine_output.DopamineOutput()
  raise ValueError(
    f'output_format {options.output_format!r} is not compact or dopamine'
  )


def convert_checkpoint(
  source: CheckpointSource,
  store_dir: str,
  options: ConvertOptions,
  threads: int = 1,
) -> dict:
  """Converts one checkpoint into the store (`checkpoint_<suffix>`).

  Args:
    source: checkpoint_source.CheckpointSource.
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
      destination.fsync_directory(store_dir)
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


def remove_partials(store_dir: str) -> None:
  """Deletes partial checkpoints of killed conversions (ours by name)."""
  for name in os.listdir(store_dir):
    if manifest_lib.partial_suffix(name) is not None:
      logging.info('Removing %s, left by an interrupted conversion', name)
      shutil.rmtree(os.path.join(store_dir, name))
