"""The buffer's exact minibatches as a PyTorch IterableDataset.

PyTorch offline-RL code (CleanRL-style scripts, d3rlpy, TorchRL loops) reads
data through `torch.utils.data.DataLoader`. `ReplayDataset` puts any
directory the buffers read (Dopamine checkpoints or a compact store) behind
that interface without changing what is sampled: every item is one minibatch
the buffer itself drew, so transitions are Dopamine's bit for bit.

Why it is built the way it is:

* Each item is a whole minibatch (use `DataLoader(dataset, batch_size=None)`):
  the buffer draws and gathers a minibatch in one vectorized pass; letting
  the loader collate single transitions would be ~100x slower. A DataLoader
  left to collate items raises a TypeError saying so, instead of adding a
  dimension.
* The buffer is built once in the training process when the dataset is
  created, so a bad path or argument fails there with the buffer's own
  error, and that buffer serves `num_workers=0`. Each DataLoader worker builds
  its own buffer (threads and file handles do not survive a fork) seeded
  from the dataset seed and its worker id, so workers never repeat each other
  and a seed reproduces the whole stream for a given number of workers.
* A worker that fails raises a `RuntimeError` naming the data, the worker and
  the buffer's own error; DataLoader re-raises it in the training process.

This module imports torch; the rest of the library never imports it.
"""

from collections.abc import Iterator
import contextlib
import dataclasses
import itertools
import math
import mmap
import multiprocessing.util
import os
import tempfile
import threading
from typing import Any
import weakref

from absl import logging
import numpy as np
import torch
from torch.utils import data
from torch.utils.data._utils import collate

from fixed_replay import batches
from fixed_replay import mixture
from fixed_replay import ranks
from fixed_replay import segments
from fixed_replay.replay import fixed_replay_buffer
from fixed_replay.replay import transitions

# Where worker batches travel; DataLoader's own path is taken where it is
# missing (not Linux).
_SHARED_DIR = '/dev/shm'
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
# Pass-count slots a rank (DataLoader workers of one process at most).
_WORKERS = 4096
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
    self.path = os.path.join(_SHARED_DIR, self.name)
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
    path = os.path.join(_SHARED_DIR, ring)
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
  buffer.allocate_batch = _worker_ring.allocate
  return _worker_ring


def _remove_made_here(pid, path):
  # A forked worker inherits the finalizer: only the maker removes the file.
  if os.getpid() == pid:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(path)


class _PassCounts:
  """How many passes each DataLoader worker of a dataset has begun.

  A worker that is not persistent is a new process every pass, holding the
  dataset as it was built; it learns its pass number here, so that each pass
  draws a new stream of the seed (and a rerun the same ones). One 8-byte
  count a worker, in a file named by its path (the dataset pickles
  anywhere); the process that made it removes it.
  """

  def __init__(self):
    try:
      descriptor, self.path = tempfile.mkstemp(
        '_passes', 'fixed_replay_', _SHARED_DIR
      )
    except OSError:  # No /dev/shm to write in: the temporary directory.
      descriptor, self.path = tempfile.mkstemp('_passes', 'fixed_replay_')
    os.close(descriptor)
    weakref.finalize(self, _remove_made_here, os.getpid(), self.path)

  def count(self, worker: int, passes: int | None = None) -> int:
    """The passes `worker` has begun; with `passes`, sets them first."""
    try:
      descriptor = os.open(self.path, os.O_RDWR)
    except FileNotFoundError:  # Another host's copy of the dataset.
      logging.log_first_n(
        logging.WARNING,
        'No pass count at %s (a dataset from another host, or its maker is '
        'gone): new workers draw their first pass again',
        1,
        self.path,
      )
      return passes or 0
    try:  # Past the end of the file, a count reads as 0.
      if passes is not None:
        os.pwrite(descriptor, int(passes).to_bytes(8, 'little'), 8 * worker)
      return int.from_bytes(os.pread(descriptor, 8, 8 * worker), 'little')
    finally:
      os.close(descriptor)


@dataclasses.dataclass
class _Source:
  """What samples one process's stream of a dataset, and how far it is."""

  sampler: Any
  worker: int | None  # None: the training process's own.
  num_workers: int = 1
  pass_number: int = 0
  yielded: int = 0  # Batches of this pass.
  drawn: int = 0  # Batches drawn, every pass.


