"""One loaded checkpoint window that samples exactly like Dopamine.

A `ReplayShard` holds rows [start, start + count) of one checkpoint and
answers `sample_transition_batch`, `get_transition_elements` and
`is_valid_transition` as Dopamine's `OutOfGraphReplayBuffer` loaded with the
whole file would, for every row it considers valid. Indices are file rows.
All work is vectorized over the batch.
"""

import collections
import math

import numpy as np

from fixed_replay.dataset import validity
from fixed_replay.replay import stacking

# Same fields as Dopamine's circular_replay_buffer.ReplayElement, so either
# kind can describe our elements.
ReplayElement = collections.namedtuple('shape_type', ['name', 'shape', 'type'])

SUFFIX_ELEMENT = 'suffix'


def transition_elements(
  batch_size,
  observation_shape,
  stack_size,
  observation_dtype,
  terminal_dtype=np.uint8,
  action_shape=(),
  action_dtype=np.int32,
  reward_shape=(),
  reward_dtype=np.float32,
  extra_storage_types=(),
):
  """Returns Dopamine's transition signature plus the checkpoint suffix.

  The elements and their order are those of Dopamine's
  `OutOfGraphReplayBuffer.get_transition_elements`, followed by `suffix`
  (int32: the checkpoint each transition comes from), so code that unpacks
  Dopamine's tuple by position keeps working.
  """
  state_shape = (batch_size,) + tuple(observation_shape) + (stack_size,)
  elements = [
    ReplayElement('state', state_shape, observation_dtype),
    ReplayElement('action', (batch_size,) + action_shape, action_dtype),
    ReplayElement('reward', (batch_size,) + reward_shape, reward_dtype),
    ReplayElement('next_state', state_shape, observation_dtype),
    ReplayElement('next_action', (batch_size,) + action_shape, action_dtype),
    ReplayElement('next_reward', (batch_size,) + reward_shape, reward_dtype),
    ReplayElement('terminal', (batch_size,), terminal_dtype),
    ReplayElement('indices', (batch_size,), np.int32),
  ]
  for element in extra_storage_types or ():
    elements.append(
      ReplayElement(
        element.name, (batch_size,) + tuple(element.shape), element.type
      )
    )
  elements.append(ReplayElement(SUFFIX_ELEMENT, (batch_size,), np.int32))
  return elements


def empty_batch(elements):
  """Returns a dict of freshly allocated arrays for the given elements."""
  return {e.name: np.empty(e.shape, dtype=e.type) for e in elements}


