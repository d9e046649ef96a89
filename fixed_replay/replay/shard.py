"""One loaded checkpoint window that samples exactly like Dopamine.

A `ReplayShard` holds rows [start, start + count) of one checkpoint (or
describes them, when its frames stay elsewhere) and answers
`write_transitions` and `is_valid_transition` as Dopamine's
`OutOfGraphReplayBuffer` loaded with the whole file would, for every row it
considers valid. Indices are file rows. The transition math is
transitions.py's, over a layout of this one window.
"""

import numpy as np

from fixed_replay.dataset import validity
from fixed_replay.replay import stacking
from fixed_replay.replay import transitions

# Re-exported: the signature's old home.
ReplayElement = transitions.ReplayElement
SUFFIX_ELEMENT = transitions.SUFFIX_ELEMENT
transition_elements = transitions.transition_elements
empty_batch = transitions.empty_batch


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
    if valid_rows is None:
      valid_rows = validity.window_valid_rows(
        window, stack_size, update_horizon
      )
    self.valid_rows = valid_rows
    self._writer = transitions.TransitionWriter(
      window.store,
      transitions.RowLayout([window]),
      stack_size,
      update_horizon,
      gamma,
    )

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

  def write_transitions(self, indices, batch, destinations):
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
    stacking.gather_state_pairs(
      self.window.store['observation'],
      state_rows,
      next_rows,
      batch['state'],
      batch['next_state'],
      destinations,
    )
