"""Checks the blocks of tables a batch reads, each once, before it reads them.

A store's tables (store/checkpoint_tables.py) are checked in 4 KiB blocks
against CRC-32s the manifest holds. Checked whole when a checkpoint opens,
a mixture read every table of every checkpoint from disk before its first
batch: 8 MB a 1M-row checkpoint, 4 GB for 500 checkpoints whose
transitions a batch reads a few bytes of. Here a sampler checks at open
only what opening reads (the valid-row mask, the invalid range, episode
ends), and before each batch the blocks its transitions touch that no batch
touched before: the rows around each transition's own in the per-row
tables, and the sizes, anchor and CRC-32 of the units that hold its frames.
Finding them is one compiled call over the batch, a few microseconds once
every block is checked; each block is checked once a process.
"""

import numba
import numpy as np

from fixed_replay import kernel_cache
from fixed_replay.errors import CheckpointError
from fixed_replay.store import checkpoint_tables
from fixed_replay.store import unit_decoding

kernel_cache.install()

# How an element range follows from a transition's rows [a, b] (kinds of a
# region): the rows themselves; the units holding them; the sizes summed to
# find those units (from each one's anchor on); the anchors.
_ROWS, _UNITS, _SIZES, _ANCHORS = range(4)
# Region columns: the table's offset in its file, bytes an element, kind,
# and the checkpoint's units an anchor.
_OFFSET, _BYTES, _KIND, _ANCHOR_UNITS = range(4)


@numba.njit(nogil=True, cache=True)
def _unchecked_blocks(
  regions,
  num_rows,
  base,
  checked,
  unit_rows,
  block_bytes,
  margin,
  which,
  rows,
  out,
):
  """Writes into `out` the keys (base[p] + block) of the blocks that the
  transitions at (which[k], rows[k]) read and `checked` does not hold;
  returns how many (more than out holds: call again with more room)."""
  found = 0
  for k in range(len(rows)):
    p, row = which[k], rows[k]
    last = num_rows[p] - 1
    low, high = row - margin, row + margin
    for part in range(3):  # The span, and where it wraps past either end.
      if part == 0:
        first, end = max(low, 0), min(high, last)
      elif part == 1:
        if low >= 0:
          continue
        first, end = max(last + 1 + low, 0), last
      else:
        if high <= last:
          continue
        first, end = 0, min(high - last - 1, last)
      first_unit, end_unit = first // unit_rows, end // unit_rows
      for j in range(regions.shape[1]):
        kind = regions[p, j, _KIND]
        anchor_units = regions[p, j, _ANCHOR_UNITS]
        if kind == _ROWS:
          a, b = first, end
        elif kind == _UNITS:
          a, b = first_unit, end_unit
        elif kind == _SIZES:
          a, b = first_unit - first_unit % anchor_units, end_unit
        else:
          a, b = first_unit // anchor_units, end_unit // anchor_units
        offset, size = regions[p, j, _OFFSET], regions[p, j, _BYTES]
        for block in range(
          (offset + a * size) // block_bytes,
          (offset + (b + 1) * size - 1) // block_bytes + 1,
        ):
          key = base[p] + block
          if not checked[key]:
            if found < len(out):
              out[found] = key
            found += 1
  return found


class BatchChecks:
  """The table blocks of many checkpoints that batches read, each checked
  the first time a batch reads it. Thread-safe: two threads may check a
  block twice, never use one unchecked."""

  def __init__(self, stored, row_names, margin):
    """Describes where each checkpoint's tables lie.

    Args:
      stored: list of compact_store.StoredCheckpoint, in window order.
      row_names: names of the per-row tables batches read.
      margin: int, rows on either side of a transition's own it may read.
    """
    self._stored = list(stored)
    self._row_names = list(row_names)
    self._num_rows = np.array([s.num_rows for s in stored], np.int64)
    self._unit_rows = stored[0].frames.block_rows
    self._margin = margin
    tables = [s.tables for s in stored]
    self._block_bytes = tables[0].block_bytes
    if any(t.block_bytes != self._block_bytes for t in tables):
      raise CheckpointError(tables[0].path, 'checkpoints of other block sizes')
    names = self._row_names + [
      checkpoint_tables.UNIT_CRC32,
      checkpoint_tables.UNIT_SIZES,
      checkpoint_tables.UNIT_ANCHORS,
    ]
    kinds = [_ROWS] * len(self._row_names) + [_UNITS, _SIZES, _ANCHORS]
    self._regions = np.array(
      [
        [
          (*s.tables.region(name), kind, s.frames.anchor_units)
          for name, kind in zip(names, kinds, strict=True)
        ]
        for s in stored
      ],
      np.int64,
    ).reshape(len(stored), len(names), 4)
    counts = np.array([t.num_blocks for t in tables], np.int64)
    self._base = np.zeros(len(counts), np.int64)
    np.cumsum(counts[:-1], out=self._base[1:])
    # One array of each for the compiled checks, which each checkpoint's
    # tables then keep theirs in: a block checked by either is by both.
    self._expected = np.empty(int(counts.sum()), np.uint32)
    self._checked = np.empty(int(counts.sum()), np.bool_)
    for table, first, count in zip(tables, self._base, counts, strict=True):
      mine = slice(first, first + count)
      table.share(self._expected[mine], self._checked[mine])
    self._addresses = np.array([t.address for t in tables], np.int64)
    self._sizes = counts * self._block_bytes  # The files' bytes.

  @property
  def nbytes(self) -> int:
    """Bytes held for the blocks (5 a block: its CRC-32, whether checked)."""
    return self._checked.nbytes + self._expected.nbytes

  def check(self, which: np.ndarray, rows: np.ndarray) -> None:
    """Checks the blocks the transitions at (which, rows) read, if new.

    Args:
      which: int array, window positions.
      rows: int array, file rows.

    Raises:
      CheckpointError: naming the file, block and table of a damaged one.
    """
    which = np.ascontiguousarray(which, np.int64)
    rows = np.ascontiguousarray(rows, np.int64)
    out = np.empty(64, np.int64)
    found = self._find(which, rows, out)
    if not found:
      return
    if found > len(out):
      out = np.empty(found, np.int64)
      found = self._find(which, rows, out)
    keys = np.unique(out[:found])
    bad, actual = checkpoint_tables.check_blocks(
      unit_decoding.FUNCTIONS,
      self._addresses,
      self._sizes,
      self._base,
      self._block_bytes,
      keys,
      self._expected,
      self._checked,
    )
    if bad >= 0:
      owner = int(np.searchsorted(self._base, keys[bad], side='right')) - 1
      block = int(keys[bad] - self._base[owner])
      self._stored[owner].tables.raise_damaged(block, int(actual))

  def check_window(self, position: int) -> None:
    """Checks the per-row tables of window `position` whole, for a reader
    of more than batches (a segment sampler, Dopamine's
    is_valid_transition)."""
    for name in self._row_names:
      self._stored[position].arrays.stored(name)

  def _find(self, which, rows, out):
    return _unchecked_blocks(
      self._regions,
      self._num_rows,
      self._base,
      self._checked,
      self._unit_rows,
      self._block_bytes,
      self._margin,
      which,
      rows,
      out,
    )
