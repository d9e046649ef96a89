"""Where the frames of sampled transitions come from.

A frame source is what a ReplayCore samples from: the valid-row table of its
checkpoints (`table`) and a `write(batch, which, rows)` that writes the
transitions at those (checkpoint position, file row) pairs. Two exist:

* `ShardFrames`: checkpoint windows decompressed into RAM, one ReplayShard
  each (FixedReplayBuffer); the transition math runs once per checkpoint.
* `BlockFrames`: a compact store (CompactReplayBuffer): the small arrays of
  every window mapped where they lie; the transition math runs once over a
  minibatch mixing any checkpoints. Units (one frame each by default) are
  decoded as the batch needs them, each distinct unit once, and the stacks
  packed from them, in one compiled call outside the GIL; units whose
  stacks do not pack into uint32s are decoded the same way and the stacks
  gathered from them. Uniform sampling over a run's frames almost never
  uses a unit twice, so nothing is cached.

Another source (say, frames decoded from RL Unplugged records) plugs in by
offering the same few members: the `FrameSource` protocol.
"""

import threading
from typing import Protocol
from typing import runtime_checkable

import numpy as np

from fixed_replay.replay import batch_kernels
from fixed_replay.replay import replay_shard
from fixed_replay.replay import valid_rows
from fixed_replay.store import frame_units
from fixed_replay.store import unit_decoding

# Each thread's scratch for decoded frames (BlockFrames._scratch).
_SCRATCH = threading.local()


