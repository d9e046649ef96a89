"""Dopamine's transition semantics over one or more checkpoint windows.

`transition_elements` is the signature every buffer returns. `RowLayout`
places file rows of one or more checkpoint windows in arrays that hold the
windows end to end, with each window's own rule: a full file read whole wraps
around, as Dopamine's circular buffer does; any other window is offset. The
`TransitionWriter` then computes, for a minibatch mixing any of those
checkpoints in one vectorized pass, every element but the frames (n-step
discounted reward, terminal, next action, ...) and says where the frames of
each state lie, so that whoever holds the frames (arrays in RAM, a block
cache) gathers them.
"""

import collections
import math

import numpy as np

# Same fields as Dopamine's circular_replay_buffer.ReplayElement, so either
# kind can describe our elements.
ReplayElement = collections.namedtuple('shape_type', ['name', 'shape', 'type'])

SUFFIX_ELEMENT = 'suffix'
# Elements with their own rule below; any other stored array is copied.
_STANDARD = ('observation', 'action', 'reward', 'terminal')


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


def is_circular(window):
  """Whether a window is a full file read whole (wraps, as in Dopamine)."""
  return window.is_full and window.num_rows == window.num_file_rows


class RowLayout:
  """Where file rows of each window lie in arrays holding them end to end."""

  def __init__(self, windows):
    """Records each window's place and rule.

    Args:
      windows: sequence of checkpoints.CheckpointWindow, in their order in
        the arrays.
    """
    counts = np.array([w.num_rows for w in windows], dtype=np.int64)
    self.offsets = np.cumsum(counts) - counts
    self.starts = np.array([w.start for w in windows], dtype=np.int64)
    self.file_rows = np.array([w.num_file_rows for w in windows], np.int64)
    self.circular = np.array([is_circular(w) for w in windows], dtype=bool)
    self.suffixes = np.array([w.suffix for w in windows], dtype=np.int32)
    self.num_rows = int(counts.sum())

  def locate(self, which, file_rows):
    """Positions in the arrays of `file_rows` (b,) or (b, k) of `which` (b,)."""
    if len(self.offsets) == 1:  # One window: no per-row lookups.
      if self.circular[0]:
        return file_rows % self.file_rows[0]
      return file_rows - self.starts[0]
    if file_rows.ndim > 1:
      which = which[:, None]
    local = np.where(
      self.circular[which],
      file_rows % self.file_rows[which],
      file_rows - self.starts[which],
    )
    return local + self.offsets[which]

  def file_rows_of(self, which, positions):
    """The file rows at array `positions` (b, k) of windows `which` (b,)."""
    # A circular window starts at file row 0, so one rule serves both.
    return positions + (self.starts - self.offsets)[which][:, None]


class TransitionWriter:
  """Writes transitions as Dopamine's OutOfGraphReplayBuffer returns them."""

  def __init__(self, arrays, layout, stack_size, update_horizon, gamma):
    """Keeps the arrays and the n-step constants.

    Args:
      arrays: dict of element name to array of the windows' rows end to end
        (action, reward, terminal and any extra element; frames not needed).
      layout: RowLayout of those windows.
      stack_size: int, frames per state.
      update_horizon: int, n of the n-step return.
      gamma: float, discount.
    """
    self.layout = layout
    self._arrays = arrays
    self._terminal = arrays['terminal']
    self._update_horizon = update_horizon
    # Same float32 discounts as Dopamine, so n-step sums match bit for bit.
    self._discounts = np.array(
      [math.pow(gamma, k) for k in range(update_horizon)], dtype=np.float32
    )
    self._stack_offsets = np.arange(1 - stack_size, 1)
    self._horizon_offsets = np.arange(update_horizon)

  def write_parts(self, which, indices, batch, destinations):
    """Writes every element but the two states; says where their frames are.

    Args:
      which: int array (b,), the window of each transition.
      indices: int array (b,) of valid file rows.
      batch: dict of element name to batch array (see transition_elements).
      destinations: int array (b,), positions in the batch arrays.

    Returns:
      (state_rows, next_state_rows): int64 arrays (b, stack_size), positions
      in the arrays of the frames of each state, oldest first.
    """
    locate = self.layout.locate
    file_rows = np.asarray(indices, dtype=np.int64)
    rows = locate(which, file_rows)
    trajectory = locate(which, file_rows[:, None] + self._horizon_offsets)
    trajectory_terminals = self._terminal[trajectory].astype(bool)
    is_terminal = trajectory_terminals.any(axis=1)
    # The trajectory stops after its first terminal, as in Dopamine.
    length = np.where(
      is_terminal, trajectory_terminals.argmax(axis=1) + 1, self._update_horizon
    )
    in_trajectory = self._horizon_offsets < length[:, None]
    rewards = self._arrays['reward'][trajectory]
    discounted = self._discounts * rewards * in_trajectory
    next_file_rows = file_rows + length
    next_rows = locate(which, next_file_rows)

    batch['reward'][destinations] = discounted.sum(axis=1)
    batch['action'][destinations] = self._arrays['action'][rows]
    batch['next_action'][destinations] = self._arrays['action'][next_rows]
    batch['next_reward'][destinations] = self._arrays['reward'][next_rows]
    batch['terminal'][destinations] = is_terminal
    batch['indices'][destinations] = indices
    batch[SUFFIX_ELEMENT][destinations] = self.layout.suffixes[which]
    for name, array in self._arrays.items():
      if name not in _STANDARD and name in batch:
        batch[name][destinations] = array[rows]
    state_rows = locate(which, file_rows[:, None] + self._stack_offsets)
    next_state_rows = locate(
      which, next_file_rows[:, None] + self._stack_offsets
    )
    return state_rows, next_state_rows
