"""Which rows of a checkpoint window Dopamine would sample, vectorized.

Dopamine's `OutOfGraphReplayBuffer.is_valid_transition` checks one index at a
time; here the same rules are applied to whole arrays at once. For a window
smaller than the file we add one rule of our own: a row is valid only if its
frame stack and its n-step future (up to the next state) lie inside the
window, so nothing is ever stitched across the window's edges.
"""

import numpy as np

from fixed_replay.sources.dopamine import checkpoints


def cursor_invalid_rows(
  cursor: int, capacity: int, stack_size: int, update_horizon: int
) -> np.ndarray:
  """Dopamine's `invalid_range`: rows made invalid by the writer's cursor.

  Args:
    cursor: int, next write slot.
    capacity: int, rows in the file.
    stack_size: int.
    update_horizon: int.

  Returns:
    int64 array of stack_size + update_horizon rows.
  """
  offsets = np.arange(stack_size + update_horizon) - update_horizon
  return (cursor + offsets) % capacity


def valid_rows(
  terminal: np.ndarray,
  start: int,
  num_file_rows: int,
  add_count: int,
  invalid_range: np.ndarray,
  episode_end_indices: np.ndarray | None,
  stack_size: int,
  update_horizon: int,
) -> np.ndarray:
  """Returns the sorted file rows of a window that may be sampled.

  Args:
    terminal: array of the window's terminal flags (rows start ... start +
      len(terminal) - 1 of the file).
    start: int, file row of the window's first row.
    num_file_rows: int, rows in the file (the writer's capacity).
    add_count: int, rows ever added by the writer.
    invalid_range: array of file rows the file marks invalid.
    episode_end_indices: array of file rows where an episode ended, or None.
    stack_size: int, frames per state.
    update_horizon: int, n of the n-step return.

  Returns:
    int64 np.ndarray of file rows, increasing.
  """
  window_rows = len(terminal)
  capacity = num_file_rows
  cursor = add_count % capacity
  is_full = add_count >= capacity
  rows = np.arange(start, start + window_rows, dtype=np.int64)
  # A full buffer read whole is circular, exactly as in Dopamine; any other
  # window is a plain array whose edges nothing may cross.
  circular = is_full and window_rows == capacity
  valid = np.ones(window_rows, dtype=bool)
  if not circular:
    valid &= rows - (stack_size - 1) >= start
    valid &= rows + update_horizon < start + window_rows
  if not is_full:
    valid &= (rows >= stack_size - 1) & (rows < cursor - update_horizon)
  # The file's invalid_range was computed for the writer's horizon; ours may
  # be longer, so the cursor's neighbourhood is recomputed and both apply.
  cursor_rows = cursor_invalid_rows(
    cursor, capacity, stack_size, update_horizon
  )
  valid &= ~np.isin(rows, np.concatenate([invalid_range, cursor_rows]))

  # np.roll wraps around the window's ends; for non-circular windows the rows
  # it could affect were already excluded by the edge rules above.
  is_terminal = np.asarray(terminal).astype(bool)
  for back in range(1, stack_size):
    valid &= ~np.roll(is_terminal, back)  # terminal at row i - back.
  if episode_end_indices is not None and len(episode_end_indices):
    cut = np.zeros(window_rows, dtype=bool)
    ends = np.asarray(episode_end_indices, dtype=np.int64) - start
    ends = ends[(ends >= 0) & (ends < window_rows)]
    cut[ends] = ~is_terminal[ends]  # Episode cut without a terminal flag.
    for ahead in range(update_horizon):
      valid &= ~np.roll(cut, -ahead)  # cut at row i + ahead.
  return rows[valid]


def window_valid_rows(
  window: checkpoints.CheckpointWindow, stack_size: int, update_horizon: int
) -> np.ndarray:
  """valid_rows of a checkpoints.CheckpointWindow (its terminal flags)."""
  return valid_rows(
    window.store['terminal'],
    window.start,
    window.num_file_rows,
    window.add_count,
    window.invalid_range,
    window.episode_end_indices,
    stack_size,
    update_horizon,
  )
