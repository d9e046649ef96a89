"""The assembler: Dopamine's transition semantics, from stored rows to a batch.

`transition_elements` is the signature every buffer returns. `RowLayout`
places file rows of one or more checkpoint windows in arrays that hold the
windows end to end, with each window's own rule: a full file read whole wraps
around, as Dopamine's circular buffer does; any other window is offset. The
`TransitionAssembler` then computes, for a minibatch mixing any of those
checkpoints in one compiled pass, every element but the frames (n-step
discounted reward, terminal, next action, ...) and says where the frames of
each state lie, so that the storage holding the frames (arrays in RAM, a
store's units) gathers them (frame_sources.py). Which rows it is given is
the sampler's choice (samplers.py).

The assembler's per-transition math is one compiled call that releases the
GIL (batch_kernels.write_parts): done with a dozen small numpy operations
it held the GIL for some 55 us of a batch, which kept a second sampling
thread from scaling.
"""

import collections
import math

import numpy as np

from fixed_replay.replay import batch_kernels

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


def empty_batch(elements) -> dict:
  """Returns a dict of freshly allocated arrays for the given elements."""
  return {e.name: np.empty(e.shape, dtype=e.type) for e in elements}


def batch_bytes(elements) -> int:
  """Bytes of a batch of these elements (each element's whole shape)."""
  return sum(np.dtype(e.type).itemsize * math.prod(e.shape) for e in elements)


def is_circular(window) -> bool:
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
    # Position + shift = file row (a circular window starts at file row 0,
    # so one rule serves both).
    self.file_row_shift = self.starts - self.offsets
    # The same, one row a window, for the compiled assembler.
    self.table = np.stack(
      [self.offsets, self.starts, self.file_rows, self.circular, counts],
      axis=1,
    ).astype(np.int64)

  def file_rows_of(
    self, which: np.ndarray, positions: np.ndarray
  ) -> np.ndarray:
    """The file rows at array `positions` (b, k) of windows `which` (b,)."""
    return positions + self.file_row_shift[which][:, None]


def _rows_view(array):
  """A C-contiguous array as (rows, values per row), never a copy."""
  if not array.flags.c_contiguous:
    raise ValueError('batch and stored arrays must be C-contiguous')
  return array.reshape(len(array), -1)


def _kernel_array(array, rows):
  """`array` as the compiled assembler reads it: C-contiguous, of a dtype in
  batch_kernels.KINDS (another is converted: a copy), `rows` rows."""
  array = np.asarray(array)
  if len(array) != rows:
    raise ValueError(f'{len(array)} rows of an array of a {rows}-row window')
  if array.dtype not in batch_kernels.KINDS:
    array = array.astype(np.float64 if array.dtype.kind == 'f' else np.int64)
  return _rows_view(np.ascontiguousarray(array))


class TransitionAssembler:
  """Writes transitions as Dopamine's OutOfGraphReplayBuffer returns them."""

  def __init__(
    self, arrays, layout, stack_size, update_horizon, gamma, reward_dtype=None
  ):
    """Keeps the arrays and the n-step constants.

    Args:
      arrays: sequence of dicts, one a window of `layout`, of element name to
        the window's rows of it (action, reward, terminal and any extra
        element; frames not needed): views of arrays mapped from a store,
        in its dtype, or of arrays in memory.
      layout: RowLayout of those windows.
      stack_size: int, frames per state.
      update_horizon: int, n of the n-step return.
      gamma: float, discount.
      reward_dtype: the data's reward dtype, in which n-step sums are taken
        (a store's manifest says it); default: the first window's rewards'.

    Raises:
      ValueError: if an array does not hold its window's rows, or windows'
        rows hold different numbers of values.
    """
    self.layout = layout
    counts = layout.table[:, batch_kernels.ROWS]
    names = ('terminal', 'reward', 'action')
    self._arrays = [
      {n: _kernel_array(a[n], c) for n in names}
      for a, c in zip(arrays, counts, strict=True)
    ]  # Behind the addresses of `_columns`.
    column = lambda a: (a.ctypes.data, batch_kernels.KINDS.index(a.dtype))
    self._columns = np.array(
      [sum((column(a[n]) for n in names), ()) for a in self._arrays], np.int64
    ).reshape(len(self._arrays), 2 * len(names))
    self._values = {
      name: {a[name].shape[1] for a in self._arrays} for name in names[1:]
    }
    if any(len(v) > 1 for v in self._values.values()):
      raise ValueError(f'windows of different row shapes: {self._values}')
    self._extras = {
      name: [a[name] for a in arrays]
      for name in arrays[0]
      if name not in _STANDARD
    }
    self._reward = np.zeros(1, reward_dtype or arrays[0]['reward'].dtype)
    self.stack_size = stack_size
    self.update_horizon = update_horizon
    # Same float32 discounts as Dopamine, so n-step sums match bit for bit.
    self._discounts = np.array(
      [math.pow(gamma, k) for k in range(update_horizon)], dtype=np.float32
    )

  def write_parts(
    self,
    which: np.ndarray,
    indices: np.ndarray,
    batch: dict,
    destinations: np.ndarray,
  ) -> tuple[np.ndarray, np.ndarray]:
    """Writes every element but the two states; says where their frames are.

    Args:
      which: int array (b,), the window of each transition.
      indices: int array (b,) of valid file rows.
      batch: dict of element name to batch array (see transition_elements).
      destinations: int array (b,), positions in the batch arrays.

    Returns:
      (state_rows, next_state_rows): int64 arrays (b, stack_size), positions
      in the arrays of the frames of each state, oldest first.

    Raises:
      IndexError: if a window or row lies outside the arrays.
    """
    file_rows = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
    count = len(file_rows)
    destinations = np.ascontiguousarray(destinations, dtype=np.int64)
    if destinations.size and (
      destinations.min() < 0 or destinations.max() >= len(batch['indices'])
    ):
      raise IndexError(f'batch positions outside [0, {len(batch["indices"])})')
    for name, values in self._values.items():
      if values != {_rows_view(batch[name]).shape[1]}:  # Read unchecked.
        raise ValueError(f'{name}: rows of {values} values, batch differs')
    rows = np.empty(count, np.int64)
    state_rows = np.empty((count, self.stack_size), np.int64)
    next_state_rows = np.empty_like(state_rows)
    inside = batch_kernels.write_parts(
      self.layout.table,
      self.layout.suffixes,
      self._columns,
      self._discounts,
      self._reward,
      np.ascontiguousarray(which, dtype=np.int64),
      file_rows,
      destinations,
      _rows_view(batch['reward']),
      _rows_view(batch['action']),
      _rows_view(batch['next_action']),
      _rows_view(batch['next_reward']),
      batch['terminal'],
      batch['indices'],
      batch[SUFFIX_ELEMENT],
      rows,
      state_rows,
      next_state_rows,
    )
    if not inside:
      raise IndexError('transition rows outside the loaded windows')
    which = np.asarray(which, np.int64)
    for name, per_window in self._extras.items():
      if name in batch:
        for window in np.unique(which):
          members = which == window
          local = rows[members] - self.layout.offsets[window]
          batch[name][destinations[members]] = per_window[window][local]
    return state_rows, next_state_rows
