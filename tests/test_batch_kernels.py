"""The compiled stack gathering equals numpy's moveaxis, for any layout."""

import numpy as np
import pytest

from fixed_replay.replay import batch_kernels


def _expected(frames, rows):
  return np.moveaxis(frames[rows], 1, -1)


@pytest.mark.parametrize(
  'dtype, observation_shape, stack_size',
  [
    (np.uint8, (84, 84), 4),  # The packed uint32 path.
    (np.uint8, (84, 84), 3),
    (np.float64, (4, 1), 1),  # Dopamine's CartPole.
    (np.float32, (6,), 2),
  ],
)
def test_gather_matches_numpy(dtype, observation_shape, stack_size):
  rng = np.random.default_rng(0)
  frames = (rng.random((50,) + observation_shape) * 255).astype(dtype)
  rows = rng.integers(0, 50, (7, stack_size))
  next_rows = rng.integers(0, 50, (7, stack_size))
  destinations = rng.permutation(10)[:7]
  shape = (10,) + observation_shape + (stack_size,)
  out, next_out = np.zeros(shape, dtype), np.zeros(shape, dtype)
  batch_kernels.gather_state_pairs(
    frames, rows, next_rows, out, next_out, destinations
  )
  np.testing.assert_array_equal(out[destinations], _expected(frames, rows))
  np.testing.assert_array_equal(
    next_out[destinations], _expected(frames, next_rows)
  )
  untouched = np.setdiff1d(np.arange(10), destinations)
  assert not out[untouched].any() and not next_out[untouched].any()
  single = np.zeros(shape, dtype)
  batch_kernels.gather_stacks(frames, rows, single, destinations)
  np.testing.assert_array_equal(single, out)


def test_rows_outside_frames_raise_instead_of_crashing():
  frames = np.zeros((5, 84, 84), np.uint8)
  out = np.zeros((2, 84, 84, 4), np.uint8)
  with pytest.raises(IndexError, match=r'frame rows outside \[0, 5\)'):
    batch_kernels.gather_stacks(frames, np.array([[2, 3, 4, 5]]), out, [0])
  with pytest.raises(IndexError, match='batch positions'):
    batch_kernels.gather_stacks(frames, np.array([[1, 2, 3, 4]]), out, [2])
