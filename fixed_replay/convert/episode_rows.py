"""The rows Dopamine's replay buffer holds after `add`ing whole episodes.

Given one episode after another, Dopamine's `OutOfGraphReplayBuffer.add`
writes `stack_size - 1` all-zero rows before each episode (so that no state
stack reaches into the previous one), then one row per step: the frame, the
action, the clipped reward and the terminal flag. Every episode's last row
goes into `episode_end_indices`, an episode cut without terminal included
(`add(..., episode_end=True)`), so that no n-step transition crosses it.

Two more per-row arrays, which Dopamine would hold as extra storage
elements, keep what RL Unplugged records beyond those: `episode_idx`
(int32, the row's episode) and, when every episode of the checkpoint
records it, `unclipped_reward` (float32, the game's reward). Padding rows
hold 0 in both, as Dopamine's `add` writes zeros into every element of
them (after an episode cut without terminal they can be sampled).

EpisodeRows builds exactly those rows from validated episodes
(rlu_episodes.Episode), decoding frames into one reused slice buffer, and
chooses the bookkeeping so that Dopamine's own `load` of the result samples
those rows and nothing else: after the R rows added comes one more all-zero
row, `add_count` is R (the buffer is not full, its cursor on that last row)
and `invalid_range` is Dopamine's for that cursor in R + 1 rows. A full
buffer would be wrong: its cursor at row 0 would make the first step of the
first episode invalid, which Dopamine samples after the same `add`s.
"""

from collections.abc import Iterator
import concurrent.futures

import numpy as np

from fixed_replay.errors import CheckpointError
from fixed_replay.sources.dopamine import validity
from fixed_replay.sources.dopamine.file_names import EPISODE_IDX
from fixed_replay.sources.dopamine.file_names import UNCLIPPED_REWARD
from fixed_replay.sources.rlu import rlu_episodes

_MIN_FRAMES_PER_THREAD = 64


class EpisodeRows:
  """Accumulates Dopamine rows of episodes; yields frames in slices.

  Usage:
    rows = EpisodeRows(slice_rows, stack_size, update_horizon)
    for episode in episodes:            # strictly increasing episode_idx
      for frames in rows.add(episode):  # full slices (the buffer is reused)
        ...
    for frames in rows.finish():        # the rest, then the extra zero row
      ...
    arrays, add_count, invalid_range, episode_ends = rows.result()
  """

  def __init__(
    self,
    slice_rows: int,
    stack_size: int = 4,
    update_horizon: int = 1,
    threads: int = 1,
  ) -> None:
    self._frames = np.zeros((slice_rows,) + rlu_episodes.FRAME_SHAPE, np.uint8)
    self._filled = 0
    self._stack_size = stack_size
    self._update_horizon = update_horizon
    self._threads = max(1, threads)
    self._pool = None
    if self._threads > 1:
      self._pool = concurrent.futures.ThreadPoolExecutor(self._threads)
    self._actions, self._rewards, self._terminals = [], [], []
    self._unclipped, self._episode_rows = [], []
    self._all_unclipped = True
    self._ends = []
    self.num_rows = 0
    self.steps = 0
    self.episode_ids = []

  def _fill(self, count, write):
    """Yields full slices while appending `count` frames: write(i, out)
    fills `out` with frames i, i + 1, ... of them."""
    done = 0
    while done < count:
      take = min(count - done, len(self._frames) - self._filled)
      write(done, self._frames[self._filled : self._filled + take])
      self._filled += take
      done += take
      if self._filled == len(self._frames):
        yield self._frames
        self._filled = 0

  def _zeros(self, count):
    """Yields full slices while appending `count` all-zero frames."""
    return self._fill(count, lambda _, out: out.fill(0))

  def _decode(self, episode, start, out) -> None:
    parts = min(self._threads, len(out) // _MIN_FRAMES_PER_THREAD)
    if parts <= 1:
      rlu_episodes.decode_frames(episode, start, out)
      return
    bounds = np.linspace(0, len(out), parts + 1).astype(int)
    jobs = [
      self._pool.submit(
        rlu_episodes.decode_frames, episode, start + a, out[a:b]
      )
      for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    for job in jobs:
      job.result()

  def add(self, episode: rlu_episodes.Episode) -> Iterator[np.ndarray]:
    """Adds an episode; yields each slice of frames it completes."""
    if self.episode_ids and episode.episode_idx <= self.episode_ids[-1]:
      raise CheckpointError(
        episode.shard,
        f'{episode.where()} comes after episode {self.episode_ids[-1]}: '
        'episodes must be added in increasing episode_idx',
      )
    pad = self._stack_size - 1
    steps = episode.num_steps
    yield from self._zeros(pad)
    yield from self._fill(steps, lambda i, out: self._decode(episode, i, out))
    terminals = np.zeros(steps, np.uint8)
    terminals[-1] = episode.terminal
    self._actions += [np.zeros(pad, np.int32), episode.actions]
    self._rewards += [np.zeros(pad, np.float32), episode.rewards]
    self._terminals += [np.zeros(pad, np.uint8), terminals]
    self._episode_rows += [
      np.zeros(pad, np.int32),
      np.full(steps, episode.episode_idx, np.int32),
    ]
    if episode.unclipped_rewards is None:
      self._all_unclipped = False
    elif self._all_unclipped:
      self._unclipped += [np.zeros(pad, np.float32), episode.unclipped_rewards]
    self.num_rows += pad + steps
    self.steps += steps
    self._ends.append(self.num_rows - 1)
    self.episode_ids.append(episode.episode_idx)

  def finish(self) -> Iterator[np.ndarray]:
    """Yields the last frames, with the all-zero row after the last add."""
    yield from self._zeros(1)
    if self._filled:
      yield self._frames[: self._filled]
      self._filled = 0
    if self._pool is not None:
      self._pool.shutdown()

  def result(self) -> tuple[dict[str, np.ndarray], int, np.ndarray, np.ndarray]:
    """The small arrays and bookkeeping of the rows (after finish).

    Returns:
      (arrays, add_count, invalid_range, episode_end_indices): arrays maps
      'action' (int32), 'reward' (float32), 'terminal' (uint8),
      'episode_idx' (int32) and, if every episode had it, 'unclipped_reward'
      (float32) to one value per row; invalid_range and
      episode_end_indices are int64 rows.
    """
    added = self.num_rows
    capacity = added + 1
    arrays = {
      'action': np.concatenate(self._actions + [np.zeros(1, np.int32)]),
      'reward': np.concatenate(self._rewards + [np.zeros(1, np.float32)]),
      'terminal': np.concatenate(self._terminals + [np.zeros(1, np.uint8)]),
      EPISODE_IDX: np.concatenate(self._episode_rows + [np.zeros(1, np.int32)]),
    }
    if self._all_unclipped:
      arrays[UNCLIPPED_REWARD] = np.concatenate(
        self._unclipped + [np.zeros(1, np.float32)]
      )
    invalid_range = validity.cursor_invalid_rows(
      added, capacity, self._stack_size, self._update_horizon
    ).astype(np.int64)
    return arrays, added, invalid_range, np.array(self._ends, np.int64)
