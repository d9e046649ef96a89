"""A minibatch as PyTorch tensors, and how a DataLoader worker's travels.

`fixed_replay.torch`'s datasets yield whole minibatches (`Minibatch`, which
DataLoader's default collation refuses rather than add a dimension). In the
training process a batch becomes tensors that share the buffer's arrays
(`to_tensors`); from a DataLoader worker it travels through a ring of
shared-memory slots the worker's buffer samples straight into
(`sender`): only the slot's place is pickled.

This module imports torch; the rest of the library never imports it.
"""

import contextlib
import itertools
import math
import mmap
import multiprocessing.util
import os
import signal
import threading
import weakref

import numpy as np
import torch
from torch.utils.data._utils import collate

from fixed_replay.replay import transitions

# Where worker batches travel; DataLoader's own path is taken where it is
# missing (not Linux).
SHARED_DIR = '/dev/shm'
# Slots of a worker's ring: DataLoader keeps prefetch_factor (2) batches of a
# worker in flight and a training loop holds one or two; a batch that finds
# every slot still held travels DataLoader's own way instead.
_SLOTS = 8
# Element offsets in a slot, so that every dtype's view is aligned.
_ALIGN = 64
# The ring's header: one in-use byte a slot, then the worker's exit byte.
_HEADER = _ALIGN
_EXITED = _HEADER - 1
# Elements holding frame stacks, which Dopamine puts last, and the axis
# `channels_first` moves the stack to (after the batch and time axes).
_STACK_AXIS = {'state': 1, 'next_state': 1, 'observation': 2}

_names = itertools.count()
# This process's worker ring, made with its first batch (one per worker
# process, so persistent workers reuse it across passes).
_worker_ring = None
# The rings of workers this (training) process has mapped: name -> mmap.
_mapped_rings = {}


class _SlotRing:
  """A worker's minibatch slots, in one shared-memory file.

  DataLoader would give every tensor of a batch its own shared-memory
  segment and send each over a socket (tens of ms of CPU a batch, more than
  sampling it). Instead the worker's buffer writes each batch straight into a
  free slot of this ring (its `allocate_batch`), and only (ring, slot,
  layout) travels; the training process maps the ring once and hands out
  tensors that are views of the slot, whose in-use byte it clears when the
  last of them is collected. Neither process copies a batch, and the slots'
  pages stay mapped, so no batch pays for fresh memory either.
  """

  def __init__(self, layout, slot_bytes, channels_first):
    self.layout = layout
    self.slot_bytes = slot_bytes
    # Stacks the buffer writes channels last: sent moved, so written aside.
    self._moved = {n for n, *_ in layout if channels_first and n in _STACK_AXIS}
    self._indices_at = next(o for n, _, _, o in layout if n == 'indices')
    self.name = f'fixed_replay_{os.getpid()}_{next(_names)}'
    self.path = os.path.join(SHARED_DIR, self.name)
    descriptor = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
      os.ftruncate(descriptor, _HEADER + _SLOTS * slot_bytes)
      self._map = mmap.mmap(descriptor, 0)
    finally:
      os.close(descriptor)
    self._bytes = np.frombuffer(self._map, np.uint8)
    self._in_use = self._bytes[:_HEADER]
    self._views = [
      _slot_views(self._bytes[_HEADER + slot * slot_bytes :], layout)
      for slot in range(_SLOTS)
    ]
    self._claim_lock = threading.Lock()  # Sampling threads claim slots.
    self._next = 0
    # The training process unlinks the ring when it maps it; one it never
    # mapped goes with this worker (DataLoader drops batches still queued at
    # shutdown unread).
    multiprocessing.util.Finalize(self, self.close, exitpriority=0)

  def _claim(self):
    with self._claim_lock:
      free = np.flatnonzero(self._in_use[:_SLOTS] == 0)
      if not len(free):
        return None
      slot = int(free[np.searchsorted(free, self._next) % len(free)])
      self._in_use[slot] = 1
      self._next = (slot + 1) % _SLOTS
      return slot

  def allocate(self, elements):
    """The buffer's batch arrays: a free slot's, else fresh ones."""
    fits = [(e.name, np.dtype(e.type).str) for e in elements] == [
      (name, dtype) for name, dtype, _, _ in self.layout
    ]
    slot = self._claim() if fits else None
    if slot is None:
      return transitions.empty_batch(elements)
    views = self._views[slot]
    batch = {}
    for element in elements:
      if element.name in self._moved:
        batch[element.name] = np.empty(element.shape, element.type)
      else:
        batch[element.name] = views[element.name]
    return batch

  def send(self, named, channels_first):
    """What carries `named` to the training process.

    Its place in the ring when the buffer wrote it there, else its tensors
    (DataLoader's own way).
    """
    offset = named['indices'].ctypes.data - self._bytes.ctypes.data - _HEADER
    slot, within = divmod(offset, self.slot_bytes)
    if not 0 <= slot < _SLOTS or within != self._indices_at:
      return to_tensors(named, channels_first)
    views = self._views[slot]
    for name in self._moved:
      np.copyto(views[name], _moved(name, named[name], channels_first))
    start = _HEADER + slot * self.slot_bytes
    return _SharedBatch(self.name, start, self.slot_bytes, slot, self.layout)

  def close(self) -> None:
    self._in_use[_EXITED] = 1
    with contextlib.suppress(FileNotFoundError):
      os.unlink(self.path)


