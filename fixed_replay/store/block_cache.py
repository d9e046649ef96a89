"""A least-recently-used cache of decoded frame blocks in one fixed arena.

Decoded blocks live in the slots of a single preallocated array, so the cache
never holds more than its byte budget (pages of unused slots are not even
touched) and a batch can gather its frame stacks straight from the arena with
one compiled call, without copying blocks around. Threads preparing batches
concurrently pin the slots they read: a pinned slot is never evicted, and a
block being decoded by one thread is waited for, not decoded twice.
"""

import collections
from collections.abc import Callable
from collections.abc import Iterable
import threading

import numpy as np
import numpy.typing as npt


class BlockCache:
  """Decoded blocks keyed by int, in an arena bounded in bytes."""

  def __init__(
    self, num_slots: int, block_shape: tuple[int, ...], dtype: npt.DTypeLike
  ) -> None:
    """Creates the arena (memory is only committed as slots are filled).

    Args:
      num_slots: int, blocks the cache can hold.
      block_shape: tuple, shape of one decoded block (rows, *row_shape).
      dtype: dtype of the frames.
    """
    if num_slots < 1:
      raise ValueError(f'num_slots={num_slots}: need at least one slot')
    self.arena = np.empty((num_slots,) + tuple(block_shape), dtype)
    self.block_rows = block_shape[0]
    self._lock = threading.Lock()
    # Signalled whenever blocks finish decoding (or fail to).
    self._decoded = threading.Condition(self._lock)
    self._slot_of = collections.OrderedDict()  # key -> slot, oldest first.
    # Per used slot only: a store whose units bypass the cache never uses
    # one, and lists of every slot cost 2 MB a run of a 40-run mixture.
    self._key_of = {}  # slot -> key.
    self._pins = collections.Counter()
    self._free = []  # Slots freed, taken before the never used ones.
    self._used = 0
    self._loading = set()  # Keys whose slot is being decoded.
    self.hits = 0
    self.misses = 0

  @property
  def num_slots(self) -> int:
    return len(self.arena)

  @property
  def nbytes(self) -> int:
    return self.arena.nbytes

  def frames(self) -> np.ndarray:
    """The arena as rows of frames: slot s, row r is frame s * rows + r."""
    return self.arena.reshape((-1,) + self.arena.shape[2:])

  def _take_slot(self):
    """A free slot, or the least recently used unpinned one (evicted)."""
    if self._free:
      return self._free.pop()
    if self._used < self.num_slots:
      self._used += 1
      return self._used - 1
    for key, slot in self._slot_of.items():
      if not self._pins[slot] and key not in self._loading:
        del self._slot_of[key]
        del self._key_of[slot]
        return slot
    raise RuntimeError(
      f'all {self.num_slots} cache slots are pinned: the cache is too small '
      'for the batches being prepared at once'
    )

  def acquire(
    self,
    keys: Iterable[int],
    load: Callable[[np.ndarray, np.ndarray, np.ndarray], object],
  ) -> np.ndarray:
    """Pins the blocks of `keys`, decoding the missing ones.

    Args:
      keys: iterable of distinct ints.
      load: function(keys, slots, arena) that decodes block keys[i] into
        arena[slots[i]] (int64 arrays; all the missing blocks of a call at
        once, so a compiled decoder runs once); called outside the lock.

    Returns:
      int64 array of the slots holding each key's block; release() them.

    Raises:
      Whatever `load` raises; nothing stays pinned then.
    """
    keys = [int(k) for k in keys]
    slots = np.empty(len(keys), dtype=np.int64)
    to_load, to_wait = [], []
    with self._lock:
      for i, key in enumerate(keys):
        slot = self._slot_of.get(key)
        if slot is None:
          try:
            slot = self._take_slot()
          except RuntimeError:
            self._abandon(to_load)
            self._unpin(slots[:i])
            raise
          self._slot_of[key] = slot
          self._key_of[slot] = key
          self._loading.add(key)
          to_load.append((key, slot))
          self.misses += 1
        else:
          self._slot_of.move_to_end(key)
          if key in self._loading:
            to_wait.append((key, slot))
          self.hits += 1
        self._pins[slot] += 1
        slots[i] = slot
    try:
      self._load_all(to_load, load)
      for key, slot in to_wait:
        self._wait_for(key, slot, load)
    except BaseException:
      self.release(slots)
      raise
    return slots

  def _load_all(self, to_load, load):
    """Decodes blocks into their reserved slots, then publishes them.

    If the decode fails, none of these blocks is kept.
    """
    if not to_load:
      return
    keys, slots = np.array(to_load, dtype=np.int64).T
    try:
      load(keys, slots, self.arena)
    except BaseException:
      with self._lock:
        self._abandon(to_load)
      raise
    with self._lock:
      self._publish(to_load)

  def _publish(self, entries) -> None:
    """Marks decoded blocks ready and wakes their waiters (lock held)."""
    for key, _ in entries:
      self._loading.discard(key)
    self._decoded.notify_all()

  def _abandon(self, entries) -> None:
    """Forgets reserved slots whose blocks were not decoded (lock held)."""
    for key, slot in entries:
      if self._slot_of.get(key) == slot:
        del self._slot_of[key]
        del self._key_of[slot]
      self._loading.discard(key)
    self._decoded.notify_all()

  def _wait_for(self, key, slot, load) -> None:
    """Waits for another thread's decode of `key`; redoes it if it failed."""
    with self._lock:
      self._decoded.wait_for(lambda: key not in self._loading)
      if self._key_of.get(slot) == key:
        return
    # The other thread failed: decode here (raising the same error, or
    # succeeding if the failure was passing).
    load(np.array([key]), np.array([slot]), self.arena)
    with self._lock:
      if slot not in self._key_of and key not in self._slot_of:
        self._key_of[slot] = key
        self._slot_of[key] = slot

  def _unpin(self, slots) -> None:
    for slot in slots:
      self._pins[slot] -= 1
      if not self._pins[slot] and slot not in self._key_of:
        self._free.append(slot)

  def release(self, slots: np.ndarray) -> None:
    """Unpins slots returned by acquire()."""
    with self._lock:
      self._unpin(int(s) for s in slots)
