"""Converts runs of replay checkpoints into compact stores, once.

Each checkpoint is converted on its own (checkpoint_commit.py): its frames
streamed in slices (bounded memory whatever the file's size) into zstd
units, everything written into a partial directory, verified (every unit
decoded and checked against the CRC-32 of the source frames, every small
array read back) and only then renamed into place. A conversion that is
interrupted leaves complete checkpoints and partial directories; started
again, it checks and skips the former, deletes the latter and converts the
rest, giving the same bytes as an uninterrupted run. The source is only
ever read.

Where the rows come from is a source (checkpoint_source.py: Dopamine gzip
files; rlu_source.py: RL Unplugged episodes); what is written is an output
(compact_output.py, or with `output_format='dopamine'` Dopamine's own files,
dopamine_output.py); who converts is a runner (convert_runners.py: this
process, worker processes that die with it, or Ray tasks).
Every combination writes the same bytes.

Before converting anything, every gzip checkpoint's bookkeeping is checked
(see sources/dopamine/checks.py) and all problems are reported at once. A
store is held by one conversion at a time (destination.py); a failure to
write names the path and the cause.
"""

from collections.abc import Iterable
from collections.abc import Sequence
import contextlib
import dataclasses
import os
import time
from typing import Any

from absl import logging

from fixed_replay.convert import checkpoint_commit
from fixed_replay.convert import checkpoint_source
from fixed_replay.convert import convert_runners
from fixed_replay.convert import destination
from fixed_replay.convert.checkpoint_source import CheckpointSource
from fixed_replay.convert.convert_options import ConversionResult
from fixed_replay.convert.convert_options import ConvertOptions
from fixed_replay.errors import CheckpointError
from fixed_replay.errors import CheckpointProblems
from fixed_replay.io import files as storage
from fixed_replay.sources import layout
from fixed_replay.sources.dopamine import audit
from fixed_replay.sources.dopamine import checkpoints
from fixed_replay.store import observation_spec


def _runner(
  workers: int | None = None, ray: Any = None
) -> convert_runners.ConversionRunner:
  """The ConversionRunner for `workers` and `ray`, as `convert` takes them."""
  if ray is None or ray is False:
    if workers == 0:
      return convert_runners.InProcess()
    return convert_runners.ProcessPool(workers)
  return convert_runners.RayRunner(ray, workers)


def _check_not_source(source_dir: str, store_dir: str):
  if not storage.is_remote(source_dir) and os.path.realpath(
    source_dir
  ) == os.path.realpath(store_dir):
    raise CheckpointError(store_dir, 'the store must not be the source')


def _absolute(path: str):
  """A local path made absolute (Ray tasks run in other directories)."""
  return path if storage.is_remote(path) else os.path.abspath(path)


class _Store:
  """One store during a conversion: locked, tidied, what was done in it."""

  def __init__(self, source_dir: str, store_dir: str, options) -> None:
    self.source_dir = source_dir
    self.store_dir = store_dir
    # Each run's game is its own (a job may span games): as given, else
    # what its data or path names.
    self._options = dataclasses.replace(
      options, game=options.game or layout.game_of(source_dir)
    )
    self._output = checkpoint_commit.output_of(options)
    self._lock = None
    self.converted, self.skipped, self.seen = [], [], {}

  def __enter__(self):
    _check_not_source(self.source_dir, self.store_dir)
    destination.create(self.store_dir)
    self._lock = destination.lock(self.store_dir)
    try:
      destination.wait_for_old_workers(self.store_dir)
      checkpoint_commit.remove_partials(self.store_dir)
      self._output.clean(self.store_dir)
    except BaseException:
      self._lock.close()
      raise
    return self

  def __exit__(self, exc_type, *unused_exc_info) -> bool:
    try:
      if exc_type is not None:  # What the next conversion would tidy.
        self._output.clean(self.store_dir)
    finally:
      self._lock.close()
    return False

  def plan(self, sources):
    """The sources not stored yet; stored ones are checked and skipped.

    Returns:
      list of convert_runners.Pending.
    """
    pending = []
    for source in sources:
      self.seen[source.suffix] = source
      if self._output.exists(self.store_dir, source.suffix):
        self._output.check_existing(self.store_dir, source, self._options)
        self.skipped.append(source.suffix)
        continue
      pending.append(
        convert_runners.Pending(
          source, self.store_dir, source.expected_rows(), self._options
        )
      )
    if pending:
      self._output.prepare(self.store_dir, sources)
    if sources:
      logging.info(
        'Converting %d checkpoint(s) %s of %s into %s; %d already '
        'converted (checked)',
        len(pending),
        [item.source.suffix for item in pending],
        self.source_dir,
        self.store_dir,
        len(sources) - len(pending),
      )
    return pending

  def result(self, seconds: float):
    output, store_dir = self._output, self.store_dir
    converted = sorted(set(self.converted))
    source_files = {
      name: size
      for source in self.seen.values()
      for name, size in source.source_files().items()
    }
    return ConversionResult(
      converted=converted,
      skipped=sorted(set(self.skipped) - set(converted)),
      frames=sum(output.stored_rows(store_dir, s) for s in converted),
      source_bytes=sum(source_files.values()),
      store_bytes=output.run_bytes(store_dir)
      + sum(output.stored_bytes(store_dir, s) for s in self.seen),
      seconds=seconds,
    )