def units_per_transition(unit_rows, stack_size, update_horizon):
  """At most how many units of `unit_rows` frames one transition decodes.

  Its frames lie in file rows [row - stack_size + 1, row + update_horizon],
  a span that a circular window may split in two.
  """
  span = stack_size + update_horizon
  return min(span, (span - 1) // unit_rows + 3)


@runtime_checkable
class FrameSource(Protocol):
  """What a ReplayCore samples from; immutable once published."""

  table: valid_rows.ValidRowTable

  @property
  def num_rows(self) -> int:
    """Rows of the loaded windows."""

  @property
  def nbytes(self) -> int:
    """Bytes the source holds."""

  def shard(self, position: int) -> replay_shard.ReplayShard:
    """The ReplayShard describing the window at table `position`."""

  def check(self, which: np.ndarray, rows: np.ndarray) -> None:
    """Raises ValueError unless every row is valid in its window."""

  def write(
    self,
    batch: dict,
    which: np.ndarray,
    rows: np.ndarray,
    destinations: np.ndarray,
  ) -> None:
    """Writes the transitions at (table positions, file rows) into batch, at
    its rows `destinations` (int64, one each)."""

  def read_frames(
    self, which: np.ndarray, rows: np.ndarray
  ) -> tuple[np.ndarray, np.ndarray]:
    """(frames, where): the frame at file row rows[i] of window which[i] is
    frames[where[i]]; each distinct frame read once."""

  def close(self) -> None:
    """Releases what the source holds open."""


def check_rows(shards, which, rows):
  """Raises ValueError unless every row is valid in its checkpoint's shard."""
  for i in np.unique(which):
    shards[i].check_indices(rows[which == i])


class ShardFrames:
  """Loaded checkpoint windows, one ReplayShard each; immutable."""

  def __init__(self, shards):
    self.shards = tuple(shards)
    self.table = valid_rows.ValidRowTable(
      [s.suffix for s in self.shards], [s.valid for s in self.shards]
    )
    self.by_suffix = {s.suffix: s for s in self.shards}

  @property
  def num_rows(self) -> int:
    return sum(s.window.num_rows for s in self.shards)

  @property
  def nbytes(self) -> int:
    return sum(s.nbytes for s in self.shards)

  def shard(self, position):
    return self.shards[position]

  def check(self, which, rows):
    check_rows(self.shards, which, rows)

  def write(self, batch, which, rows, destinations):
    """Writes the transitions (positions `which`, file rows `rows`)."""
    for i in np.unique(which):
      members = which == i
      self.shards[i].write_transitions(
        rows[members], batch, destinations[members]
      )

  def read_frames(self, which, rows):
    first = self.shards[0].window.store['observation']
    frames = np.empty((len(rows),) + first.shape[1:], first.dtype)
    for i in np.unique(which):
      members = which == i
      window = self.shards[i].window
      frames[members] = window.store['observation'][
        rows[members] - window.start
      ]
    return frames, np.arange(len(rows))

  def close(self) -> None:
    """Nothing to close: the windows are plain arrays."""


def _gather(frames, rows, batch, destinations):
  """Writes the states and next states of a batch from `frames`: `rows`
  (2 x batch, stack) holds the states' frame rows, then the next states'."""
  count = len(destinations)
  batch_kernels.gather_state_pairs(
    frames,
    rows[:count],
    rows[count:],
    batch['state'],
    batch['next_state'],
    destinations,
  )


class BlockFrames:
  """Windows of a compact store, their units decoded for each batch."""

  def __init__(self, stored, shards, table, assembler, checks, fixed_bytes):
    """Keeps the parts (see compact_windows.open_windows).

    Args:
      stored: list of compact_store.StoredCheckpoint, in table order.
      shards: list of ReplayShard describing each window (frames unheld),
        their valid rows views of the table's.
      table: valid_rows.ValidRowTable of the windows.
      assembler: transitions.TransitionAssembler over the small arrays of every
        window end to end.
      checks: block_checks.BatchChecks of the windows' tables: every batch's
        blocks are checked before it reads them.
      fixed_bytes: int, bytes held (tables, indexes, the ready batches of
        the budget).
    """
    self._stored = stored
    self._shards = shards
    self.table = table
    self._assembler = assembler
    self._checks = checks
    self.nbytes = fixed_bytes
    self._block_rows = stored[0].frames.block_rows
    self._key_stride = max(s.frames.num_blocks for s in stored) + 1
    # When stacks pack (uint8, stack of 4), units and stacks in one
    # compiled call with the batch_kernels.
    self._compiled = batch_kernels.packable(
      stored[0].frames.dtype, assembler.stack_size
    )
    self._units_per_transition = units_per_transition(
      self._block_rows, assembler.stack_size, assembler.update_horizon
    )
    # Units decoded so far, for benchmarks; not exact while several threads
    # sample.
    self.units_decoded = 0
    self.frame_reader = frame_units.FrameReader([s.frames for s in stored])

  @property
  def num_rows(self) -> int:
    return sum(s.window.num_rows for s in self._shards)

  def shard(self, position):
    self._checks.check_window(position)  # Its reader may read any row.
    return self._shards[position]

  def check(self, which, rows):
    check_rows(self._shards, which, rows)

  def write(self, batch, which, rows, destinations):
    which = np.asarray(which, dtype=np.int64)
    rows = np.asarray(rows, dtype=np.int64)
    destinations = np.asarray(destinations, dtype=np.int64)
    self._checks.check(which, rows)
    if self._compiled:
      self._write_units(batch, which, rows, destinations)
    else:
      self._write_frames(batch, which, rows, destinations)

  def _write_units(self, batch, which, rows, destinations):
    """Writes transitions decoding just the distinct units they use.

    Units, checks and stacks in one compiled call, outside the GIL.
    """
    count = len(rows)
    state, next_state = self._assembler.write_parts(
      which, rows, batch, destinations
    )
    frame_bytes = self._stored[0].frames.frame_bytes
    status = np.zeros(5, np.int64)
    units = np.empty((2, state.size * 2), np.int64)
    batch_kernels.decode_stacks(
      unit_decoding.FUNCTIONS,
      self.frame_reader.table,
      unit_decoding.context(),
      self._block_rows,
      which,
      self._assembler.layout.file_row_shift,
      state,
      next_state,
      self._scratch(
        count * self._units_per_transition * self._block_rows, frame_bytes
      ),
      batch['state'].reshape(len(batch['state']), -1).view(np.uint32),
      batch['next_state'].reshape(len(batch['state']), -1).view(np.uint32),
      destinations,
      units,
      status,
    )
    if status[4] == -2:
      raise RuntimeError('a batch needs more units than its scratch holds')
    if status[4] < 0:
      raise IndexError('checkpoint or frame rows outside the store')
    self.units_decoded += int(status[4])
    if status[1] != unit_decoding.OK:
      self.frame_reader.raise_for(status[:4], units[0], units[1])

  def _write_frames(self, batch, which, rows, destinations):
    """Writes transitions decoding just the distinct units they use.

    For stacks that do not pack (see _write_units).
    """
    both, frame_rows = self._frame_rows(batch, which, rows, destinations)
    frames, where = self.read_frames(
      np.repeat(both, frame_rows.shape[1]), frame_rows.reshape(-1)
    )
    _gather(frames, where.reshape(frame_rows.shape), batch, destinations)

  def _frame_rows(self, batch, which, rows, destinations):
    """Writes all but the states; (windows, file rows) of both states'
    frames (the states' rows, then the next states')."""
    state, next_state = self._assembler.write_parts(
      which, rows, batch, destinations
    )
    both = np.concatenate([which, which])
    return both, self._assembler.layout.file_rows_of(
      both, np.concatenate([state, next_state])
    )

  @staticmethod
  def _scratch(rows, row_bytes):
    """This thread's scratch for decoded frames, reused batch after batch
    and by every source (each run of a 40-run mixture held its own 1.5 MB).

    A fresh megabyte each batch is mapped and faulted in anew (and
    unmapped, which stalls the other threads); reused, its pages stay.
    """
    scratch = getattr(_SCRATCH, 'array', None)
    if (
      scratch is None
      or scratch.shape[0] < rows
      or scratch.shape[1] != row_bytes
    ):
      scratch = _SCRATCH.array = np.empty((rows, row_bytes), np.uint8)
    return scratch

  def read_frames(self, which, rows):
    """Decodes the distinct units holding the frames."""
    self._checks.check(which, rows)
    keys = which * self._key_stride + rows // self._block_rows
    unique, inverse = np.unique(keys, return_inverse=True)
    first = self._stored[0].frames
    blocks = np.empty(
      (len(unique), self._block_rows) + first.row_shape, first.dtype
    )
    self.units_decoded += len(unique)
    self.frame_reader.read(*np.divmod(unique, self._key_stride), blocks)
    where = inverse * self._block_rows + rows % self._block_rows
    return blocks.reshape((-1,) + first.row_shape), where

  def close(self) -> None:
    """Closes the store's files."""
    self.frame_reader.close()
    for stored in self._stored:
      stored.close()
