"""Summarises (and verifies) an RL Unplugged run: shards, checkpoints, returns.

Reads every record of every part (shard file or TFDS split): a record holds
a whole episode and nothing indexes them, so counting episodes means reading
them. Each record's length and CRCs are checked by the reader and its keys,
lengths, checkpoint_idx and actions by rlu_shards; `verify=True` also decodes
every PNG frame (84x84, 8-bit). Problems are collected, each naming its
shard and episode, and reading goes on with the next part.
"""

from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
import dataclasses
from typing import Any

from absl import logging
import numpy as np

from fixed_replay import progress
from fixed_replay.errors import CheckpointError
from fixed_replay.sources import summaries
from fixed_replay.sources.rlu import rlu_episodes

_DECODE_ROWS = 1024


@dataclasses.dataclass
class PartSummary:
  """One shard (or split): its size, records and whether it read cleanly."""

  name: str
  num_bytes: int
  records: int = 0
  ok: bool = True


@dataclasses.dataclass
class CheckpointEpisodes:
  """The episodes of one checkpoint_idx, over all parts."""

  checkpoint: int
  parts: list = dataclasses.field(default_factory=list)
  episodes: int = 0
  steps: int = 0
  terminal: int = 0
  returns: summaries.EpisodeStats = None
  # Sums of `unclipped_rewards`; None if an episode does not record them.
  game_returns: summaries.EpisodeStats = None


@dataclasses.dataclass
class RunSummary:
  """What `summarize_run` found."""

  location: str
  kind: str
  verified: bool
  parts: list = dataclasses.field(default_factory=list)
  checkpoints: list = dataclasses.field(default_factory=list)
  problems: list = dataclasses.field(default_factory=list)

  @property
  def ok(self) -> bool:
    return not self.problems and bool(self.checkpoints)

  @property
  def all_problems(self) -> list[str]:
    """The problems, as DirectorySummary.all_problems lists its own."""
    return self.problems

  def to_dict(self) -> dict:
    return {
      'location': self.location,
      'kind': self.kind,
      'verified': self.verified,
      'ok': self.ok,
      'parts': [dataclasses.asdict(p) for p in self.parts],
      'checkpoints': [dataclasses.asdict(c) for c in self.checkpoints],
      'problems': [dataclasses.asdict(p) for p in self.problems],
    }


def _decode_all(episode, scratch) -> None:
  for start in range(0, episode.num_steps, len(scratch)):
    count = min(len(scratch), episode.num_steps - start)
    rlu_episodes.decode_frames(episode, start, scratch[:count])


def _read_part(open_part, part, verify, scratch, found, summary):
  """Reads one part into `found` (episode_idx -> (part, episode facts))."""
  for episode in open_part(part):
    if verify:
      _decode_all(episode, scratch)
    summary.parts[-1].records += 1
    if episode.episode_idx in found:
      other = found[episode.episode_idx]
      raise CheckpointError(
        episode.shard,
        f'{episode.where()} duplicates episode_idx {episode.episode_idx} of '
        f'record {other[1]} of {other[0]}',
      )
    found[episode.episode_idx] = (
      part.name,
      episode.record,
      episode.checkpoint_idx,
      episode.num_steps,
      episode.terminal,
      episode.episode_return,
      None
      if episode.unclipped_rewards is None
      else float(np.sum(episode.unclipped_rewards, dtype=np.float64)),
    )


def summarize_run(
  kind: str,
  location: str,
  parts: Sequence[Any],
  open_part: Callable[[Any], Iterator[rlu_episodes.Episode]],
  verify: bool = False,
) -> 'RunSummary':
  """Summarises a run's parts.

  Args:
    kind: str, 'rlu' or 'tfds' (for the report).
    location: str, directory of the parts.
    parts: list of objects with `name` and `num_bytes`.
    open_part: callable(part) -> iterator of rlu_episodes.Episode.
    verify: bool, also decode every frame.

  Returns:
    RunSummary; problems are collected, never raised.
  """
  summary = RunSummary(location=location, kind=kind, verified=verify)
  scratch = np.empty((_DECODE_ROWS,) + rlu_episodes.FRAME_SHAPE, np.uint8)
  found = {}
  bar = progress.bar(
    sum(p.num_bytes for p in parts), 'reading', unit='B', unit_scale=True
  )
  try:
    for part in parts:
      summary.parts.append(PartSummary(part.name, part.num_bytes))
      if bar.disable:
        logging.info('Reading %s (%d bytes)', part.name, part.num_bytes)
      try:
        _read_part(open_part, part, verify, scratch, found, summary)
      except CheckpointError as error:
        summary.parts[-1].ok = False
        summary.problems.append(summaries.Problem(error.path, error.problem))
      bar.update(part.num_bytes)
  finally:
    bar.close()
  by_checkpoint, game_returns = {}, {}
  for episode_idx in sorted(found):
    name, _, checkpoint, steps, terminal, episode_return, game = found[
      episode_idx
    ]
    entry = by_checkpoint.setdefault(checkpoint, CheckpointEpisodes(checkpoint))
    if name not in entry.parts:
      entry.parts.append(name)
    entry.episodes += 1
    entry.steps += steps
    entry.terminal += terminal
    entry.returns = entry.returns or []
    entry.returns.append(episode_return)
    game_returns.setdefault(checkpoint, []).append(game)
  for checkpoint, entry in by_checkpoint.items():
    entry.returns = summaries.EpisodeStats.from_returns(entry.returns)
    if None not in game_returns[checkpoint]:
      entry.game_returns = summaries.EpisodeStats.from_returns(
        game_returns[checkpoint]
      )
  summary.checkpoints = [by_checkpoint[c] for c in sorted(by_checkpoint)]
  if not found and not summary.problems:
    summary.problems.append(summaries.Problem(location, 'holds no episode'))
  return summary
