"""Converts an RL Unplugged run (raw shards or TFDS splits) checkpoint-wise.

The checkpoints go through convert.py's machinery (worker processes, a
partial directory per checkpoint, verification, atomic commit, checked skip
on a rerun, the store's lock), in two rounds:

1. Every part (shard or split) not yet indexed whose first episode belongs
   to the checkpoint it is named after is converted as that checkpoint, in
   one read that also indexes it (rlu_source.py, first pass). Other parts
   not yet indexed are only indexed, in this process.
2. With every part indexed, each checkpoint is planned from all of them
   (rlu_plan.py). Checkpoints whose stored description matches the plan are
   checked and skipped; one converted before all its parts were known is
   deleted and converted again from the plan; the others are converted.

For a run laid out as published (shard NNNNN holds checkpoint NNNNN, in
episode order) round 1 does all the work, reading each shard once; round 2
only checks.
"""

from collections.abc import Sequence
import dataclasses
import os
from typing import Any

from absl import logging

from fixed_replay.convert import checkpoint_commit
from fixed_replay.convert import convert
from fixed_replay.convert import rlu_source
from fixed_replay.convert.convert_options import ConversionResult
from fixed_replay.convert.convert_options import ConvertOptions
from fixed_replay.errors import CheckpointError
from fixed_replay.io import files as storage
from fixed_replay.sources import layout
from fixed_replay.sources.rlu import rlu_episodes
from fixed_replay.sources.rlu import rlu_plan
from fixed_replay.sources.rlu import rlu_shards
from fixed_replay.sources.rlu import rlu_tfds
from fixed_replay.store import observation_spec

KINDS = ('rlu', 'tfds')
_KIND_OF = {layout.Kind.RLU: 'rlu', layout.Kind.TFDS: 'tfds'}
_BYTES_PER_FRAME_GUESS = 1000  # RL Unplugged's PNGs: ~1 KB a frame.


def _for_source(options, source):
  """options, with the game the source's path names if it has none, and
  (unless given) the stack of Atari frames, which RL Unplugged's are."""
  return dataclasses.replace(
    options,
    game=options.game or layout.game_of(str(source)),
    stack_size=options.stack_size or observation_spec.ATARI.stack_size,
  )


def discover(
  source: str, kind: str, run: int | None = None
) -> tuple[str, list[rlu_plan.Part]]:
  """Returns (location, parts) of a run.

  Args:
    source: str, a directory of shards (local or gs://), or a TFDS data
      directory.
    kind: 'rlu' or 'tfds'.
    run: int or None, the run among the shards (kind 'rlu').

  Raises:
    CheckpointError: if nothing is found, or several runs and no `run`.
  """
  if kind == 'rlu':
    shards = rlu_shards.select_run(source, run)
    rlu_shards.log_shards(shards)
    parts = [
      rlu_plan.Part(s.name, s.number, storage.size(s.path)) for s in shards
    ]
    return str(source), parts
  if kind == 'tfds':
    location = rlu_tfds.find_dataset_dir(source)
    parts = [
      rlu_plan.Part(s.name, s.number, s.num_bytes)
      for s in rlu_tfds.find_splits(location)
    ]
    return location, parts
  raise ValueError(f'kind {kind!r} is not one of {KINDS}')


def _index_part(kind: str, location: str, part, store_dir: str):
  logging.info('Indexing %s', rlu_source.part_label(kind, location, part))
  entries = [
    rlu_plan.entry_of(part, episode)
    for episode in rlu_source.open_part(kind, location, part)
  ]
  rlu_plan.check_unique(entries, location)
  rlu_plan.write_index(store_dir, part, entries)
  return entries


