"""Which rows of the loaded checkpoints a draw may sample.

A `ValidRowTable` lists the valid file rows of every loaded window in one
lookup (core.py's draws choose positions in it), each checkpoint's rows a
sorted int array or, where a store keeps them as a bit a row, a
`MaskedRows` read where it lies.
"""

import numpy as np

from fixed_replay.io import spill
from fixed_replay.replay import batch_kernels
from fixed_replay.store import compact_store


class MaskedRows:
  """One checkpoint's valid file rows as its store keeps them: a bit a row.

  The mask stays where it lies (mapped from the store). A
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
    rows = compact_store.unpack_valid_rows(self.mask, self.num_rows)
    return rows.astype(dtype or np.int64)

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
