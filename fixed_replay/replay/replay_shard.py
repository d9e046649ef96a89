"""A replay shard: one checkpoint's window in RAM and its valid rows.

Storage for Dopamine's files (checkpoint_loading.py loads each window) and
for a store's small arrays (compact_windows.py): the window's arrays, the
file rows a sampler may draw from it (computed from the window, or a store's
precomputed mask), and the transitions at given rows, assembled with
Dopamine's math (transitions.py) and the frames gathered from the window.
"""

import functools

import numpy as np

from fixed_replay.replay import batch_kernels
from fixed_replay.replay import transitions
from fixed_replay.replay import valid_rows as valid_rows_lib
from fixed_replay.sources.dopamine import validity


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
    self._transition_math = stack_size, update_horizon, gamma

  @functools.cached_property
  def _assembler(self):
    # Built when first asked for: a store's windows write through their
    # source's assembler, and 2,000 of them in a 40-run mixture never ask.
    return transitions.TransitionAssembler(
      [self.window.store],
      transitions.RowLayout([self.window]),
      *self._transition_math,
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
    return bool(valid_rows_lib.contains(self.valid, [index])[0])

  def check_indices(self, indices) -> None:
    """Raises ValueError unless every file row in `indices` is valid here."""
    indices = np.asarray(indices, dtype=np.int64)
    bad = indices[~valid_rows_lib.contains(self.valid, indices)]
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
    state_rows, next_rows = self._assembler.write_parts(
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
