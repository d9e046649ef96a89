"""Dumps a real Dopamine replay buffer as checkpoints, at scheduled rows.

Like batch_rl's logged replay buffer, the buffer (capacity checkpoint_rows)
is dumped whenever `add_count % checkpoint_rows == cursor`; unlike it, also
when that row falls inside an episode's padding rows, so every checkpoint has
exactly the chosen cursor. Each dump is written with Dopamine's own `save()`
into a staging directory, then moved to its final names (bookkeeping files
last), so an interrupted run never leaves a half-written file under a
checkpoint name.
"""

import dataclasses
import os
import time
from typing import Any

from absl import logging
import numpy as np

from fixed_replay.sources.dopamine import environments
from fixed_replay.sources.dopamine import file_names

STAGING_PREFIX = '.staging.'
# Large enough that Dopamine's save() never deletes an older checkpoint.
_NEVER_DELETE = 2**62
# Moved last, so that a suffix looks complete only once its arrays are there.
_BOOKKEEPING_NAMES = ('add_count', 'invalid_range', 'episode_end_indices')


@dataclasses.dataclass(frozen=True)
class CheckpointSummary:
  """One written checkpoint.

  Attributes:
    suffix: int.
    add_count: int, rows ever added (padding included) when it was dumped.
    episodes: int, episodes that ended since the previous checkpoint.
    mean_return: float or None, their mean undiscounted, unclipped return.
    save_seconds: float, time spent in Dopamine's save() and moving files.
  """

  suffix: int
  add_count: int
  episodes: int
  mean_return: float
  save_seconds: float


def _array_name(name):
  """'add_count' of 'add_count_ckpt.3.gz'; other names unchanged."""
  parsed = file_names.parse(name)
  return parsed[0] if parsed else name


class CheckpointWriter:
  """Dumps a Dopamine replay buffer at the scheduled add counts.

  Dump k happens when add_count == first_dump + k * checkpoint_rows and is
  written with the buffer's own save() into output_dir/.staging.k, whose files
  are then moved to output_dir.
  """

  def __init__(
    self,
    output_dir: str,
    checkpoint_rows: int,
    cursor: int,
    num_checkpoints: int,
    keep_episode_end_indices: bool,
  ) -> None:
    self._output_dir = output_dir
    self._rows = checkpoint_rows
    self._first_dump = cursor if cursor > 0 else checkpoint_rows
    self._num_checkpoints = num_checkpoints
    self._keep_episode_end_indices = keep_episode_end_indices
    self.buffer = None
    self.written = []
    self.episode_returns = []
    self.episode_lengths = []
    self._episodes_at_last_dump = 0

  @property
  def total_rows(self) -> int:
    """add_count at the last dump."""
    return self._first_dump + (self._num_checkpoints - 1) * self._rows

  @property
  def done(self) -> bool:
    return len(self.written) == self._num_checkpoints

  def after_row(self) -> None:
    """Called by the buffer after each row it writes, padding included."""
    add_count = int(self.buffer.add_count)
    due = self._first_dump + len(self.written) * self._rows
    if add_count == due and not self.done:
      self._dump(add_count)

  def _dump(self, add_count) -> None:
    suffix = len(self.written)
    start = time.time()
    staging = os.path.join(self._output_dir, f'{STAGING_PREFIX}{suffix}')
    os.makedirs(staging)
    self.buffer.save(staging, suffix)
    names = sorted(
      os.listdir(staging),
      key=lambda n: (_array_name(n) in _BOOKKEEPING_NAMES, n),
    )
    for name in names:
      source = os.path.join(staging, name)
      is_ends = _array_name(name) == file_names.EPISODE_END_INDICES
      if is_ends and not self._keep_episode_end_indices:
        os.remove(source)  # The published layout has no such file.
      else:
        os.replace(source, os.path.join(self._output_dir, name))
    os.rmdir(staging)
    returns = self.episode_returns[self._episodes_at_last_dump :]
    self._episodes_at_last_dump = len(self.episode_returns)
    summary = CheckpointSummary(
      suffix=suffix,
      add_count=add_count,
      episodes=len(returns),
      mean_return=float(np.mean(returns)) if returns else None,
      save_seconds=time.time() - start,
    )
    self.written.append(summary)
    logging.info(
      'Wrote checkpoint %d/%d to %s: add_count %d, %d rows, %d episodes '
      'ended since the last checkpoint (mean return %s), saved in %.1f s',
      suffix + 1,
      self._num_checkpoints,
      self._output_dir,
      add_count,
      min(add_count, self._rows),
      len(returns),
      'n/a' if summary.mean_return is None else f'{summary.mean_return:.2f}',
      summary.save_seconds,
    )


def make_buffer(
  spec: environments.EnvironmentSpec,
  checkpoint_rows: int,
  writer: 'CheckpointWriter',
) -> Any:
  """A real Dopamine OutOfGraphReplayBuffer that reports every row written."""
  from dopamine.tf.replay_memory import circular_replay_buffer

  class _ReportingReplayBuffer(circular_replay_buffer.OutOfGraphReplayBuffer):
    """Dopamine's buffer, calling writer.after_row() after each row.

    add() writes the episode-start padding and the row in one call; hooking
    the per-row _add_transition lets a dump land exactly on its add_count
    even inside the padding. Only private attributes are added, so save()
    writes exactly the files Dopamine's own buffer writes.
    """

    def __init__(self, on_row, **kwargs) -> None:
      self._on_row = on_row
      super().__init__(**kwargs)

    def _create_storage(self) -> None:
      super()._create_storage()
      # Dopamine allocates with np.empty, so the rows past add_count of a
      # partial checkpoint would hold leftover memory: files would differ
      # between runs. np.zeros is allocated lazily, like np.empty.
      self._store = {
        name: np.zeros(array.shape, array.dtype)
        for name, array in self._store.items()
      }

    def _add_transition(self, transition) -> None:
      super()._add_transition(transition)
      self._on_row()

  return _ReportingReplayBuffer(
    writer.after_row,
    observation_shape=spec.observation_shape,
    stack_size=spec.stack_size,
    replay_capacity=checkpoint_rows,
    batch_size=32,
    observation_dtype=spec.observation_dtype,
    checkpoint_duration=_NEVER_DELETE,
  )
