"""The compiled stack gathering equals numpy's moveaxis, for any layout."""

import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from fixed_replay import kernel_cache
from fixed_replay.replay import batch_kernels
from fixed_replay.store import unit_decoding

PACKAGE = pathlib.Path(kernel_cache.__file__).parent


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


def test_every_cached_kernel_is_stamped_with_every_kernel_file():
  cached_kernel = re.compile(r'^@numba\.njit\([^)]*cache=True', re.MULTILINE)
  defining = {
    path.relative_to(PACKAGE).as_posix()
    for path in PACKAGE.rglob('*.py')
    if cached_kernel.search(path.read_text())
  }
  assert defining == set(kernel_cache.KERNEL_FILES)
  for kernel in (
    batch_kernels.decode_stacks,
    batch_kernels.write_parts,
    unit_decoding.decode_units,
  ):
    locator = kernel._cache._impl.locator  # noqa: SLF001
    assert locator.get_source_stamp() == kernel_cache._STAMP  # noqa: SLF001


# Compiles (or loads) one kernel in a fresh process, printing cache hits.
_CACHE_HITS = """
import numpy as np
from fixed_replay.replay import batch_kernels
batch_kernels._pairwise_sum(np.ones(3))
print(sum(batch_kernels._pairwise_sum.stats.cache_hits.values()))
"""


@pytest.mark.slow
def test_a_change_to_any_kernel_file_recompiles_every_kernel(tmp_path):
  shutil.copytree(
    PACKAGE,
    tmp_path / 'fixed_replay',
    ignore=shutil.ignore_patterns('__pycache__', 'configs'),
  )
  env = dict(os.environ, PYTHONPATH=str(tmp_path))
  env.pop('NUMBA_CACHE_DIR', None)  # The copy's own __pycache__.

  def cache_hits():
    result = subprocess.run(
      [sys.executable, '-c', _CACHE_HITS],
      cwd=tmp_path,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
      check=True,
    )
    return int(result.stdout.split()[-1])

  assert cache_hits() == 0  # Compiled and saved.
  assert cache_hits() == 1  # Loaded.
  # A change to the other kernel file only (a comment is enough).
  with open(tmp_path / 'fixed_replay' / 'store' / 'unit_decoding.py', 'a') as f:
    f.write('# changed\n')
  assert cache_hits() == 0
  assert cache_hits() == 1


def test_valid_rows_drawn_from_masks_are_those_of_the_sorted_tables():
  """A table of MaskedRows (bits as a store keeps them) gives every
  position the row a table of sorted rows gives it, and knows the same
  rows, across blocks, empty masks and a last partial byte."""
  from fixed_replay.replay import valid_rows
  from fixed_replay.store import compact_store

  rng = np.random.default_rng(0)
  sorted_rows, masked = [], []
  for num_rows, density in ((5_003, 0.97), (1, 1.0), (700, 0.0), (2_050, 0.01)):
    rows = np.flatnonzero(rng.random(num_rows) < density).astype(np.int32)
    mask = compact_store.pack_valid_rows(rows, num_rows)
    sorted_rows.append(rows)
    masked.append(valid_rows.MaskedRows(mask, num_rows))
    np.testing.assert_array_equal(np.asarray(masked[-1]), rows)
    probe = np.arange(-2, num_rows + 2)
    np.testing.assert_array_equal(
      masked[-1].contains(probe), np.isin(probe, rows)
    )
  suffixes = [0, 1, 2, 3]
  plain = valid_rows.ValidRowTable.concatenate(suffixes, sorted_rows)
  table = valid_rows.ValidRowTable.concatenate(suffixes, masked)
  assert table.total == plain.total == sum(len(r) for r in sorted_rows)
  positions = np.arange(table.total)
  for got, expected in zip(
    table.rows_at(positions), plain.rows_at(positions), strict=True
  ):
    np.testing.assert_array_equal(got, expected)
  with pytest.raises(IndexError, match='positions outside'):
    table.rows_at(np.array([table.total]))
