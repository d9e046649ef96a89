"""A checkpoint made of RL Unplugged episodes, as a conversion source.

EpisodeSource is a checkpoint_source.CheckpointSource for convert.py:
the rows Dopamine's `add` would hold after the checkpoint's episodes
(convert/episode_rows.py), frames decoded in slices, one episode record in
memory at a time. Two ways to know which episodes:

* first pass (`plan` None): read one part whole, take its episodes of
  checkpoint `suffix` in file order (the common layout: shard NNNNN holds
  checkpoint NNNNN, in order), and index every record of the part on the way
  (rlu_plan.py). One read of each shard converts a run laid out as usual;
  the planner checks the indexes afterwards.
* planned (`plan` given): exactly the listed (part, record) pairs, in
  episode_idx order, wherever they are. Records of one part that are wanted
  out of file order are read by separate passes over that part, merged.
"""

from collections.abc import Iterator
import dataclasses
from typing import Any

import numpy as np

from fixed_replay.convert import checkpoint_source
from fixed_replay.convert import episode_rows
from fixed_replay.errors import CheckpointError
from fixed_replay.io import files as storage
from fixed_replay.sources.rlu import rlu_episodes
from fixed_replay.sources.rlu import rlu_plan
from fixed_replay.sources.rlu import rlu_shards
from fixed_replay.sources.rlu import rlu_tfds


def part_label(kind: str, location: str, part: rlu_plan.Part) -> str:
  """Names a part in messages: the shard's path or dir[split]."""
  if kind == 'rlu':
    return storage.join(location, part.name)
  return f'{location}[{part.name}]'


def open_part(
  kind: str, location: str, part: rlu_plan.Part, wanted: set[int] | None = None
) -> Iterator[rlu_episodes.Episode]:
  """Yields the validated episodes of a part (shard or TFDS split)."""
  if kind == 'rlu':
    return rlu_shards.iter_episodes(storage.join(location, part.name), wanted)
  if kind == 'tfds':
    return rlu_tfds.iter_episodes(location, part.name, wanted)
  raise ValueError(f'unknown kind {kind!r}')


def first_episode(
  kind: str, location: str, part: rlu_plan.Part
) -> rlu_episodes.Episode | None:
  """The first episode of a part, or None if it has none."""
  return next(open_part(kind, location, part, wanted={0}), None)


@dataclasses.dataclass(frozen=True)
class EpisodeSource:
  """Checkpoint `suffix` from RL Unplugged episodes (see module docstring).

  Attributes:
    suffix: int, the checkpoint (checkpoint_idx of its episodes).
    kind: str, 'rlu' (raw shards) or 'tfds' (prepared splits).
    location: str, the shard directory or the TFDS version directory.
    parts: tuple of rlu_plan.Part read.
    plan: tuple of (part name, record, episode_idx) in episode order, or
      None for a first pass over parts[0].
    store_dir: str, where a first pass writes the part's index.
    stack_size: int, Dopamine's stack (stack_size - 1 zero rows per episode).
    update_horizon: int, for Dopamine's invalid_range.
    planned: dict, the description of the planned episodes (None for a
      first pass: known once read).
    rows_hint: int, rows expected (exact when planned).
  """

  suffix: int
  kind: str
  location: str
  parts: tuple
  plan: tuple | None = None
  store_dir: str | None = None
  stack_size: int = 4
  update_horizon: int = 1
  planned: dict | None = None
  rows_hint: int = 0

  def description(self) -> dict | None:
    return self.planned

  def expected_rows(self) -> int:
    return self.rows_hint

  def source_files(self) -> dict[str, int]:
    return {part.name: part.num_bytes for part in self.parts}

  def open(self, threads: int = 1) -> checkpoint_source.SourceReader:
    return _EpisodeReader(self, threads)


class _EpisodeReader:
  """Reads one EpisodeSource; see checkpoint_source.py for the protocol."""

  row_shape = rlu_episodes.FRAME_SHAPE
  written_rows = None  # Every row it yields is an episode's.
  dtype = 'uint8'

  def __init__(self, source: EpisodeSource, threads: int) -> None:
    self._source = source
    self._threads = threads
    self._rows = None
    self._taken = []

  def __enter__(self) -> '_EpisodeReader':
    return self

  def __exit__(self, *unused_exc_info: Any) -> None:
    pass

  def frame_slices(self, slice_rows: int) -> Iterator[np.ndarray]:
    source = self._source
    self._rows = episode_rows.EpisodeRows(
      slice_rows, source.stack_size, source.update_horizon, self._threads
    )
    if source.plan is None:
      episodes = self._first_pass()
    else:
      episodes = self._planned()
    for episode in episodes:
      yield from self._rows.add(episode)
      # Its index entry only (not its frames), for a first pass's
      # description (a planned source has it already).
      self._taken.append(rlu_plan.entry_of(source.parts[0], episode))
    yield from self._rows.finish()

  def _first_pass(self):
    """This part's episodes of the checkpoint; indexes the whole part."""
    source = self._source
    part = source.parts[0]
    entries, last = [], None
    for episode in open_part(source.kind, source.location, part):
      entries.append(rlu_plan.entry_of(part, episode))
      wanted = episode.checkpoint_idx == source.suffix
      if wanted and (last is None or episode.episode_idx > last):
        last = episode.episode_idx
        yield episode
    rlu_plan.check_unique(entries, source.location)
    rlu_plan.write_index(source.store_dir, part, entries)
    if last is None:
      raise CheckpointError(
        part_label(source.kind, source.location, part),
        f'holds no episode of checkpoint {source.suffix}',
      )

  def _planned(self):
    """The planned records, in plan order, one pass per increasing run."""
    source = self._source
    parts = {part.name: part for part in source.parts}
    streams, wanted, order = {}, {}, []
    run_of, last_record = {}, {}
    for name, record, _ in source.plan:
      if record <= last_record.get(name, -1):
        run_of[name] = run_of.get(name, 0) + 1
      last_record[name] = record
      key = (name, run_of.get(name, 0))
      wanted.setdefault(key, set()).add(record)
      order.append((key, record))
    for key, records in wanted.items():
      part = parts[key[0]]
      streams[key] = open_part(source.kind, source.location, part, records)
    for (key, record), (_, _, episode_idx) in zip(
      order, source.plan, strict=True
    ):
      episode = next(streams[key], None)
      label = part_label(source.kind, source.location, parts[key[0]])
      if episode is None or episode.record != record:
        raise CheckpointError(label, f'record {record} is missing')
      if (episode.checkpoint_idx, episode.episode_idx) != (
        source.suffix,
        episode_idx,
      ):
        raise CheckpointError(
          label,
          f'{episode.where()} was indexed as episode {episode_idx} of '
          f'checkpoint {source.suffix}: the file changed since it was read; '
          'convert into a new directory',
        )
      yield episode
    for stream in streams.values():
      for _ in stream:  # Reads to the end: the checks at the file's end.
        pass

  def finish(self, num_rows: int) -> checkpoint_source.SourceRows:
    source = self._source
    arrays, add_count, invalid_range, ends = self._rows.result()
    if num_rows != add_count + 1:
      raise AssertionError(f'{num_rows} rows written, {add_count + 1} made')
    description = source.planned
    if description is None:
      sizes = {part.name: part.num_bytes for part in source.parts}
      description = rlu_plan.describe(self._taken, sizes)
    # Positional, in SourceRows' field order.
    return checkpoint_source.SourceRows(
      arrays, add_count, invalid_range, ends, description
    )
