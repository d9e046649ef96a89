"""The read-only replay core every buffer of this library is built on.

`ReplayCore` owns what a buffer over a fixed dataset does whatever holds its
data: the argument checks, the element signature, Dopamine's
`sample_transition_batch` and the JAX `sample()`, the read-only
`add`/`save`/`load`, suffix lookups and the optional batch prefetcher. It is
composed from three parts, in the spirit of Dopamine's JAX replay (a buffer
given its sampling distribution) and TorchRL's storage/sampler split:

* the *rotation* (checkpoint_sets.SetRotation): which checkpoints are held
  now and next; a reload may make another source current at any time (one
  assignment: samplers see the old source or the new one, never a mix);
* the *sampler* (samplers.py): which valid transitions a minibatch holds;
* the *storage*, the current frame source (frame_sources.py): the held
  checkpoints' valid-row table, and their data written into a batch through
  the assembler (transitions.py).

A subclass (fixed_replay_buffer.py) chooses the checkpoints and builds the
rotation.
"""

import contextlib
import functools
import inspect
import weakref

import numpy as np

from fixed_replay import prefetch
from fixed_replay import stream_state
from fixed_replay.replay import buffer_arguments
from fixed_replay.replay import checkpoint_sets
from fixed_replay.replay import frame_sources
from fixed_replay.replay import replay_shard
from fixed_replay.replay import samplers
from fixed_replay.replay import transitions

# What transition_elements takes besides the batch size, all BufferArguments.
_SIGNATURE = tuple(
  inspect.signature(transitions.transition_elements).parameters
)[1:]


def _sample_into(source, draw, rng, elements, allocate):
  """One minibatch drawn from `source` and written where `allocate` says."""
  which, rows = draw(source.table, rng, elements[0].shape[0])
  batch = allocate(elements)
  source.write(batch, which, rows, np.arange(len(rows)))
  return batch


def _sample_current(buffer_ref, draw, rng, elements):
  """A sampling thread's work: one minibatch of the buffer's current source,
  and the thread's generator state after drawing it (the stream's place once
  the batch is handed out).

  The buffer is held weakly, so an abandoned buffer can be collected; its
  threads then stop on the error raised here.
  """
  buffer = buffer_ref()
  if buffer is None:
    raise RuntimeError('the buffer of this sampling thread is gone')
  source = buffer._current()  # noqa: SLF001  (the buffer's own thread)
  allocate = buffer.allocate_batch
  del buffer
  batch = _sample_into(source, draw, rng, elements, allocate)
  return batch, rng.bit_generator.state


