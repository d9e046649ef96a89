"""Dopamine's transition semantics over one or more checkpoint windows.

`transition_elements` is the signature every buffer returns. `RowLayout`
places file rows of one or more checkpoint windows in arrays that hold the
windows end to end, with each window's own rule: a full file read whole wraps
around, as Dopamine's circular buffer does; any other window is offset. The
`TransitionWriter` then computes, for a minibatch mixing any of those
checkpoints in one compiled pass, every element but the frames (n-step
discounted reward, terminal, next action, ...) and says where the frames of
each state lie, so that whoever holds the frames (arrays in RAM, a block
cache) gathers them. A `ReplayShard` is one window with that math, and a
`ValidRowTable` lists the rows of the loaded windows that may be sampled
(core.py's draws choose among them).

The writer's per-transition math is one compiled call that releases the
GIL (batch_kernels.write_parts): done with a dozen small numpy operations
it held the GIL for some 55 us of a batch, which kept a second sampling
thread from scaling.
"""

import collections
import math

import numpy as np

from fixed_replay.io import spill
from fixed_replay.replay import batch_kernels
from fixed_replay.sources.dopamine import validity

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
    # The same, one row a window, for the compiled writer.
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
  """`array` as the compiled writer reads it: C-contiguous, of a dtype in
  batch_kernels.KINDS (another is converted: a copy), `rows` rows."""
  array = np.asarray(array)
  if len(array) != rows:
    raise ValueError(f'{len(array)} rows of an array of a {rows}-row window')
  if array.dtype not in batch_kernels.KINDS:
    array = array.astype(np.float64 if array.dtype.kind == 'f' else np.int64)
  return _rows_view(np.ascontiguousarray(array))


class TransitionWriter:
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


