"""Vectorized validity equals Dopamine's is_valid_transition, row by row."""

import dopamine_data
import numpy as np
import pytest

from fixed_replay.sources.dopamine import checkpoints
from fixed_replay.sources.dopamine import validity


@pytest.mark.parametrize(
  'stack_size, update_horizon', [(4, 1), (4, 3), (1, 1), (2, 5)]
)
def test_whole_file_matches_dopamine(tmp_path, stack_size, update_horizon):
  capacity = 400
  for suffix, num_adds in enumerate([250, 399, 400, 877]):
    writer = dopamine_data.write_checkpoint(
      tmp_path,
      suffix,
      capacity,
      num_adds,
      seed=suffix,
      stack_size=stack_size,
      update_horizon=update_horizon,
      terminal_prob=0.03,
      episode_end_prob=0.02,
    )
    window = checkpoints.read_checkpoint(
      checkpoints.find_checkpoints(tmp_path)[suffix]
    )
    ours = validity.valid_rows(
      window.store['terminal'],
      0,
      capacity,
      window.add_count,
      window.invalid_range,
      window.episode_end_indices,
      stack_size,
      update_horizon,
    )
    expected = [i for i in range(capacity) if writer.is_valid_transition(i)]
    np.testing.assert_array_equal(ours, expected)


def test_window_rows_never_leave_the_window(dopamine_dir):
  directory, capacity, writers = dopamine_dir
  found = checkpoints.find_checkpoints(directory)
  for suffix in writers:
    # Dopamine's own buffer, loaded from the file, judging with horizon 3.
    oracle = dopamine_data.load_oracle(
      directory, suffix, capacity, update_horizon=3
    )
    for start, count in [(0, 300), (350, 200), (capacity - 250, 250)]:
      window = checkpoints.read_checkpoint(found[suffix], start, count)
      rows = validity.valid_rows(
        window.store['terminal'],
        start,
        capacity,
        window.add_count,
        window.invalid_range,
        window.episode_end_indices,
        4,
        3,
      )
      if not oracle.is_full() and oracle.cursor() <= start:
        assert rows.size == 0  # Rows never written are never valid.
        continue
      assert rows.min() >= start + 3 and rows.max() + 3 < start + count
      assert all(oracle.is_valid_transition(int(i)) for i in rows)
      # Every Dopamine-valid row whose stack and future fit is kept.
      fits = [
        i
        for i in range(start + 3, start + count - 3)
        if oracle.is_valid_transition(i)
      ]
      assert set(fits) - set(rows.tolist()) <= set(
        validity.cursor_invalid_rows(window.cursor, capacity, 4, 3)
      )


def test_cursor_invalid_rows_matches_dopamine():
  from dopamine.tf.replay_memory import circular_replay_buffer

  for cursor in (0, 1, 5, 998, 999):
    np.testing.assert_array_equal(
      validity.cursor_invalid_rows(cursor, 1000, 4, 3),
      circular_replay_buffer.invalid_range(cursor, 1000, 4, 3),
    )
