"""Segments for sequence models: K consecutive steps of one episode.

Decision Transformer and its followers train on segments, not transitions:
K consecutive steps of one episode, each with its frame stack, action,
reward, return-to-go and timestep. Their Atari loaders build segments by
loading whole checkpoints through batch_rl's buffer and keeping every stacked
state in a Python list, some 14 GB for 500k steps. `SegmentSampler` draws them
from the same buffers as the transition samplers instead, so a whole run of a
compact store is sampled in the RAM its buffer takes, plus one float a row
for the returns-to-go.

What a segment is, exactly:

* Its steps are consecutive rows of one checkpoint in the order they were
  written (a full file read whole wraps around its end, as Dopamine's circular
  buffer does). Each is a valid transition by Dopamine's rules (update_horizon
  1), and all lie in one episode. An episode ends at a terminal row or at a
  row of the file's episode_end_indices (a cut without a terminal).
* A step's `observation` is Dopamine's state for its row, so a segment's
  K + stack_size - 1 frames are read (or decoded) once each, not per step.
* `return_to_go` is the undiscounted sum of the rewards from the step's row to
  its episode's last row. An episode whose end is not in the window has no
  known return, so no segment comes from it.
* `timestep` counts steps from the episode's first. An episode that began
  before the window (the oldest of a full checkpoint, whose start was
  overwritten, or one cut by replay_transitions_start_index) has no known
  first step. It is left out unless `keep_cut_episodes`, which counts from its
  first step in the window, as Decision Transformer's loader does.
"""

import collections
import sys
import time
from typing import Any

from absl import logging
import numpy as np

from fixed_replay import batches
from fixed_replay import progress
from fixed_replay import stream_state
from fixed_replay.io import spill
from fixed_replay.replay import batch_kernels
from fixed_replay.replay import transitions


class _CheckpointSteps:
  """One loaded window's steps in time order, and its runs of segment steps.

  Time t is the row's place in writing order: position (t + shift) % rows of
  the window's arrays. A run is a maximal span of consecutive times that are
  steps of one usable episode.
  """

  def __init__(self, shard, keep_cut_episodes, return_to_go_from):
    window = shard.window
    self.shard = shard
    self.rows = rows = window.num_rows
    self.start = window.start
    circular = transitions.is_circular(window)
    self.shift = window.cursor if circular else 0
    order = (np.arange(rows) + self.shift) % rows
    ends = window.store['terminal'].astype(bool)
    if window.episode_end_indices is not None:
      cut = np.asarray(window.episode_end_indices, np.int64) - window.start
      ends[cut[(cut >= 0) & (cut < rows)]] = True
    # Rows past a writer's cursor were never written: no data, no ends.
    ends[max(window.add_count - window.start, 0) :] = False
    ends = ends[order]
    # Episodes begin after an end, and where the window's history begins or
    # breaks: at its first row (the writer's first unless the file is full
    # or the window offset) and at the cursor inside a partial window of a
    # full file. Those begin at an unknown step.
    begins = np.zeros(rows, bool)
    begins[1:] = ends[:-1]
    cut_start = np.zeros(rows, bool)
    cut_start[0] = window.is_full or window.start > 0
    begins[0] = True
    inside = window.cursor - window.start
    if window.is_full and not circular and 0 < inside < rows:
      begins[inside] = cut_start[inside] = True
    firsts = np.flatnonzero(begins)
    lasts = np.append(firsts[1:], rows) - 1
    episode = np.cumsum(begins) - 1
    usable = ends[lasts] & (keep_cut_episodes | ~cut_start[firsts])
    valid = np.zeros(rows, bool)
    valid[shard.valid_rows - window.start] = True
    step = valid[order] & usable[episode]
    # Sums of the rewards from each time to the window's end, less those
    # after the episode's last row (float64, rounded once). Rows of other
    # episodes count as 0, chosen before the cast: past a writer's cursor
    # they hold no data at all (Dopamine's np.empty: any bits, and a
    # signalling NaN among them made the cast warn).
    reward = np.where(
      usable[episode], window.store[return_to_go_from][order], 0
    ).astype(np.float64)
    after = np.append(np.cumsum(reward[::-1])[::-1], 0.0)
    self.return_to_go = spill.copy(
      (after[:-1] - after[lasts[episode] + 1]).astype(np.float32)
    )
    same_next = np.zeros(rows, bool)
    same_next[:-1] = step[1:] & step[:-1] & ~begins[1:]
    self.first = np.flatnonzero(step & ~np.roll(same_next, 1))
    self.last = np.flatnonzero(step & ~same_next)
    run_episode = episode[self.first]
    # An episode's timestep 0 is its first step (its padding rows, stacks
    # across the previous episode, are not valid transitions).
    self.origin = self.first[np.searchsorted(run_episode, run_episode)]
    self.num_episodes = len(np.unique(run_episode))