def _run_sources(source_dir: str) -> list[CheckpointSource]:
  """The checkpoints of a Dopamine run, all checked first.

  A compact store as the source (layout.detect says which) is read back,
  and checked, checkpoint by checkpoint: an old store is rewritten in the
  current layout.
  """
  if layout.detect(source_dir).kind is layout.Kind.STORE:
    return checkpoint_source.stored_sources(source_dir)
  found = checkpoints.find_checkpoints(source_dir)
  _, errors = audit.check_run(found)
  if errors:
    raise CheckpointProblems(source_dir, errors)
  return [checkpoint_source.GzipSource(files) for files in found.values()]


def convert(
  source_dir: str,
  store_dir: str,
  options: ConvertOptions | None = None,
  workers: int | None = None,
  ray: Any = None,
) -> ConversionResult:
  """Converts every complete checkpoint of `source_dir` into a store.

  Args:
    source_dir: str, directory of gzip checkpoints (local or gs://).
    store_dir: str, local directory of the store (created if needed).
    options: convert_options.ConvertOptions or None for the defaults.
    workers: int or None; processes converting checkpoints in parallel (None:
      one per core, at most one per checkpoint); 0 converts in this process.
      With a local Ray: its CPUs.
    ray: None (no Ray), True (a private local Ray on 127.0.0.1), the address
      of a Ray cluster ('auto', 'HOST:PORT', 'ray://HOST:PORT'; the store
      must then be on a file system all its nodes mount), or a
      distributed.ClusterInfo (Ray already connected in this process). Each
      checkpoint is then a Ray task, retried if it fails or is lost.

  Returns:
    convert_options.ConversionResult.

  Raises:
    CheckpointError: if the source holds no complete checkpoint, a source
      file is damaged (CheckpointProblems lists every inconsistent file
      before anything is converted), an existing stored checkpoint fails its
      check, another conversion holds the store, or the store cannot be
      written (naming the path and the cause).
  """
  return convert_runs([(source_dir, store_dir)], options, workers, ray)[0]


def convert_runs(
  runs: Sequence[tuple[str, str]],
  options: ConvertOptions | None = None,
  workers: int | None = None,
  ray: Any = None,
) -> list[ConversionResult]:
  """Converts several Dopamine runs, each into its own store, as one job.

  Every run's files are checked first, then all stores are locked; then
  every pending checkpoint of every run is converted by the same workers (or
  Ray tasks), with one progress display (convert_source_runs, one round).

  Args:
    runs: list of (source_dir, store_dir) pairs, as for `convert`.
    options, workers, ray: as for `convert`.

  Returns:
    list of convert_options.ConversionResult, one per run, in the order of
    `runs`.

  Raises:
    CheckpointError: as for `convert`; the stores must be distinct.
  """
  options = options or ConvertOptions()
  if ray:
    runs = [(_absolute(str(s)), _absolute(str(d))) for s, d in runs]
  # Every run's files are checked before any store is created or locked.
  rounds = [[_run_sources(str(source_dir))] for source_dir, _ in runs]
  options = dataclasses.replace(
    options,  # Unless given: the first run's stack.
    stack_size=options.stack_size
    or observation_spec.resolve_directory(runs[0][0], {})['stack_size'],
  )
  return convert_source_runs(
    [(s, d, r) for (s, d), r in zip(runs, rounds, strict=True)],
    options,
    workers,
    ray,
  )


def convert_source_runs(
  runs: Sequence[tuple[str, str, Iterable[list[CheckpointSource]]]],
  options: ConvertOptions | None = None,
  workers: int | None = None,
  ray: Any = None,
) -> list[ConversionResult]:
  """Converts checkpoints from sources into stores, round after round.

  Round k of every run is converted together (the same workers or Ray
  tasks, one progress display), then round k + 1 of every run is asked for.

  Args:
    runs: list of (source_dir, store_dir, rounds): where the sources are (for
      messages and the check that the store is elsewhere), the local
      directory of the store (created if needed; the stores must be
      distinct), and an iterable of lists of sources (checkpoint_source.py).
      Each round is converted before the next is asked for, all under the
      store's lock, so a generator may plan a round from what the store
      holds.
    options, workers, ray: as for `convert` (Ray's cluster serves every
      round).

  Returns:
    list of convert_options.ConversionResult, one per run, in the order of
    `runs`.

  Raises:
    CheckpointError: as for `convert`.
  """
  began = time.perf_counter()
  options = options or ConvertOptions()
  runs = [(str(s), str(d), rounds) for s, d, rounds in runs]
  stores = [os.path.realpath(d) for _, d, _ in runs]
  if len(set(stores)) != len(stores):
    raise CheckpointError(runs[0][1], 'two runs would go into one store')
  with contextlib.ExitStack() as stack:
    try:
      held = [stack.enter_context(_Store(s, d, options)) for s, d, _ in runs]
      run = stack.enter_context(_runner(workers, ray))
      active = [
        (store, iter(rounds))
        for store, (_, _, rounds) in zip(held, runs, strict=True)
      ]
      while active:
        planned = []
        for store, rounds in active:
          sources = next(rounds, None)
          if sources is not None:
            planned.append((store, rounds, store.plan(sources)))
        pending = [item for _, _, items in planned for item in items]
        if pending:
          run.run(pending)
        for store, _, items in planned:
          store.converted += [item.source.suffix for item in items]
        active = [(store, rounds) for store, rounds, _ in planned]
    except OSError as error:
      raise destination.error(runs[0][1], error) from error
    seconds = time.perf_counter() - began
    return [store.result(seconds) for store in held]