class ReplayDataset(data.IterableDataset):
  """Minibatches of a replay directory, as dicts of tensors.

  Example:

    dataset = ReplayDataset('/data/Pong/1/replay_logs', batch_size=32,
                            seed=0, channels_first=True)
    loader = DataLoader(dataset, batch_size=None, num_workers=2,
                        pin_memory=True)
    for batch in loader:  # endless unless num_batches is given
      batch['state']  # uint8 (32, 4, 84, 84)

  Items hold Dopamine's elements under its names (`state`, `action`,
  `reward`, `next_state`, `next_action`, `next_reward`, `terminal`,
  `indices`, any extra storage element, then `suffix`: the checkpoint of
  each transition), with the buffer's dtypes.

  Every pass over a loader draws new batches: with no workers or persistent
  ones, each stream goes on where the last pass left it; a worker that is
  not persistent draws pass p's own stream of the seed. A rerun with the
  same seed repeats every pass. Under torchdata's StatefulDataLoader the
  loader's `state_dict()` holds each stream's place, and a run resumed from
  it draws exactly what the uninterrupted run draws.
  """

  def __init__(
    self,
    data_dir: str,
    channels_first: bool = False,
    num_batches: int | None = None,
    reload_every: int | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    **buffer_arguments: Any,
  ):
    """Builds (and so checks) the buffer in this process.

    Args:
      data_dir: str, Dopamine checkpoints (local or gs://) or a compact
        store.
      channels_first: bool, give `state` and `next_state` as (B, stack,
        *observation_shape) instead of Dopamine's (B, *observation_shape,
        stack).
      num_batches: int or None, minibatches per pass over the loader, shared
        among its workers (None: endless).
      reload_every: int or None, call the buffer's `reload_buffer()` after
        every this many minibatches of the loader, whatever its workers
        (FixedReplayBuffer then swaps in another set of checkpoints, as
        Dopamine's runner does once an iteration); None never reloads.
      rank, world_size: ints or None, this process's data-parallel place
        among those training one model (under tensor or pipeline
        parallelism, its data-parallel group's rank and size). None: found
        when each pass starts (ranks.current: torch.distributed's or JAX's
        once initialised, else torchrun's RANK and WORLD_SIZE), so a
        dataset built before `init_process_group` still takes its rank.
        Each rank, and each of its workers, draws its own stream of the
        seed (ranks.rank_seed); batch_size is the rank's share of the
        global batch.
      **buffer_arguments: the buffer's arguments (batch_size, stack_size,
        observation_shape, update_horizon, gamma, seed, replay_capacity,
        subsample, ...). With `seed=None` the seed is drawn once, here, from
        torch's generator (`torch.manual_seed(s)` before building the
        dataset repeats the run, with or without workers); several ranks
        must pass one.

    Raises:
      CheckpointError, ValueError, TypeError, MemoryError: the buffer's own
        error for a directory it cannot read or arguments it refuses.
      ValueError: for seed=None on one of several ranks.
    """
    super().__init__()
    if num_batches is not None and num_batches < 0:
      raise ValueError(f'num_batches must be >= 0, got {num_batches}')
    if reload_every is not None and reload_every < 1:
      raise ValueError(f'reload_every must be >= 1, got {reload_every}')
    self.data_dir = str(data_dir)
    self.channels_first = bool(channels_first)
    self.num_batches = num_batches
    self.reload_every = reload_every
    self._given_place = None if rank is None else (rank, world_size)
    self._found_place = None  # Where the loader started a spawned worker.
    self.rank, self.world_size = ranks.current(rank, world_size)
    self._seed_given = buffer_arguments.get('seed') is not None
    if not self._seed_given:
      ranks.seeded(buffer_arguments, self.rank, self.world_size)  # Refuses.
      seed = int(torch.randint(2**62, ()).item())
      buffer_arguments = {**buffer_arguments, 'seed': seed}
    self._arguments = buffer_arguments
    self._seed_for_place()
    self._passes = _PassCounts()
    self._closed = False
    self._resumed = None  # A state to go on from (load_state_dict).
    self._source = _Source(self._open(self.buffer_arguments), None)
    buffer = getattr(self._source.sampler, 'buffer', self._source.sampler)
    if getattr(buffer, 'kind', None) == fixed_replay_buffer.DOPAMINE:
      # Checked; its checkpoints, in RAM, go: workers load their own, and
      # this process loads them again only if it samples itself.
      buffer.close()
      self._source = None

  def _seed_for_place(self):
    self.buffer_arguments = ranks.seeded(
      self._arguments, self.rank, self.world_size
    )
    self.seed = self.buffer_arguments['seed']

  def _open(self, arguments):
    """What samples the batches, built with `arguments`."""
    return batches.open_buffer(self.data_dir, arguments)

  def _sample(self, buffer):
    """One named batch of `buffer`."""
    return batches.named(buffer, buffer.sample_transition_batch())

  def _take_place(self) -> bool:
    """Takes the place found now; whether it moved since the last."""
    given = self._given_place or (None, None)
    built = self._found_place or (self.rank, self.world_size)
    place = ranks.current(*given, otherwise=built)
    if place == (self.rank, self.world_size):
      return False
    logging.warning(
      'The dataset of %s was built as rank %d of %d and samples as rank %d '
      'of %d, the place found now (pass rank and world_size to choose it)',
      self.data_dir,
      self.rank,
      self.world_size,
      *place,
    )
    self.rank, self.world_size = place
    if not self._seed_given and self.world_size > 1:
      ranks.seeded({}, *place)  # Refuses: each rank drew its own seed.
    self._seed_for_place()
    return True

  @property
  def buffer(self) -> Any:
    """The buffer of this process's stream (serves num_workers=0)."""
    return self._own_source().sampler

  def _own_source(self, moved=False):
    """The training process's stream (its buffer built again where the
    place moved, or where it was let go)."""
    if self._closed:
      raise RuntimeError(f'ReplayDataset of {self.data_dir} is closed')
    if self._source is None or moved:
      return self._new_source()
    return self._source

  def _new_source(self, worker=None, pass_number=0):
    """This process's new stream, in place of its last (a forked worker
    leaves its parent's, worker None, alone)."""
    if self._source is not None and self._source.worker == worker:
      self._source.sampler.close()
    arguments = self.buffer_arguments
    if worker is not None:
      arguments = self.worker_arguments(worker, pass_number)
    self._source = _Source(
      self._open(arguments), worker, pass_number=pass_number
    )
    return self._source

  def worker_arguments(
    self, worker_id: int, pass_number: int = 0
  ) -> dict[str, Any]:
    """The buffer arguments of DataLoader worker `worker_id`'s pass.

    Its seed is the rank's seed's stream `worker_id` (and `pass_number`,
    after the first pass). It has no sampling thread: the workers are the
    parallelism, and a thread in each only adds a hand-off per batch. The
    subsample stays the dataset seed's (ranks.seeded): every worker's.
    """
    stream = (worker_id, pass_number) if pass_number else (worker_id,)
    seed = batches.stream_seed(self.seed, *stream)
    return {'sampling_threads': 0, **self.buffer_arguments, 'seed': seed}

  def __iter__(self) -> Iterator[Minibatch]:
    moved = self._take_place()
    info = data.get_worker_info()
    if info is None:
      source, send = self._own_source(moved), to_tensors
    else:
      slot = self.rank * _WORKERS + info.id
      pass_number = self._passes.count(slot)
      self._passes.count(slot, pass_number + 1)
      source = self._source
      if source is None or source.worker is None or moved:
        # A new worker (every pass, unless persistent): its own buffer.
        source = self._new_source(info.id, pass_number)
      source.pass_number, source.num_workers = pass_number, info.num_workers
      send = to_tensors
      if os.path.isdir(_SHARED_DIR):
        send = _ring_for(source.sampler, self.channels_first).send
    source.yielded = 0
    if self._resumed is not None:
      state, self._resumed = self._resumed, None
      source.sampler.load_state_dict(state['sampler'])
      source.pass_number = int(state['pass'])
      source.yielded, source.drawn = int(state['yielded']), int(state['drawn'])
      if source.worker is not None:
        slot = self.rank * _WORKERS + source.worker
        self._passes.count(slot, source.pass_number + 1)
    return self._stream(source, send)

  def _stream(self, source, send):
    """The batches of a pass (set up already: a generator runs late)."""
    workers, every = source.num_workers, self.reload_every
    share = batches.stream_share(self.num_batches, source.worker or 0, workers)
    try:
      while share is None or source.yielded < share:
        # Every `reload_every` batches of the loader: its workers take
        # turns, so worker w's j-th batch is about the loader's j * n + w-th.
        at = source.drawn * workers + (source.worker or 0)
        if every and source.drawn and at // every > (at - workers) // every:
          source.sampler.reload_buffer()
        named = self._sample(source.sampler)
        source.drawn += 1
        source.yielded += 1
        yield send(named, self.channels_first)
    except Exception as error:
      if source.worker is None:
        raise
      # DataLoader re-raises this in the training process, where the user
      # needs to know which data failed and why, not only the traceback.
      raise RuntimeError(
        f'DataLoader worker {source.worker} of {workers} reading '
        f'{self.data_dir} failed: {type(error).__name__}: {error}'
      ) from error

  def state_dict(self) -> dict:
    """This process's stream after its last batch, as plain numbers.

    torchdata's Stateful protocol: a StatefulDataLoader saves it (each
    worker's, with every batch) and gives it back to `load_state_dict`,
    after which the next pass goes on from the batch after the saved one.
    """
    source = self._source if data.get_worker_info() else self._own_source()
    return {
      'pass': source.pass_number,
      'yielded': source.yielded,
      'drawn': source.drawn,
      'sampler': source.sampler.state_dict(),
    }

  def load_state_dict(self, state: dict) -> None:
    """Makes the next pass go on from the place `state_dict()` gave."""
    self._resumed = state

  def close(self) -> None:
    """Releases the buffer built in this process (and its threads)."""
    self._closed = True
    if self._source is not None:
      self._source.sampler.close()
      self._source = None

  def __getstate__(self):
    # A spawned worker builds its own buffer; this one does not travel. The
    # place travels as found now, when the loader starts its workers.
    state = self.__dict__.copy()
    state['_source'], state['_closed'] = None, False
    if self._given_place is None:  # A spawned worker finds no place itself.
      state['_found_place'] = ranks.current(
        otherwise=(self.rank, self.world_size)
      )
    return state