class ReplayShard:
  """Rows of one checkpoint, sampled with Dopamine's transition semantics."""

  def __init__(
    self, window, stack_size, update_horizon, gamma, valid_rows=None
  ):
    """Builds the shard and its table of valid rows.

    Args:
      window: checkpoints.CheckpointWindow.
      stack_size: int, frames per state.
      update_horizon: int, n of the n-step return.
      gamma: float, discount.
      valid_rows: optional sorted int array, the window's valid file rows
        when already known (e.g. precomputed in a compact store); computed
        from the window when None.
    """
    self.window = window
    self.suffix = window.suffix
    self._stack_size = stack_size
    self._update_horizon = update_horizon
    self._store = window.store
    self._terminal = window.store['terminal']
    if valid_rows is None:
      valid_rows = validity.valid_rows(
        self._terminal,
        window.start,
        window.num_file_rows,
        window.add_count,
        window.invalid_range,
        window.episode_end_indices,
        stack_size,
        update_horizon,
      )
    self.valid_rows = valid_rows
    # A full file read whole is circular, exactly as in Dopamine.
    self._circular = window.is_full and window.num_rows == window.num_file_rows
    # Same float32 discounts as Dopamine, so n-step sums match bit for bit.
    self._discounts = np.array(
      [math.pow(gamma, k) for k in range(update_horizon)], dtype=np.float32
    )
    self._stack_offsets = np.arange(1 - stack_size, 1)
    self._horizon_offsets = np.arange(update_horizon)

  @property
  def num_valid(self):
    return len(self.valid_rows)

  @property
  def nbytes(self):
    return self.window.nbytes + self.valid_rows.nbytes

  def is_valid_transition(self, index):
    """Returns True if file row `index` may be sampled from this shard."""
    position = np.searchsorted(self.valid_rows, index)
    return bool(
      position < len(self.valid_rows) and self.valid_rows[position] == index
    )

  def check_indices(self, indices):
    """Raises ValueError unless every file row in `indices` is valid here."""
    indices = np.asarray(indices, dtype=np.int64)
    positions = np.searchsorted(self.valid_rows, indices)
    positions = np.minimum(positions, max(len(self.valid_rows) - 1, 0))
    bad = (
      indices
      if not len(self.valid_rows)
      else indices[self.valid_rows[positions] != indices]
    )
    if len(bad):
      raise ValueError(
        f'Rows {bad[:10].tolist()} of checkpoint {self.suffix} are not valid '
        f'transitions in the loaded window [{self.window.start}, '
        f'{self.window.start + self.window.num_rows})'
      )

  def _to_window(self, rows):
    """Maps file rows (any shape) to positions in the window's arrays."""
    if self._circular:
      return rows % self.window.num_file_rows
    return rows - self.window.start

  def write_transitions(self, indices, batch, destinations):
    """Writes the transitions at file rows `indices` into `batch`.

    Args:
      indices: int array (b,) of valid file rows.
      batch: dict of element name to batch array (see transition_elements).
      destinations: int array (b,), positions in the batch arrays.
    """
    state_rows, next_rows = self.write_transition_parts(
      indices, batch, destinations
    )
    stacking.gather_state_pairs(
      self._store['observation'],
      state_rows,
      next_rows,
      batch['state'],
      batch['next_state'],
      destinations,
    )

  def write_transition_parts(self, indices, batch, destinations):
    """Writes every element but the two states; says where their frames are.

    A store that keeps its frames elsewhere (compressed blocks) calls this
    and gathers the stacks itself.

    Args:
      indices: int array (b,) of valid file rows.
      batch: dict of element name to batch array (see transition_elements).
      destinations: int array (b,), positions in the batch arrays.

    Returns:
      (state_rows, next_state_rows): int64 arrays (b, stack_size), window
      positions of the frames of each state, oldest first.
    """
    file_rows = np.asarray(indices, dtype=np.int64)
    rows = self._to_window(file_rows)
    trajectory = self._to_window(file_rows[:, None] + self._horizon_offsets)
    trajectory_terminals = self._terminal[trajectory].astype(bool)
    is_terminal = trajectory_terminals.any(axis=1)
    # The trajectory stops after its first terminal, as in Dopamine.
    length = np.where(
      is_terminal, trajectory_terminals.argmax(axis=1) + 1, self._update_horizon
    )
    in_trajectory = self._horizon_offsets < length[:, None]
    rewards = self._store['reward'][trajectory]
    discounted = self._discounts * rewards * in_trajectory
    next_file_rows = file_rows + length
    next_rows = self._to_window(next_file_rows)

    batch['reward'][destinations] = discounted.sum(axis=1)
    batch['action'][destinations] = self._store['action'][rows]
    batch['next_action'][destinations] = self._store['action'][next_rows]
    batch['next_reward'][destinations] = self._store['reward'][next_rows]
    batch['terminal'][destinations] = is_terminal
    batch['indices'][destinations] = indices
    batch[SUFFIX_ELEMENT][destinations] = self.suffix
    for name, array in self._store.items():
      if name not in ('observation', 'action', 'reward', 'terminal'):
        if name in batch:
          batch[name][destinations] = array[rows]
    state_rows = self._to_window(file_rows[:, None] + self._stack_offsets)
    next_state_rows = self._to_window(
      next_file_rows[:, None] + self._stack_offsets
    )
    return state_rows, next_state_rows