def _moved(name, array, channels_first):
  if channels_first and name in _STACK_AXIS:
    # Dopamine stacks frames last (B, H, W, stack); convolutions in
    # PyTorch want the stack as channels (B, stack, H, W).
    return np.moveaxis(array, -1, _STACK_AXIS[name])
  return array


class _SharedBatch:
  """A batch in a worker's ring, as it travels: its place, not its bytes."""

  def __init__(self, ring, start, size, slot, layout):
    self.place = (ring, start, size, slot, layout)

  def __reduce__(self):
    return _batch_in_ring, self.place


def _batch_in_ring(ring, start, size, slot, layout):
  """The training process's tensors of a batch in a worker's ring."""
  ring_map = _mapped_rings.get(ring)
  if ring_map is None:
    for name, old in list(_mapped_rings.items()):
      if old[_EXITED]:  # That worker is gone; its batches keep the map.
        del _mapped_rings[name]
    path = os.path.join(SHARED_DIR, ring)
    descriptor = os.open(path, os.O_RDWR)
    try:
      ring_map = _mapped_rings[ring] = mmap.mmap(descriptor, 0)
    finally:
      os.close(descriptor)
    os.unlink(path)  # Mapped by both: nothing is left behind if either dies.
  slot_bytes = np.frombuffer(ring_map, np.uint8, size, start)
  # Every tensor below is a view of slot_bytes (numpy keeps it as their
  # base), so it is collected with the last of them: the slot is free again.
  weakref.finalize(slot_bytes, ring_map.__setitem__, slot, 0)
  return Minibatch(
    (name, torch.from_numpy(view))
    for name, view in _slot_views(slot_bytes, layout).items()
  )


def _slot_views(slot_bytes, layout):
  """{name: array} of a slot's elements, views of its bytes."""
  return {
    name: slot_bytes[offset : offset + _nbytes(dtype, shape)]
    .view(dtype)
    .reshape(shape)
    for name, dtype, shape, offset in layout
  }


def _nbytes(dtype, shape):
  return np.dtype(dtype).itemsize * math.prod(shape)


def _layout(elements, channels_first):
  """((name, dtype, shape, offset), ...) of a slot, and its size."""
  layout, offset = [], 0
  for element in elements:
    shape = tuple(element.shape)
    if channels_first and element.name in _STACK_AXIS:
      axis = _STACK_AXIS[element.name]
      shape = shape[:axis] + shape[-1:] + shape[axis:-1]
    dtype = np.dtype(element.type)
    layout.append((element.name, dtype.str, shape, offset))
    offset += -(-_nbytes(dtype, shape) // _ALIGN) * _ALIGN
  return tuple(layout), max(offset, _ALIGN)


class Minibatch(dict):
  """A dataset item: one whole minibatch, {element name: tensor}.

  A dict in every way but one: DataLoader's default collation refuses it.
  Left to collate items (its default `batch_size=1`), a DataLoader would
  silently add a leading dimension of 1 to every tensor.
  """


def _refuse_collation(batch, *, collate_fn_map=None):
  raise TypeError(
    'A ReplayDataset item is already a whole minibatch: give the DataLoader '
    '`batch_size=None`, e.g. DataLoader(dataset, batch_size=None, '
    "num_workers=2) (set the minibatch size with the dataset's batch_size)"
  )


def to_tensors(named: dict[str, np.ndarray], channels_first: bool) -> Minibatch:
  """A named batch as tensors (stacks moved first if `channels_first`)."""
  return Minibatch(
    (
      name,
      torch.from_numpy(np.ascontiguousarray(_moved(name, a, channels_first))),
    )
    for name, a in named.items()
  )


def _ring_for(buffer, channels_first):
  """This worker's ring, set up as `buffer`'s batch allocator."""
  global _worker_ring
  layout, slot_bytes = _layout(buffer.get_transition_elements(), channels_first)
  if _worker_ring is None or _worker_ring.layout != layout:
    _worker_ring = _SlotRing(layout, slot_bytes, channels_first)
    _close_on_sigterm(_worker_ring)
  buffer.allocate_batch = _worker_ring.allocate
  return _worker_ring


def _close_on_sigterm(ring):
  """Removes `ring` when its worker is terminated.

  A DataLoader's process terminates (SIGTERM) the workers still alive when
  it exits, say after an error left its iterator unclosed. torch's own
  handler in a worker exits at once (`_exit(0)`, so that the parent does not
  report a killed worker), running no finalizer: a ring the training process
  never mapped would stay in SHARED_DIR. This handler, which replaces it
  (only `sender` calls it, in a worker's main thread), closes the ring and
  then exits as torch's does.
  """
  if threading.current_thread() is not threading.main_thread():
    return  # Only the main thread may set handlers; its finalizer stays.

  def on_sigterm(unused_signum, unused_frame):
    ring.close()
    os._exit(0)  # What torch's worker handler does.

  signal.signal(signal.SIGTERM, on_sigterm)


def sender(buffer, channels_first):
  """What a worker sends a batch of `buffer` with: its ring's slots, where
  there is shared memory, else DataLoader's own way (to_tensors)."""
  if not os.path.isdir(SHARED_DIR):
    return to_tensors
  return _ring_for(buffer, channels_first).send


# default_collate looks an item's type up in this map first (the hook
# torch's `collate` documents), so a worker collating the items it sends, or
# the training process collating num_workers=0 items, gets the error.
for _item_type in (Minibatch, _SharedBatch):
  collate.default_collate_fn_map[_item_type] = _refuse_collation