def _first_round(
  kind: str, location: str, parts, store_dir: str, options, output
):
  """First-pass sources, and the parts that still need an index."""
  sources, unindexed = [], []
  for part in parts:
    if rlu_plan.read_index(store_dir, part) is not None:
      continue
    first = None
    if not output.exists(store_dir, part.number):
      try:
        first = rlu_source.first_episode(kind, location, part)
      except CheckpointError:
        pass  # Indexing it reports the damage, after the others converted.
    if first is None or first.checkpoint_idx != part.number:
      unindexed.append(part)
      continue
    sources.append(
      rlu_source.EpisodeSource(
        suffix=part.number,
        kind=kind,
        location=location,
        parts=(part,),
        store_dir=store_dir,
        stack_size=options.stack_size,
        update_horizon=options.update_horizon,
        rows_hint=max(1, part.num_bytes // _BYTES_PER_FRAME_GUESS),
      )
    )
  return sources, unindexed


def plan_checkpoints(
  kind: str,
  location: str,
  parts: Sequence[rlu_plan.Part],
  store_dir: str,
  options: ConvertOptions,
) -> dict[int, rlu_source.EpisodeSource]:
  """Plans every checkpoint from the parts' indexes (all must exist).

  Returns:
    dict of checkpoint to rlu_source.EpisodeSource with its plan.
  """
  indexes = {}
  for part in parts:
    entries = rlu_plan.read_index(store_dir, part)
    if entries is None:
      raise CheckpointError(
        rlu_source.part_label(kind, location, part), 'not indexed'
      )
    indexes[part.name] = entries
  sizes = {part.name: part.num_bytes for part in parts}
  sources = {}
  for checkpoint, entries in rlu_plan.checkpoints_of(indexes, location).items():
    used = sorted({e.part for e in entries})
    sources[checkpoint] = rlu_source.EpisodeSource(
      suffix=checkpoint,
      kind=kind,
      location=location,
      parts=tuple(p for p in parts if p.name in used),
      plan=tuple((e.part, e.record, e.episode_idx) for e in entries),
      store_dir=store_dir,
      stack_size=options.stack_size,
      update_horizon=options.update_horizon,
      planned=rlu_plan.describe(entries, sizes),
      rows_hint=rlu_plan.expected_rows(entries, options.stack_size),
    )
  return sources


def stale_checkpoints(
  planned: dict[int, rlu_source.EpisodeSource],
  store_dir: str,
  output: checkpoint_commit.ConverterOutput,
) -> list[int]:
  """Stored checkpoints made from a subset of their parts (see rlu_plan)."""
  stale = []
  for checkpoint, source in planned.items():
    stored = output.stored_source(store_dir, checkpoint)
    if stored is not None and rlu_plan.superseded(stored, source.planned):
      stale.append(checkpoint)
  return stale


def _done(planned, store_dir: str, output):
  """Checkpoints stored exactly as planned."""
  return {
    checkpoint
    for checkpoint, source in planned.items()
    if output.stored_source(store_dir, checkpoint) == source.planned
  }


def unfinished(
  location: str,
  store_dir: str,
  parts: Sequence[rlu_plan.Part],
  options: ConvertOptions,
) -> tuple[list[rlu_plan.Part], dict[int, list[str]]]:
  """What a convert_rlu of the shards `parts` still has to do.

  Returns:
    (unindexed, todo): the parts not indexed yet, and {checkpoint: names of
    the parts it needs} for the checkpoints of the indexed parts that are
    not stored as planned.
  """
  options = _for_source(options, location)
  output = checkpoint_commit.output_of(options)
  unindexed = [p for p in parts if rlu_plan.read_index(store_dir, p) is None]
  indexed = [p for p in parts if p not in unindexed]
  planned = plan_checkpoints('rlu', location, indexed, store_dir, options)
  done = _done(planned, store_dir, output)
  todo = {
    checkpoint: {part.name for part in source.parts}
    for checkpoint, source in planned.items()
    if checkpoint not in done
  }
  return unindexed, todo


def _rounds(
  kind: str,
  location: str,
  parts,
  store_dir: str,
  options,
  recheck,
  plan: bool = True,
):
  output = checkpoint_commit.output_of(options)
  rlu_plan.remove_temporaries(store_dir)
  existed = {
    n
    for n in range(rlu_episodes.NUM_CHECKPOINTS)
    if output.exists(store_dir, n)
  }
  sources, unindexed = _first_round(
    kind, location, parts, store_dir, options, output
  )
  yield sources
  for part in unindexed:
    _index_part(kind, location, part, store_dir)
  if not plan:
    return
  planned = plan_checkpoints(kind, location, parts, store_dir, options)
  for checkpoint in stale_checkpoints(planned, store_dir, output):
    logging.warning(
      'Checkpoint %d was converted from %s only; its episodes are in %s: '
      'converting it again',
      checkpoint,
      sorted(output.stored_source(store_dir, checkpoint)['files']),
      sorted(planned[checkpoint].planned['files']),
    )
    output.remove(store_dir, checkpoint)
  # Checked and skipped: what was there before (unless told not to); left
  # alone: what round 1 converted as planned.
  done = _done(planned, store_dir, output)
  yield [
    source
    for checkpoint, source in planned.items()
    if checkpoint not in done or (recheck and checkpoint in existed)
  ]


def convert_rlu(
  source: str,
  store_dir: str,
  kind: str | None = None,
  run: int | None = None,
  options: ConvertOptions | None = None,
  workers: int | None = None,
  parts: Sequence[rlu_plan.Part] | None = None,
  recheck: bool = True,
  plan: bool = True,
  ray: Any = None,
) -> ConversionResult:
  """Converts the checkpoints of one RL Unplugged run into a store.

  Args:
    source: str, a directory of `run_<r>-NNNNN-of-MMMMM` shards (local or
      gs://), or (kind 'tfds') a prepared rlu_atari_checkpoints_ordered.
    store_dir: str, the local output directory.
    kind: 'rlu', 'tfds' or None to detect it.
    run: int or None; required when the directory holds several runs.
    options: convert_options.ConvertOptions (output_format, stack_size, ...);
      ConvertOptions() when None.
    workers: int or None, as for convert.convert.
    parts: optional list of rlu_plan.Part to convert instead of all the
      run's (their files may be absent where already indexed and not needed).
    recheck: bool, verify (and skip) checkpoints the store held before this
      call; False trusts them (a caller that verified them in this session).
    plan: bool; False stops after round 1 (first passes and indexing).
    ray: as for convert.convert: each checkpoint a Ray task (indexing
      stays in this process).

  Returns:
    convert_options.ConversionResult.

  Raises:
    CheckpointError: naming the shard and the episode for damaged input;
      as convert.convert for the store.
  """
  options = _for_source(options or ConvertOptions(), source)
  location, store_dir, rounds = _prepare(
    source, store_dir, kind, run, options, parts, recheck, plan, ray
  )
  return convert.convert_source_runs(
    [(location, store_dir, rounds)], options, workers, ray
  )[0]


def _prepare(
  source, store_dir: str, kind: str, run, options, parts, recheck, plan, ray
):
  """(location, store_dir, rounds): one run of convert_source_runs."""
  source = str(source)
  if ray:  # Ray tasks may run in another directory, or on another node.
    source = source if storage.is_remote(source) else os.path.abspath(source)
    store_dir = os.path.abspath(store_dir)
  if kind is None:
    kind = _KIND_OF.get(layout.detect(source).kind)
  if kind is None:
    raise CheckpointError(
      source,
      'neither RL Unplugged shards (run_<r>-NNNNN-of-MMMMM) nor a prepared '
      f'{rlu_tfds.DATASET} dataset',
    )
  if parts is None:
    location, parts = discover(source, kind, run)
  else:
    location = source
  rounds = _rounds(
    kind, location, parts, str(store_dir), options, recheck, plan
  )
  return location, str(store_dir), rounds


def run_store(destination: str, run: int) -> str:
  """Where `convert_all_runs` puts a run: DESTINATION/run_<r>."""
  return os.path.join(str(destination), f'run_{run}')


def convert_all_runs(
  source: str,
  destination: str,
  options: ConvertOptions | None = None,
  workers: int | None = None,
  ray: Any = None,
) -> dict[int, ConversionResult]:
  """Converts every run of a directory of shards, each into its own store.

  Run r goes to `run_store(destination, r)` (DESTINATION/run_<r>), the
  same bytes as `convert_rlu(source, that store, run=r)`; all runs are one
  job (the same workers or Ray tasks, one progress display per round).

  Args:
    source: str, a directory of `run_<r>-NNNNN-of-MMMMM` shards (local or
      gs://).
    destination: str, the local directory of the stores.
    options, workers, ray: as for `convert_rlu`.

  Returns:
    dict, run -> convert_options.ConversionResult, in run order.

  Raises:
    CheckpointError: as for `convert_rlu`.
  """
  options = _for_source(options or ConvertOptions(), source)
  runs = sorted(rlu_shards.find_runs(str(source)))
  prepared = [
    _prepare(
      source,
      run_store(destination, r),
      'rlu',
      r,
      options,
      None,
      True,
      True,
      ray,
    )
    for r in runs
  ]
  results = convert.convert_source_runs(prepared, options, workers, ray)
  return dict(zip(runs, results, strict=True))