class SegmentDataset(ReplayDataset):
  """Batches of segments for sequence models, as dicts of tensors.

  Example:

    dataset = SegmentDataset('/data/Pong/1/replay_logs', segment_length=30,
                             batch_size=128, seed=0, channels_first=True)
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    for batch in loader:
      batch['observation']   # uint8 (128, 30, 4, 84, 84)
      batch['return_to_go']  # float32 (128, 30)

  Items hold fixed_replay.segments.SegmentSampler's elements; its
  `**buffer_arguments` are the sampler's arguments (segment_length,
  batch_size, pad_short, ..., and the buffer's). Workers, seeds, reloads and
  errors follow ReplayDataset's rules.
  """

  def _open(self, arguments):
    return segments.SegmentSampler(self.data_dir, **arguments)

  def _sample(self, sampler):
    return sampler.sample()


class MixtureDataset(ReplayDataset):
  """Batches of many games and runs (fixed_replay.ReplayMixture), as tensors.

  Example:

    dataset = MixtureDataset('/data', games=['Pong', 'Breakout'],
                             action_space='full', batch_size=32, seed=0)
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    for batch in loader:
      batch['state'], batch['action'], batch['game_id']

  `data` and `**buffer_arguments` are ReplayMixture's (a root or a mapping
  {game: runs}, games, runs, weights, action_space, segment_length,
  batch_size, and every run's buffer arguments). Workers, seeds, reloads
  and errors follow ReplayDataset's rules: `reload_every` reloads every
  run of each worker's mixture, which otherwise reloads on its own
  schedule (ReplayMixture's `reload_every`).
  """

  def __init__(self, data, *args, **kwargs):
    self.data = data  # A mapping of runs, kept as it is for the workers.
    super().__init__(str(data), *args, **kwargs)

  def _open(self, arguments):
    return mixture.ReplayMixture(self.data, **arguments)

  def _sample(self, sampler):
    return sampler.sample()


# default_collate looks an item's type up in this map first (the hook
# torch's `collate` documents), so a worker collating the items it sends, or
# the training process collating num_workers=0 items, gets the error.
for _item_type in (Minibatch, _SharedBatch):
  collate.default_collate_fn_map[_item_type] = _refuse_collation