class ReusedBatches:
  """Batch arrays that reuse the memory of earlier batches nobody holds.

  A batch of 128 Atari segments of 30 steps holds 108 MB of stacks: fresh,
  malloc maps it anew and the kernel faults it in page by page, a third of
  the batch's CPU time. An earlier batch's arrays are reused instead once
  this allocator holds the only reference to each of them, so a batch (or
  any view or tensor of it) still held elsewhere is never overwritten.
  """

  def __init__(self, depth=3):
    self._held = collections.deque(maxlen=depth)

  def __call__(self, elements):
    for held_elements, arrays in self._held:
      # References: the dict's, the loop variable's, getrefcount's own.
      if held_elements == elements and all(
        sys.getrefcount(a) == 3 for a in arrays.values()
      ):
        return dict(arrays)
    arrays = transitions.empty_batch(elements)
    self._held.append((elements, arrays))
    return dict(arrays)


class SegmentSampler:
  """Draws batches of segments from any directory the buffers read.

  Example:

    sampler = SegmentSampler('/data/Pong/1/replay_logs', segment_length=30,
                             batch_size=128, seed=0)
    batch = sampler.sample()
    batch['observation']   # uint8 (128, 30, 84, 84, 4)
    batch['return_to_go']  # float32 (128, 30)

  A batch is {name: array}: `observation` (B, K, *observation_shape, stack),
  `action`, `reward` and `terminal` (B, K) (with the buffer's dtypes, and any
  extra storage element), `return_to_go` float32 (B, K), `timestep` int32
  (B, K), `mask` bool (B, K) (False on padding), and where each step came
  from: `indices` int32 (B, K), its file row (-1 on padding), and `suffix`
  int32 (B,), the checkpoint.
  """

  def __init__(
    self,
    data_dir: str,
    segment_length: int = 30,
    batch_size: int = 128,
    seed: int | None = None,
    pad_short: bool = False,
    uniform_over: str = 'starts',
    keep_cut_episodes: bool = False,
    return_to_go_from: str = 'reward',
    **buffer_arguments: Any,
  ):
    """Opens the buffer (so a bad path or argument fails here).

    Args:
      data_dir: str, Dopamine checkpoints (local or gs://) or a compact store.
      segment_length: int K >= 1, steps a segment.
      batch_size: int B >= 1, segments a batch.
      seed: int or None, seeds the draws (and the buffer's choice of
        checkpoints).
      pad_short: bool. False: every segment has K steps, so an episode
        shorter than K is never drawn. True: a segment may start at any step
        and runs to at most its episode's last step; the steps after that are
        zeros with `mask` False.
      uniform_over: 'starts' (every possible first step equally likely, so
        long episodes give more segments) or 'episodes' (an episode first,
        then a first step in it).
      keep_cut_episodes: bool, also draw from episodes that began before the
        window, counting `timestep` from their first step in it (Decision
        Transformer's way).
      return_to_go_from: 'reward' (the stored, usually clipped, reward) or an
        extra storage element such as 'unclipped_reward' (the game score,
        which conversions of RL Unplugged keep); it is added to
        extra_storage_types when missing.
      **buffer_arguments: FixedReplayBuffer's arguments, with its meanings
        (observation_shape, stack_size, replay_capacity, num_buffers_to_load,
        replay_file_start_index, subsample, memory_budget, ...);
        update_horizon must be 1 if given.

    Raises:
      CheckpointError, ValueError, TypeError, MemoryError: the buffer's own
        errors, or ValueError for arguments out of range.
    """
    if segment_length < 1 or batch_size < 1:
      raise ValueError(
        f'segment_length and batch_size must be >= 1, got {segment_length} '
        f'and {batch_size}'
      )
    if uniform_over not in ('starts', 'episodes'):
      raise ValueError(
        f"uniform_over must be 'starts' or 'episodes', got {uniform_over!r}"
      )
    if buffer_arguments.get('update_horizon', 1) not in (1, None):
      raise ValueError(
        'a segment is consecutive steps: update_horizon must be 1, got '
        f'{buffer_arguments["update_horizon"]}'
      )
    extras = list(buffer_arguments.get('extra_storage_types') or ())
    if return_to_go_from != 'reward' and return_to_go_from not in {
      e.name for e in extras
    }:
      extras.append(
        transitions.ReplayElement(return_to_go_from, (), np.float32)
      )
    self.data_dir = str(data_dir)
    self.segment_length = int(segment_length)
    self.batch_size = int(batch_size)
    self.pad_short = bool(pad_short)
    self.uniform_over = uniform_over
    self.keep_cut_episodes = bool(keep_cut_episodes)
    self.return_to_go_from = return_to_go_from
    self._rng = np.random.default_rng(seed)
    self.buffer = batches.open_buffer(
      self.data_dir,
      {
        **buffer_arguments,
        'update_horizon': 1,
        'seed': seed,
        'sampling_threads': 0,
        'extra_storage_types': extras,
      },
    )
    # Where batches are written (see ReplayCore.allocate_batch).
    self.allocate_batch = ReusedBatches()
    row = self.buffer.get_transition_elements(1)
    self._stack_size = row[0].shape[-1]
    # Per-row arrays copied as they are: action, reward, terminal, extras.
    self._copied = [
      e
      for e in row
      if e.name not in ('state', 'next_state', 'next_action', 'next_reward')
      and e.name not in ('indices', transitions.SUFFIX_ELEMENT)
    ]
    self._observation = row[0]
    self._source = None
    self._steps = {}
    self._index()

  def get_transition_elements(self, batch_size: int | None = None) -> tuple:
    """The elements of a batch (transitions.ReplayElement), in order."""
    b = self.batch_size if batch_size is None else batch_size
    per_step = (b, self.segment_length)
    o = self._observation
    return (
      transitions.ReplayElement('observation', per_step + o.shape[1:], o.type),
      *(
        transitions.ReplayElement(e.name, per_step + e.shape[1:], e.type)
        for e in self._copied
      ),
      transitions.ReplayElement('return_to_go', per_step, np.float32),
      transitions.ReplayElement('timestep', per_step, np.int32),
      transitions.ReplayElement('mask', per_step, np.bool_),
      transitions.ReplayElement('indices', per_step, np.int32),
      transitions.ReplayElement(transitions.SUFFIX_ELEMENT, (b,), np.int32),
    )

  def _index(self):
    """The loaded checkpoints' runs, rebuilt when the buffer swaps them.

    Returns:
      (runs, ends): runs is a dict of arrays, one entry a run (checkpoint
      position, first, last, origin); ends is the cumulative count of the
      segments each run starts.
    """
    source = self.buffer.source
    if source is self._source:
      return self._runs
    began = time.monotonic()
    table = source.table
    steps = {}
    with progress.bar(len(table), 'Indexing episodes', 'checkpoint') as bar:
      for i, suffix in enumerate(table.suffixes):
        shard = source.shard(i)
        known = self._steps.get(suffix)
        if known is None or known.shard is not shard:
          known = _CheckpointSteps(
            shard, self.keep_cut_episodes, self.return_to_go_from
          )
        steps[suffix] = known
        bar.update()
    self._steps = steps
    ordered = [steps[s] for s in table.suffixes]
    runs = {
      'which': np.concatenate(
        [np.full(len(c.first), i) for i, c in enumerate(ordered)]
      ).astype(np.int64),
      **{
        name: np.concatenate([getattr(c, name) for c in ordered])
        for name in ('first', 'last', 'origin')
      },
    }
    length = runs['last'] - runs['first'] + 1
    if self.pad_short:
      runs['count'] = length
    else:
      runs['count'] = np.maximum(length - self.segment_length + 1, 0)
    ends = np.cumsum(runs['count'])
    if not len(ends) or not ends[-1]:
      raise ValueError(
        f'{self.data_dir}: no segment of {self.segment_length} steps in the '
        f'loaded checkpoints {table.suffixes} (episodes that end in their '
        f'window: {sum(c.num_episodes for c in ordered)}); use a shorter '
        'segment_length, pad_short=True or keep_cut_episodes=True'
      )
    logging.info(
      'Segments of %d steps over %d checkpoint(s) of %s: %d episodes, %s '
      'segment starts (%.1f s to index)',
      self.segment_length,
      len(ordered),
      self.data_dir,
      sum(c.num_episodes for c in ordered),
      f'{int(ends[-1]):,}',
      time.monotonic() - began,
    )
    # Where each checkpoint's times lie in its arrays, per run, so that a
    # batch looks them up once.
    for name in ('shift', 'rows', 'start'):
      runs[name] = np.array([getattr(c, name) for c in ordered])[runs['which']]
    self._source, self._runs = source, (runs, ends)
    return self._runs

  def _draw(self, runs, ends, count):
    """(run, first time) of `count` segments."""
    if self.uniform_over == 'starts':
      drawn = self._rng.integers(0, ends[-1], count)
      run = np.searchsorted(ends, drawn, side='right')
      return run, runs['first'][run] + drawn - (ends[run] - runs['count'][run])
    run = self._rng.choice(np.flatnonzero(runs['count']), count)
    return run, runs['first'][run] + self._rng.integers(runs['count'][run])

  def sample(self, batch_size: int | None = None) -> dict[str, np.ndarray]:
    """A batch of segments as {name: array} (see the class docstring).

    Raises:
      CheckpointError: if a frame turns out damaged (names file and rows).
    """
    runs, ends = self._index()
    source = self._source
    b = self.batch_size if batch_size is None else batch_size
    k, stack = self.segment_length, self._stack_size
    run, first = self._draw(runs, ends, b)
    which = runs['which'][run]
    last = runs['last'][run][:, None]
    times = first[:, None] + np.arange(k)
    mask = times <= last
    times = np.minimum(times, last)
    steps = [self._steps[s] for s in source.table.suffixes]
    shift, rows, start = (
      runs[n][run][:, None] for n in ('shift', 'rows', 'start')
    )
    positions = (times + shift) % rows
    batch = self.allocate_batch(self.get_transition_elements(b))
    for i in np.unique(which):
      members = which == i
      store = steps[i].shard.window.store
      at = positions[members]
      for element in self._copied:
        batch[element.name][members] = store[element.name][at]
      batch['return_to_go'][members] = steps[i].return_to_go[times[members]]
    batch['timestep'][:] = times - runs['origin'][run][:, None]
    batch['mask'][:] = mask
    batch['indices'][:] = positions + start
    batch[transitions.SUFFIX_ELEMENT][:] = source.table.suffix_array[which]
    # The frames of the whole segment, each once: its first step's stack
    # and every later step's newest frame.
    frame_times = np.minimum(first[:, None] + np.arange(1 - stack, k), last)
    frames, where = source.read_frames(
      np.repeat(which, k + stack - 1),
      ((frame_times + shift) % rows + start).reshape(-1),
    )
    stacks = np.lib.stride_tricks.sliding_window_view(
      where.reshape(b, k + stack - 1), stack, axis=1
    )
    observation = batch['observation']
    batch_kernels.gather_stacks(
      frames,
      stacks.reshape(b * k, stack),
      observation.reshape((b * k,) + observation.shape[2:]),
      np.arange(b * k),
    )
    if self.pad_short and not mask.all():
      for name, array in batch.items():
        if name != 'mask' and array.ndim > 1:
          array[~mask] = -1 if name == 'indices' else 0
    return batch

  def batches(self, num_batches: int | None = None):
    """Yields `num_batches` (None: endless) batches of segments."""
    return batches.repeated(self.sample, num_batches)

  def reload_buffer(self) -> None:
    """Swaps in the buffer's next set of checkpoints (when it loads sets)."""
    self.buffer.reload_buffer()

  def state_dict(self) -> dict:
    """The stream's place (plain numbers; see ReplayCore.state_dict)."""
    return {
      'rng': stream_state.place(self._rng),
      'buffer': self.buffer.state_dict(),
    }

  def load_state_dict(self, state: dict) -> None:
    """Continues the stream from the place `state_dict()` gave."""
    self.buffer.load_state_dict(state['buffer'])
    stream_state.move(self._rng, state['rng'])

  def close(self) -> None:
    """Closes the buffer."""
    self.buffer.close()