class ReplayCore:
  """Samples a fixed dataset with Dopamine's buffer API; never writes."""

  def __init__(
    self, arguments: buffer_arguments.BufferArguments, rng: np.random.Generator
  ) -> None:
    """Keeps the arguments every buffer shares.

    Args:
      arguments: BufferArguments, checked when they were built; their
        data_dir is the directory sampled.
      rng: np.random.Generator that sampling draws from.
    """
    self._arguments = arguments
    self._elements_by_batch_size = {}
    self._draw = samplers.for_mix_checkpoints(arguments.mix_checkpoints)
    self._rng = rng
    # What is sampled now and next: set by the subclass.
    self._rotation: checkpoint_sets.SetRotation | None = None
    self._batches = None  # BatchPrefetcher of default-size batches.
    self._batch_threads = None  # (generators, depth) of the threads to start.
    # The sampling thread's generator state after the last batch handed out:
    # batches it drew ahead are not yet part of the stream.
    self._handed_out = None
    self.sampling_threads = 0
    # Where sampled batches are written: callable(elements) -> {name: array}
    # of each element's shape and dtype (C order), called from the sampling
    # threads. A DataLoader worker points it at shared memory
    # (fixed_replay/torch.py), so batches are written where they travel.
    self.allocate_batch = transitions.empty_batch

  # --------------------------------------------------------- for subclasses

  def _current(self) -> frame_sources.FrameSource:
    """The source to sample from now (waits while a reload has none)."""
    return self._rotation.current()

  def _use_sampling_threads(self, seed_sequence, num_threads, depth):
    """Default-size batches will be prepared by `num_threads` threads.

    They start with the first sample; each draws from its own generator
    (spawned from `seed_sequence`) over the source current at each draw.
    """
    rngs = [
      np.random.default_rng(seq)
      for seq in seed_sequence.spawn(1)[0].spawn(num_threads)
    ]
    self._batch_threads = (rngs, depth)
    self._handed_out = rngs[0].bit_generator.state
    self.sampling_threads = num_threads

  def _start_batch_threads(self):
    rngs, depth = self._batch_threads
    elements = self.get_transition_elements()
    fns = [
      functools.partial(
        _sample_current, weakref.ref(self), self._draw, rng, elements
      )
      for rng in rngs
    ]
    self._batches = prefetch.BatchPrefetcher(
      fns, depth=depth, name=f'{type(self).__name__}_sampling'
    )

  @contextlib.contextmanager
  def _batches_paused(self):
    """Holds the sampling threads off while the source changes.

    Batches drawn ahead are dropped, and one sampling thread draws again
    from where the last batch handed out left it: which rows follow a change
    depends on the batches taken, not on how far the thread had run ahead.
    """
    if self._batches is None:
      yield
      return
    with self._batches.paused():
      yield
      rngs, _ = self._batch_threads
      if len(rngs) == 1:
        rngs[0].bit_generator.state = self._handed_out

  def state_dict(self) -> dict:
    """The stream's place after the last batch handed out (plain numbers).

    `load_state_dict` on a buffer built with the same arguments makes it
    draw, from then on, what this one draws next (stream_state.py).

    Raises:
      ValueError: with several sampling threads, whose batches come out in
        no fixed order.
    """
    state = {'rng': stream_state.place(self._rng), **self._rotation.state()}
    if self._batch_threads is not None:
      if len(self._batch_threads[0]) > 1:
        raise ValueError(
          f'{self.sampling_threads} sampling threads hand out batches in no '
          'fixed order, so the stream has no place to save: build the '
          'buffer with sampling_threads=1 (or 0)'
        )
      state['sampler'] = stream_state.place(self._handed_out)
    return state

  def load_state_dict(self, state: dict) -> None:
    """Continues the stream from the place `state_dict()` gave.

    Raises:
      ValueError: if `state` is not a state of a buffer built like this one.
    """
    threaded = self._batch_threads is not None
    if threaded and len(self._batch_threads[0]) > 1:
      self.state_dict()  # Raises: several threads have no place.
    self._rotation.load_state(state, self._batches_paused)
    if ('sampler' in state) != threaded:
      raise ValueError(
        f'a stream state {"with" if "sampler" in state else "without"} a '
        f'sampling thread, for a buffer of {self.data_dir} '
        f'{"with" if threaded else "without"} one: build it with the '
        "arguments of the run that saved it"
      )
    with self._batches_paused():
      stream_state.move(self._rng, state['rng'])
      if threaded:
        self._handed_out = stream_state.generator_state(state['sampler'])
        self._batch_threads[0][0].bit_generator.state = self._handed_out

  def close(self) -> None:
    """Stops the batch threads and background loading, closes the source."""
    if self._batches is not None:
      self._batches.close()
      self._batches = None
    self._batch_threads = None
    if self._rotation is not None:
      self._rotation.close()

  # ------------------------------------------------------------ properties

  @property
  def data_dir(self) -> str:
    """The directory sampled (a checkpoint folder or a compact store)."""
    return self._arguments.data_dir

  @property
  def batch_size(self) -> int:
    return self._arguments.batch_size

  @property
  def replay_capacity(self) -> int:
    """Rows used per checkpoint (a window may hold fewer, see the log)."""
    return self._arguments.replay_capacity

  @property
  def source(self) -> frame_sources.FrameSource:
    """The frame source sampled now (a reload publishes another)."""
    return self._current()

  @property
  def loaded_suffixes(self) -> list[int]:
    """Suffixes of the checkpoints currently sampled from."""
    return list(self._current().table.suffixes)

  @property
  def add_count(self) -> np.ndarray:
    """Rows currently sampled from (Dopamine agents compare it to a minimum)."""
    return np.array(self._current().num_rows)

  @property
  def num_valid_transitions(self) -> int:
    return self._current().table.total

  @property
  def nbytes(self) -> int:
    """Bytes the held data takes (windows in RAM, or a store's indexes)."""
    return self._current().nbytes

  @property
  def rotates(self) -> bool:
    """Whether reload_buffer swaps in other checkpoints (some are not held)."""
    return self._rotation.rotates

  @property
  def rolling(self) -> bool:
    """Whether the last refresh replaced loaded checkpoints one at a time."""
    return self._rotation.rolling

  def get_transition_elements(self, batch_size: int | None = None) -> tuple:
    """Dopamine's transition signature plus `suffix` (see transitions.py)."""
    batch_size = self.batch_size if batch_size is None else batch_size
    if batch_size not in self._elements_by_batch_size:  # Built once per size.
      a = self._arguments
      self._elements_by_batch_size[batch_size] = tuple(
        transitions.transition_elements(
          batch_size, **{name: getattr(a, name) for name in _SIGNATURE}
        )
      )
    return self._elements_by_batch_size[batch_size]

  def shard(self, suffix: int | None = None) -> replay_shard.ReplayShard:
    """The ReplayShard of checkpoint `suffix` (None: the only one)."""
    source = self._current()
    return source.shard(source.table.position_of(suffix))

  def is_valid_transition(self, index: int, suffix: int | None = None) -> bool:
    """Whether file row `index` of checkpoint `suffix` may be sampled."""
    return self.shard(suffix).is_valid_transition(index)

  # -------------------------------------------------------------- sampling

  def sample_index_batch(
    self, batch_size: int | None = None
  ) -> tuple[np.ndarray, np.ndarray]:
    """Draws (suffixes, file rows) of batch_size valid transitions."""
    batch_size = self.batch_size if batch_size is None else batch_size
    table = self._current().table
    which, rows = self._draw(table, self._rng, batch_size)
    return table.suffix_array[which], rows

  def sample_transition_batch(
    self, batch_size: int | None = None, indices=None, suffixes=None
  ) -> tuple:
    """Returns a batch of transitions, as Dopamine's buffer does.

    Args:
      batch_size: int or None (default batch size).
      indices: optional file rows to return instead of sampling.
      suffixes: checkpoint of each index (needed with `indices` when more
        than one checkpoint is loaded; an int applies to all).

    Returns:
      tuple of arrays in the order of get_transition_elements(batch_size).

    Raises:
      ValueError: if an index is not a valid transition of its checkpoint.
      CheckpointError: if the data turns out damaged (names file and rows).
    """
    if indices is None:
      batch_size = self.batch_size if batch_size is None else batch_size
      if self._batch_threads is not None and batch_size == self.batch_size:
        if self._batches is None:
          self._start_batch_threads()
        batch, self._handed_out = self._batches.get()
      else:
        # One source for the whole call: a background swap cannot pull the
        # checkpoints away between drawing rows and reading them.
        batch = _sample_into(
          self._current(),
          self._draw,
          self._rng,
          self.get_transition_elements(batch_size),
          self.allocate_batch,
        )
    else:
      source = self._current()
      rows = np.asarray(indices, dtype=np.int64).reshape(-1)
      which = source.table.positions(suffixes, len(rows))
      source.check(which, rows)
      batch = transitions.empty_batch(self.get_transition_elements(len(rows)))
      source.write(batch, which, rows, np.arange(len(rows)))
    elements = self.get_transition_elements(len(batch['indices']))
    return tuple(batch[e.name] for e in elements)

  def sample_into(self, batch: dict, destinations: np.ndarray) -> None:
    """Samples a transition into each row `destinations` of `batch`.

    The arrays of `batch` (get_transition_elements' names) may hold more
    rows: a mixture fills the runs' rows of several batches this way.
    """
    destinations = np.asarray(destinations, np.int64)
    source = self._current()
    which, rows = self._draw(source.table, self._rng, len(destinations))
    source.write(batch, which, rows, destinations)

  def sample(self, size: int | None = None, with_sample_metadata: bool = False):
    """Dopamine 4.x JAX replay API: a batched `ReplayElement`.

    Args:
      size: int or None (default batch size).
      with_sample_metadata: bool, also return `SampleMetadata` whose keys are
        the sampled file rows.

    Returns:
      elements.ReplayElement with state, action, reward, next_state,
      is_terminal and episode_end, or (element, metadata).
    """
    # Imported here: JAX is only needed by JAX agents.
    from dopamine.jax.replay_memory import elements
    from dopamine.jax.replay_memory import samplers as jax_samplers

    names = [e.name for e in self.get_transition_elements(size)]
    batch = dict(zip(names, self.sample_transition_batch(size), strict=False))
    is_terminal = batch['terminal'].astype(bool)
    element = elements.ReplayElement(
      state=batch['state'],
      action=batch['action'],
      reward=batch['reward'],
      next_state=batch['next_state'],
      is_terminal=is_terminal,
      episode_end=is_terminal,
    )
    if with_sample_metadata:
      return element, jax_samplers.SampleMetadata(keys=batch['indices'])
    return element

  # ------------------------------------------------------ read-only dataset

  def reload_buffer(self, num_buffers: int | None = None) -> None:
    """Swaps in a new random set of checkpoints, where sets rotate.

    With prefetching, the set loaded in the background since the last call
    is swapped in at once (waiting only if it is not ready yet) and the next
    set starts loading. Without it, the new set is loaded now.

    Args:
      num_buffers: int or None, checkpoints to hold (default: as many as
        now).
    """
    if self._arguments.replay_suffix is None:
      self._rotation.reload(num_buffers, self._batches_paused)

  def reload_data(self) -> None:
    """Dopamine JAX's name for reload_buffer."""
    self.reload_buffer()

  def add(self, *args, **kwargs) -> None:
    """The dataset is read-only: transitions are never added."""
    del args, kwargs
    raise NotImplementedError(
      f'{type(self).__name__} is read-only: offline agents must not add '
      'transitions to the dataset.'
    )

  def save(self, checkpoint_dir: str, iteration_number: int) -> None:
    """Does nothing: the dataset on disk is the buffer's state."""
    del checkpoint_dir, iteration_number

  def load(self, checkpoint_dir: str, suffix: int) -> None:
    """Does nothing: data comes from `data_dir`, never from a checkpoint."""
    del checkpoint_dir, suffix