class MaskedRows:
  """One checkpoint's valid file rows as its store keeps them: a bit a row.

  The mask stays where it lies (mapped from a store of format version 5). A
  drawn position finds its row from the valid rows before each block of
  BLOCK_BYTES (8 bytes of the process's own memory a 512 rows) and a scan of
  one block, instead of a table of 4 bytes a row built, and spilled, at
  every open. It stands for the sorted array of valid rows that other
  sources hold: `len`, `np.asarray` gives the array, `contains` searches it,
  and a ValidRowTable of MaskedRows draws from them in compiled code.
  """

  BLOCK_BYTES = 64

  def __init__(self, mask: np.ndarray, num_rows: int):
    """Counts the valid rows of each block.

    Args:
      mask: uint8 array of np.packbits(bitorder='little') of num_rows bits.
      num_rows: int, the file's rows.
    """
    self.mask = mask
    self.num_rows = num_rows
    padded = np.zeros(-(-len(mask) // self.BLOCK_BYTES) * self.BLOCK_BYTES)
    padded = padded.astype(np.int64)
    padded[: len(mask)] = batch_kernels.POPCOUNT[mask]
    counts = padded.reshape(-1, self.BLOCK_BYTES).sum(axis=1)
    self.block_starts = np.cumsum(counts) - counts
    self._count = int(counts.sum())

  def __len__(self) -> int:
    return self._count

  @property
  def nbytes(self) -> int:
    return self.block_starts.nbytes

  def __array__(self, dtype=None, copy=None):
    del copy  # Always a new array.
    bits = np.unpackbits(self.mask, count=self.num_rows, bitorder='little')
    return np.flatnonzero(bits).astype(dtype or np.int64)

  def contains(self, rows: np.ndarray) -> np.ndarray:
    """Whether each of file `rows` is valid, a bool array."""
    rows = np.asarray(rows, np.int64)
    inside = (rows >= 0) & (rows < self.num_rows)
    kept = np.where(inside, rows, 0)
    return inside & (self.mask[kept >> 3] >> (kept & 7) & 1).astype(bool)


def contains(valid_rows, rows) -> np.ndarray:
  """Whether each of file `rows` is in `valid_rows` (sorted, or MaskedRows)."""
  rows = np.asarray(rows, np.int64)
  if isinstance(valid_rows, MaskedRows):
    return valid_rows.contains(rows)
  if not len(valid_rows):
    return np.zeros(rows.shape, bool)
  positions = np.searchsorted(valid_rows, rows)
  positions = np.minimum(positions, len(valid_rows) - 1)
  return valid_rows[positions] == rows


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
      valid_rows: optional sorted int array or MaskedRows, the window's
        valid file rows when already known (e.g. precomputed in a compact
        store); computed from the window when None.
    """
    self.window = window
    self.suffix = window.suffix
    if valid_rows is None:
      valid_rows = validity.window_valid_rows(
        window, stack_size, update_horizon
      )
    self.valid = valid_rows  # As held: an array, or a store's MaskedRows.
    self._writer = TransitionWriter(
      [window.store],
      RowLayout([window]),
      stack_size,
      update_horizon,
      gamma,
    )

  @property
  def valid_rows(self) -> np.ndarray:
    """The window's valid file rows, a sorted int array."""
    return np.asarray(self.valid)

  @property
  def num_valid(self) -> int:
    return len(self.valid)

  @property
  def nbytes(self) -> int:
    return self.window.nbytes + self.valid.nbytes

  def is_valid_transition(self, index: int) -> bool:
    """Returns True if file row `index` may be sampled from this shard."""
    return bool(contains(self.valid, [index])[0])

  def check_indices(self, indices) -> None:
    """Raises ValueError unless every file row in `indices` is valid here."""
    indices = np.asarray(indices, dtype=np.int64)
    bad = indices[~contains(self.valid, indices)]
    if len(bad):
      raise ValueError(
        f'Rows {bad[:10].tolist()} of checkpoint {self.suffix} are not valid '
        f'transitions in the loaded window [{self.window.start}, '
        f'{self.window.start + self.window.num_rows})'
      )

  def write_transitions(
    self, indices: np.ndarray, batch: dict, destinations: np.ndarray
  ) -> None:
    """Writes the transitions at file rows `indices` into `batch`.

    Args:
      indices: int array (b,) of valid file rows.
      batch: dict of element name to batch array (see transition_elements).
      destinations: int array (b,), positions in the batch arrays.
    """
    which = np.zeros(len(indices), dtype=np.int64)
    state_rows, next_rows = self._writer.write_parts(
      which, indices, batch, destinations
    )
    batch_kernels.gather_state_pairs(
      self.window.store['observation'],
      state_rows,
      next_rows,
      batch['state'],
      batch['next_state'],
      destinations,
    )


class ValidRowTable:
  """The valid file rows of each loaded checkpoint, in one lookup table."""

  def __init__(self, suffixes, valid_rows, concatenated=None):
    """Builds the table.

    Args:
      suffixes: sequence of int, the checkpoints in their order.
      valid_rows: sequence of sorted int arrays or MaskedRows, each
        checkpoint's valid file rows.
      concatenated: optional array, `valid_rows` already laid end to end
        (each entry then a view of it): a draw over many checkpoints is one
        vectorized lookup instead of one per checkpoint (as it is where
        every entry is a MaskedRows).
    """
    self.suffixes = [int(s) for s in suffixes]
    self.suffix_array = np.array(self.suffixes, dtype=np.int32)
    self.valid_rows = tuple(valid_rows)
    counts = np.array([len(r) for r in self.valid_rows], dtype=np.int64)
    self.ends = np.cumsum(counts, dtype=np.int64)
    self.starts = self.ends - counts
    self.total = int(self.ends[-1]) if len(counts) else 0
    self._concatenated = concatenated
    self._masks = bool(self.valid_rows) and all(
      isinstance(rows, MaskedRows) for rows in self.valid_rows
    )
    if self._masks:  # One compiled draw a batch, over every mask.
      masked = self.valid_rows
      self._addresses = np.array([m.mask.ctypes.data for m in masked], np.int64)
      sizes = [len(m.block_starts) for m in masked]
      self._first_block = np.cumsum([0] + sizes).astype(np.int64)
      # Each mask's counts become a view of the joined ones: held once.
      self._block_starts = np.concatenate([m.block_starts for m in masked])
      for m, first in zip(masked, self._first_block, strict=False):
        m.block_starts = self._block_starts[first : first + len(m.block_starts)]
    self._position = {s: i for i, s in enumerate(self.suffixes)}

  @classmethod
  def concatenate(cls, suffixes, valid_rows, dtype=None) -> 'ValidRowTable':
    """A table whose rows are laid end to end (see `concatenated`), or
    whose masks are kept where they lie, when every entry is a MaskedRows."""
    if all(isinstance(rows, MaskedRows) for rows in valid_rows):
      return cls(suffixes, valid_rows)
    valid_rows = [np.asarray(rows) for rows in valid_rows]
    joined = spill.copy(
      np.concatenate(list(valid_rows)).astype(dtype or np.int64, copy=False)
    )
    ends = np.cumsum([len(r) for r in valid_rows])
    return cls(suffixes, np.split(joined, ends[:-1]), concatenated=joined)

  def __len__(self):
    return len(self.suffixes)

  def num_valid(self, position: int) -> int:
    return len(self.valid_rows[position])

  def rows_at(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """File rows of table positions in [0, total); (which, rows)."""
    which = np.searchsorted(self.ends, positions, side='right')
    if self._masks:
      if positions.size and not 0 <= positions.min() <= positions.max() < (
        self.total
      ):
        raise IndexError(f'positions outside [0, {self.total})')
      rows = np.empty(len(positions), np.int64)
      batch_kernels.select_set_bits(
        self._addresses,
        self._first_block,
        self._block_starts,
        MaskedRows.BLOCK_BYTES,
        np.ascontiguousarray(which, np.int64),
        np.ascontiguousarray(positions - self.starts[which], np.int64),
        rows,
      )
      return which, rows
    if self._concatenated is not None:
      return which, self._concatenated[positions].astype(np.int64)
    rows = np.empty(len(positions), dtype=np.int64)
    for i in np.unique(which):  # One vectorized lookup per checkpoint.
      members = which == i
      rows[members] = self.valid_rows[i][positions[members] - self.starts[i]]
    return which, rows

  def position_of(self, suffix: int | None) -> int:
    """Position of checkpoint `suffix` (None: the only one loaded)."""
    if suffix is None:
      if len(self.suffixes) != 1:
        raise ValueError(
          f'{len(self.suffixes)} checkpoints are loaded {self.suffixes}: '
          'say which with `suffixes`'
        )
      return 0
    suffix = int(suffix)
    if suffix not in self._position:
      raise ValueError(
        f'Checkpoint {suffix} is not loaded (loaded: {self.suffixes})'
      )
    return self._position[suffix]

  def positions(self, suffixes, count: int) -> np.ndarray:
    """Positions of `suffixes` (None, an int or one per index), (count,)."""
    if suffixes is None:
      return np.full(count, self.position_of(None), dtype=np.int64)
    suffixes = np.broadcast_to(np.asarray(suffixes), (count,))
    unknown = set(np.unique(suffixes).tolist()) - set(self._position)
    if unknown:
      raise ValueError(
        f'Checkpoint(s) {sorted(unknown)} are not loaded (loaded: '
        f'{self.suffixes})'
      )
    which = np.empty(count, dtype=np.int64)
    for suffix in np.unique(suffixes):
      which[suffixes == suffix] = self._position[int(suffix)]
    return which
