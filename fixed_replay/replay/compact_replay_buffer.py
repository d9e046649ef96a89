"""CompactReplayBuffer: uniform over every checkpoint of a run, in bounded RAM.

Samples a compact store (`fixed-replay convert SRC DST`, see compact_store.py)
with the API of FixedReplayBuffer, so any agent or config can switch to it
with one gin binding (`replay_buffer_class.memory_class =
@CompactReplayBuffer`, pointing `replay_dir` at the store): it switches the
TF and the JAX agents alike, where `WrappedFixedReplayBuffer.memory_class`
would switch the TF agents only. Unlike
FixedReplayBuffer, nothing is loaded in sets: every minibatch is drawn
uniformly over all valid transitions of all selected checkpoints, and

* each transition is exactly the one Dopamine's `OutOfGraphReplayBuffer`,
  loaded with the whole gzip file, returns for that file row (the same
  ReplayShard transition math, run once over a minibatch mixing any
  checkpoints; only the frames come from another place);
* frames stay compressed on disk, decoded a block at a time into a cache
  bounded in bytes; the small per-row arrays (action, reward, terminal: 9
  bytes) and the valid rows (int32) are held in memory, so memory is ~13
  bytes per row plus the cache (0.9 GB for 50 x 1M rows with the default
  256 MiB cache), checked against `memory_budget` before anything is read;
* background threads prepare minibatches ahead (decoding and stacking run
  outside the GIL).
"""

import os
import queue
import threading
import weakref

from absl import logging
import gin
import numpy as np

from fixed_replay.dataset import checkpoints
from fixed_replay.dataset import subsample as subsample_lib
from fixed_replay.errors import CheckpointError
from fixed_replay.replay import arguments
from fixed_replay.replay import fixed_replay_buffer
from fixed_replay.replay import memory_budget as memory
from fixed_replay.replay import shard as shard_lib
from fixed_replay.replay import stacking
from fixed_replay.store import block_cache
from fixed_replay.store import compact_store

DEFAULT_MEMORY_BUDGET = 1_500_000_000
DEFAULT_CACHE_BYTES = 256 << 20
# Transitions whose blocks are pinned together; bounds a batch's cache use.
_CHUNK = 32


# A row of a minibatch is encoded as (checkpoint position << 32) + file row
# + 2**31: the bias keeps the row field positive when ReplayShard looks a few
# rows back from row 0 (a stack wrapping around a circular file).
_ROW_BITS = 32
_ROW_BIAS = 1 << 31


class _ConcatenatedWindows(shard_lib.ReplayShard):
  """The windows of all selected checkpoints as one ReplayShard.

  Their small arrays are concatenated; a row is encoded as (position of its
  checkpoint in the selection << 32) + file row + 2**31, and `_to_window`
  maps it to
  the concatenated arrays with that checkpoint's own rule (a whole full file
  wraps around, as in Dopamine; any other window is offset). ReplayShard's
  transition math then handles a minibatch mixing any checkpoints in one
  vectorized pass instead of one pass per checkpoint.
  """

  def __init__(self, arrays, shards, stack_size, update_horizon, gamma):
    total = len(arrays['terminal'])
    window = checkpoints.CheckpointWindow(
      suffix=-1,
      start=0,
      num_file_rows=total,
      store=dict(arrays, observation=compact_store.UnheldFrames(total)),
      add_count=total,
      invalid_range=np.zeros(0, np.int64),
    )
    # Sampling draws from each checkpoint's own valid rows, not from here.
    super().__init__(
      window, stack_size, update_horizon, gamma, valid_rows=np.zeros(0)
    )
    windows = [s.window for s in shards]
    counts = np.array([w.num_rows for w in windows], dtype=np.int64)
    self.offsets = np.cumsum(counts) - counts
    self._starts = np.array([w.start for w in windows], dtype=np.int64)
    self._file_rows = np.array([w.num_file_rows for w in windows], np.int64)
    self._circular_of = np.array([s._circular for s in shards])
    # Window position + this = file row, per checkpoint.
    self.file_row_base = self._starts - self.offsets

  def _to_window(self, rows):
    which = rows >> _ROW_BITS
    file_rows = (rows & ((1 << _ROW_BITS) - 1)) - _ROW_BIAS
    local = np.where(
      self._circular_of[which],
      file_rows % self._file_rows[which],
      file_rows - self._starts[which],
    )
    return local + self.offsets[which]


class _Sampler:
  """Draws and assembles batches; shared by the buffer and its threads."""

  def __init__(self, stored, shards, windows, cache, mix_checkpoints):
    self.stored = stored
    self.shards = shards
    self.windows = windows
    self.cache = cache
    self.mix_checkpoints = mix_checkpoints
    self.suffixes = np.array([s.suffix for s in shards], dtype=np.int32)
    counts = np.array([s.num_valid for s in shards], dtype=np.int64)
    self.ends = np.cumsum(counts)
    self.total = int(self.ends[-1])
    self.block_rows = cache.block_rows
    self.key_stride = max(c.frames.num_blocks for c in stored) + 1
    # One table of every valid row, so a draw is one vectorized lookup; each
    # shard keeps a view of its part.
    self.valid_rows = np.concatenate([s.valid_rows for s in shards])
    for shard, end, count in zip(shards, self.ends, counts, strict=True):
      shard.valid_rows = self.valid_rows[end - count : end]

  def draw(self, rng, batch_size):
    """Returns (shard positions, file rows) of batch_size valid transitions."""
    if self.mix_checkpoints:
      positions = rng.integers(0, self.total, batch_size)
      which = np.searchsorted(self.ends, positions, side='right')
      return which, self.valid_rows[positions].astype(np.int64)
    i = int(rng.integers(len(self.shards)))
    shard = self.shards[i]
    rows = shard.valid_rows[rng.integers(0, shard.num_valid, batch_size)]
    return np.full(batch_size, i), rows.astype(np.int64)

  def _load_block(self, key, out):
    i, block = divmod(key, self.key_stride)
    self.stored[i].frames.read_block(block, out)

  def fill(self, batch, which, rows, check=False):
    """Writes the transitions (shards `which`, file rows `rows`) into batch."""
    which = np.asarray(which, dtype=np.int64)
    if check:
      for i in np.unique(which):
        self.shards[i].check_indices(rows[which == i])
    for start in range(0, len(rows), _CHUNK):
      stop = min(start + _CHUNK, len(rows))
      self._fill_chunk(batch, which[start:stop], rows[start:stop], start)

  def _fill_chunk(self, batch, which, rows, offset):
    count = len(rows)
    destinations = np.arange(offset, offset + count)
    state, next_state = self.windows.write_transition_parts(
      (which << _ROW_BITS) + (rows + _ROW_BIAS), batch, destinations
    )
    batch['indices'][destinations] = rows
    batch[shard_lib.SUFFIX_ELEMENT][destinations] = self.suffixes[which]
    # File rows of the frames of both states, and the blocks holding them.
    both = np.concatenate([which, which])
    frame_rows = np.concatenate([state, next_state])
    frame_rows += self.windows.file_row_base[both][:, None]
    blocks = frame_rows // self.block_rows
    keys = both[:, None] * self.key_stride + blocks
    unique, inverse = np.unique(keys, return_inverse=True)
    slots = self.cache.acquire(unique, self._load_block)
    try:
      arena_rows = slots[inverse.reshape(keys.shape)] * self.block_rows + (
        frame_rows - blocks * self.block_rows
      )
      frames = self.cache.frames()
      stacking.gather_stacks(
        frames, arena_rows[:count], batch['state'], destinations
      )
      stacking.gather_stacks(
        frames, arena_rows[count:], batch['next_state'], destinations
      )
    finally:
      self.cache.release(slots)


class _Prefetcher:
  """Threads that keep a queue of ready minibatches."""

  def __init__(self, sampler, elements, num_threads, depth, seed_sequence):
    self._queue = queue.Queue(maxsize=depth)
    self._stop = threading.Event()
    self._error = None
    self._threads = [
      threading.Thread(
        target=self._run,
        args=(sampler, elements, np.random.default_rng(child)),
        name=f'compact_replay_prefetch_{n}',
        daemon=True,
      )
      for n, child in enumerate(seed_sequence.spawn(num_threads))
    ]
    for thread in self._threads:
      thread.start()

  def _run(self, sampler, elements, rng):
    batch_size = elements[0].shape[0]
    while not self._stop.is_set():
      try:
        which, rows = sampler.draw(rng, batch_size)
        batch = shard_lib.empty_batch(elements)
        sampler.fill(batch, which, rows)
        item = (batch, None)
      except Exception as error:  # noqa: BLE001 - handed to the consumer.
        item = (None, error)
      while not self._stop.is_set():
        try:
          self._queue.put(item, timeout=0.1)
          break
        except queue.Full:
          continue
      if item[1] is not None:
        return

  def get(self):
    """The next ready batch; re-raises a thread's error."""
    if self._error is not None:
      raise self._error
    batch, error = self._queue.get()
    if error is not None:
      self._error = error
      raise error
    return batch

  def stop(self):
    self._stop.set()
    for thread in self._threads:
      thread.join()


@gin.configurable
class CompactReplayBuffer:
  """Samples uniformly over all checkpoints of a compact store.

  Has FixedReplayBuffer's public API (the agents and the TF wrapper use
  nothing else), written anew rather than inherited: nothing here is loaded
  in sets, so none of FixedReplayBuffer's machinery applies.
  """

  def __init__(
    self,
    data_dir,
    replay_suffix=None,
    observation_shape=(84, 84),
    stack_size=4,
    replay_capacity=1_000_000,
    batch_size=32,
    update_horizon=1,
    gamma=0.99,
    max_sample_attempts=1000,
    extra_storage_types=None,
    observation_dtype=np.uint8,
    terminal_dtype=np.uint8,
    action_shape=(),
    action_dtype=np.int32,
    reward_shape=(),
    reward_dtype=np.float32,
    replay_file_start_index=0,
    replay_file_end_index=None,
    replay_transitions_start_index=0,
    num_buffers_to_load=None,
    mix_checkpoints=True,
    prefetch=True,
    memory_budget=DEFAULT_MEMORY_BUDGET,
    cache_bytes=None,
    num_workers=None,
    prefetch_batches=4,
    seed=None,
    verify=True,
    subsample=None,
    subsample_fraction=None,
  ):
    """Opens the store and builds the table of valid transitions.

    Arguments shared with FixedReplayBuffer mean the same; `data_dir` is the
    compact store. The others:

    Args:
      data_dir: str, a compact store directory (fixed-replay convert).
      replay_suffix: int or None, one checkpoint to use.
      observation_shape: tuple, must match the store.
      stack_size: int.
      replay_capacity: int, rows used per checkpoint from
        replay_transitions_start_index (the 1%/10% settings).
      batch_size: int, default minibatch size.
      update_horizon: int.
      gamma: float.
      max_sample_attempts: int, ignored (only valid rows are drawn).
      extra_storage_types: list of ReplayElements stored beside the four
        standard arrays.
      observation_dtype: must match the store.
      terminal_dtype: dtype of the returned terminal flags.
      action_shape: tuple.
      action_dtype: dtype.
      reward_shape: tuple.
      reward_dtype: dtype.
      replay_file_start_index: int, first position in the sorted suffixes.
      replay_file_end_index: int or None, end (exclusive) of that slice.
      replay_transitions_start_index: int, first file row used.
      num_buffers_to_load: ignored: every selected checkpoint is sampled.
      mix_checkpoints: bool, True draws uniformly over all valid transitions;
        False draws each minibatch from one checkpoint chosen at random.
      prefetch: bool, prepare default-size minibatches in background threads.
      memory_budget: int, bytes this buffer may hold: small arrays,
        valid-row table, block index, decoded-block cache and ready batches
        (~13 bytes per row plus the cache; the frames are not held).
      cache_bytes: int or None, bytes of decoded blocks cached (None: up to
        256 MiB, within the budget).
      num_workers: int or None, prefetching threads (None: 2, or 1 on one
        core). Two hide sampling behind a training step that releases the
        GIL; more mostly contend for the GIL.
      prefetch_batches: int >= 1, ready minibatches kept (counted in
        memory_budget).
      seed: int or None.
      verify: bool, check the store's small files against their CRC-32 on
        opening (frame blocks are checked whenever they are decoded).
      subsample: None or 'first_rows', 'random_episodes', 'first_episodes':
        which "x% of the data" of each checkpoint to use, as in
        FixedReplayBuffer (see fixed_replay/dataset/subsample.py).
      subsample_fraction: float in (0, 1], the x (0.01 for 1%).

    Raises:
      CheckpointError: if the store is missing, damaged or does not match
        the observation shape, dtype or extra elements asked for.
      ValueError: on inconsistent arguments.
      MemoryError: if the selection does not fit in memory_budget.
    """
    arguments.check(locals())
    del max_sample_attempts  # Only valid rows are ever drawn.
    if reward_shape != () and update_horizon > 1:
      raise ValueError('n-step returns need scalar rewards (reward_shape=())')
    subsample_lib.check_arguments(subsample, subsample_fraction)
    self._subsample = subsample
    self._subsample_fraction = subsample_fraction
    self._seed = seed
    if num_buffers_to_load is not None:
      logging.info(
        'num_buffers_to_load=%s ignored: CompactReplayBuffer samples every '
        'selected checkpoint at once',
        num_buffers_to_load,
      )
    self._data_dir = str(data_dir)
    self._observation_shape = tuple(observation_shape)
    self._observation_dtype = np.dtype(observation_dtype)
    self._stack_size = stack_size
    self._update_horizon = update_horizon
    self._gamma = gamma
    self._batch_size = batch_size
    self._replay_capacity = replay_capacity
    self._replay_suffix = replay_suffix
    self._mix_checkpoints = mix_checkpoints
    self._element_signature = dict(
      observation_shape=self._observation_shape,
      stack_size=stack_size,
      observation_dtype=observation_dtype,
      terminal_dtype=terminal_dtype,
      action_shape=tuple(action_shape),
      action_dtype=action_dtype,
      reward_shape=tuple(reward_shape),
      reward_dtype=reward_dtype,
      extra_storage_types=list(extra_storage_types or []),
    )
    self._extra_names = [e.name for e in extra_storage_types or []]
    self._elements_by_batch_size = {}
    seed_sequence = np.random.SeedSequence(seed)
    self._rng = np.random.default_rng(seed_sequence.spawn(1)[0])
    self._stored = []
    self._prefetcher = None
    self._finalizer = None
    self._num_workers = self._workers(num_workers)
    self._prefetch = prefetch and self._num_workers > 0
    self._prefetch_batches = prefetch_batches
    self._seed_sequence = seed_sequence
    try:
      self._open(
        replay_suffix,
        replay_file_start_index,
        replay_file_end_index,
        replay_transitions_start_index,
        replay_capacity,
        verify,
      )
      self._build(memory_budget, cache_bytes, num_workers, prefetch_batches)
    except BaseException:
      self.close()
      raise

  # -------------------------------------------------------------- opening

  def _select(self, replay_suffix, file_start, file_end):
    found = compact_store.find_stored_checkpoints(self._data_dir)
    return fixed_replay_buffer.select_checkpoints(
      found, replay_suffix, file_start, file_end, self._data_dir
    )

  def _check_matches(self, stored):
    """Raises CheckpointError unless the store holds what was asked for."""
    frames = stored.frames
    if frames.row_shape != self._observation_shape:
      raise CheckpointError(
        frames.path,
        f'frames of shape {frames.row_shape}, expected '
        f'{self._observation_shape}',
      )
    if frames.dtype != self._observation_dtype:
      raise CheckpointError(
        frames.path,
        f'frames of dtype {frames.dtype}, expected {self._observation_dtype}',
      )
    missing = set(self._extra_names) - set(stored.arrays)
    if missing:
      raise CheckpointError(
        stored.directory, f'no stored element(s) {sorted(missing)}'
      )

  def _open(self, replay_suffix, file_start, file_end, start, capacity, verify):
    """Opens the selected checkpoints and plans their windows."""
    self._windows = []
    for directory in self._select(replay_suffix, file_start, file_end).values():
      stored = compact_store.StoredCheckpoint(directory, verify=verify)
      self._stored.append(stored)
      self._check_matches(stored)
      if start >= stored.num_rows:
        raise ValueError(
          f'replay_transitions_start_index={start} is beyond the '
          f'{stored.num_rows} rows of checkpoint {stored.suffix}'
        )
      count = memory.window_rows(stored.num_rows, start, capacity)
      if self._subsample == 'first_rows':
        count = subsample_lib.first_rows_count(
          count,
          self._subsample_fraction,
          f'checkpoint {stored.suffix} of {self._data_dir}',
        )
      self._windows.append((start, count))
    block_rows = {s.frames.block_rows for s in self._stored}
    if len(block_rows) != 1:
      raise CheckpointError(
        self._data_dir,
        f'checkpoints stored with different block sizes {sorted(block_rows)}',
      )

  def _read_small_arrays(self):
    """Reads every window's small arrays into one array per element."""
    names = ['action', 'reward', 'terminal'] + self._extra_names
    first = self._stored[0].arrays
    for stored in self._stored[1:]:
      for name in names:
        theirs, ours = stored.arrays[name], first[name]
        if (theirs.dtype, theirs.shape[1:]) != (ours.dtype, ours.shape[1:]):
          raise CheckpointError(
            stored.directory,
            f'{name} of {theirs.dtype}{theirs.shape[1:]}, but checkpoint '
            f'{self._stored[0].suffix} has {ours.dtype}{ours.shape[1:]}',
          )
    counts = np.array([count for _, count in self._windows], dtype=np.int64)
    self._offsets = np.cumsum(counts) - counts
    arrays = {
      name: np.empty(
        (int(counts.sum()),) + first[name].shape[1:], first[name].dtype
      )
      for name in names
    }
    for stored, (start, count), offset in zip(
      self._stored, self._windows, self._offsets, strict=True
    ):
      for name, array in arrays.items():
        stored.read_rows_into(name, start, array[offset : offset + count])
    return arrays

  def _fixed_bytes(self):
    """Bytes of everything but the cache: small arrays, tables, indexes."""
    total = 0
    names = ['action', 'reward', 'terminal'] + self._extra_names
    for stored, (_, count) in zip(self._stored, self._windows, strict=True):
      row_bytes = sum(
        stored.arrays[n].itemsize * int(np.prod(stored.arrays[n].shape[1:]))
        for n in names
      )
      total += count * (row_bytes + np.dtype(np.int32).itemsize)
      total += stored.frames.nbytes
    return total

  @staticmethod
  def _workers(num_workers):
    return min(2, os.cpu_count() or 1) if num_workers is None else num_workers

  def _build(self, budget, cache_bytes, num_workers, prefetch_batches):
    """Checks the budget, then builds the shards, table and cache."""
    block_rows = self._stored[0].frames.block_rows
    frame_bytes = self._observation_dtype.itemsize * int(
      np.prod(self._observation_shape)
    )
    block_bytes = block_rows * frame_bytes
    batch_bytes = sum(
      np.dtype(e.type).itemsize * int(np.prod(e.shape))
      for e in self.get_transition_elements()
    )
    workers = self._workers(num_workers)
    per_transition = (self._stack_size + self._update_horizon - 2) // (
      block_rows
    ) + 3
    min_slots = (workers + 1) * _CHUNK * per_transition
    fixed = self._fixed_bytes() + (prefetch_batches + workers) * batch_bytes
    what = (
      f'{len(self._stored)} checkpoint(s) of {self._data_dir} '
      f'({sum(c for _, c in self._windows):,} rows)'
    )
    memory.check_fits(fixed + min_slots * block_bytes, budget, what)
    wanted = DEFAULT_CACHE_BYTES if cache_bytes is None else cache_bytes
    num_slots = max(min_slots, min(wanted, budget - fixed) // block_bytes)
    cache = block_cache.BlockCache(
      num_slots,
      (block_rows,) + self._observation_shape,
      self._observation_dtype,
    )
    arrays = self._read_small_arrays()
    shards = []
    for stored, (start, count), offset in zip(
      self._stored, self._windows, self._offsets, strict=True
    ):
      table = None
      if (start, count) == (0, stored.num_rows):
        table = stored.valid_rows_table(self._stack_size, self._update_horizon)
      views = {n: a[offset : offset + count] for n, a in arrays.items()}
      shard = shard_lib.ReplayShard(
        stored.window(start, count, arrays=views),
        self._stack_size,
        self._update_horizon,
        self._gamma,
        valid_rows=table,
      )
      if self._subsample in subsample_lib.EPISODE_METHODS:
        shard.valid_rows = subsample_lib.keep_rows(
          shard.valid_rows,
          shard.window,
          self._subsample,
          self._subsample_fraction,
          subsample_lib.episode_rng(self._seed, stored.suffix),
        )
      shard.valid_rows = shard.valid_rows.astype(np.int32, copy=False)
      if not shard.num_valid:
        logging.warning(
          'Checkpoint %d has no valid transition in rows [%d, %d)',
          stored.suffix,
          start,
          start + count,
        )
      shards.append(shard)
    self._shards = shards
    if not sum(s.num_valid for s in shards):
      raise ValueError(
        f'{what} hold no valid transition for stack_size='
        f'{self._stack_size}, update_horizon={self._update_horizon}'
      )
    windows = _ConcatenatedWindows(
      arrays, shards, self._stack_size, self._update_horizon, self._gamma
    )
    self._sampler = _Sampler(
      self._stored, shards, windows, cache, self._mix_checkpoints
    )
    self._position_of = {s.suffix: i for i, s in enumerate(shards)}
    self._fixed = fixed
    logging.info(
      'CompactReplayBuffer over %s: %d valid transitions; %s mapped and '
      'indexed, cache of %d blocks (%s), budget %s',
      what,
      self._sampler.total,
      memory.format_bytes(fixed),
      num_slots,
      memory.format_bytes(cache.nbytes),
      memory.format_bytes(budget),
    )

  # ------------------------------------------------------------- lifecycle

  def _start_prefetch(self):
    self._prefetcher = _Prefetcher(
      self._sampler,
      self.get_transition_elements(),
      self._num_workers,
      self._prefetch_batches,
      self._seed_sequence.spawn(1)[0],
    )
    # Threads hold only the sampler: the buffer can be collected, and then
    # they stop.
    self._finalizer = weakref.finalize(self, self._prefetcher.stop)

  def reload_buffer(self, num_buffers=None):
    """Nothing to swap: every selected checkpoint is always sampled."""
    del num_buffers

  def reload_data(self):
    """Nothing to swap (Dopamine JAX's name for reload_buffer)."""

  def close(self):
    """Stops the prefetching threads and closes the store's files."""
    if self._finalizer is not None:
      self._finalizer()
      self._finalizer = None
    for stored in self._stored:
      stored.close()

  @property
  def nbytes(self):
    """Bytes this buffer may hold: small arrays, tables, cache, batches."""
    return self._fixed + self._sampler.cache.nbytes

  @property
  def cache(self):
    """The BlockCache of decoded frame blocks."""
    return self._sampler.cache

  @property
  def batch_size(self):
    return self._batch_size

  @property
  def replay_capacity(self):
    """Rows used per checkpoint (a window may hold fewer)."""
    return self._replay_capacity

  @property
  def loaded_suffixes(self):
    """Suffixes of the checkpoints sampled from: all those selected."""
    return [s.suffix for s in self._shards]

  @property
  def add_count(self):
    """Rows sampled from (Dopamine agents compare it to a minimum)."""
    return np.array(sum(s.window.num_rows for s in self._shards))

  @property
  def num_valid_transitions(self):
    return self._sampler.total

  def get_transition_elements(self, batch_size=None):
    """Dopamine's transition signature plus `suffix` (see shard.py)."""
    batch_size = self._batch_size if batch_size is None else batch_size
    if batch_size not in self._elements_by_batch_size:
      self._elements_by_batch_size[batch_size] = tuple(
        shard_lib.transition_elements(batch_size, **self._element_signature)
      )
    return self._elements_by_batch_size[batch_size]

  def shard(self, suffix=None):
    """The ReplayShard of checkpoint `suffix` (None: the only one)."""
    return self._shards[int(self._positions(suffix, 1)[0])]

  def is_valid_transition(self, index, suffix=None):
    """Whether file row `index` of checkpoint `suffix` may be sampled."""
    return self.shard(suffix).is_valid_transition(index)

  # -------------------------------------------------------------- sampling

  def sample_index_batch(self, batch_size=None):
    """Draws (suffixes, file rows) of batch_size valid transitions."""
    batch_size = self._batch_size if batch_size is None else batch_size
    which, rows = self._sampler.draw(self._rng, batch_size)
    return self._sampler.suffixes[which], rows

  def _positions(self, suffixes, count):
    """Shard positions of `suffixes` (int, array or None)."""
    if suffixes is None:
      if len(self._shards) != 1:
        raise ValueError(
          f'{len(self._shards)} checkpoints are loaded '
          f'{self.loaded_suffixes}: say which with `suffixes`'
        )
      return np.zeros(count, dtype=np.int64)
    suffixes = np.broadcast_to(np.asarray(suffixes), (count,))
    unknown = set(np.unique(suffixes).tolist()) - set(self._position_of)
    if unknown:
      raise ValueError(
        f'Checkpoint(s) {sorted(unknown)} are not loaded (loaded: '
        f'{self.loaded_suffixes})'
      )
    return np.array([self._position_of[int(s)] for s in suffixes])

  def sample_transition_batch(
    self, batch_size=None, indices=None, suffixes=None
  ):
    """Returns a batch of transitions, as Dopamine's buffer does.

    Args:
      batch_size: int or None (default batch size).
      indices: optional file rows to return instead of sampling.
      suffixes: checkpoint of each index (needed with `indices` when more
        than one checkpoint is selected; an int applies to all).

    Returns:
      tuple of arrays in the order of get_transition_elements(batch_size).

    Raises:
      ValueError: if an index is not a valid transition of its checkpoint.
      CheckpointError: if a frame block is damaged (names checkpoint, rows).
    """
    if indices is None:
      batch_size = self._batch_size if batch_size is None else batch_size
      if self._prefetch and batch_size == self._batch_size:
        if self._prefetcher is None:
          self._start_prefetch()
        batch = self._prefetcher.get()
      else:
        which, rows = self._sampler.draw(self._rng, batch_size)
        batch = self._new_batch(batch_size)
        self._sampler.fill(batch, which, rows)
    else:
      rows = np.asarray(indices, dtype=np.int64).reshape(-1)
      which = self._positions(suffixes, len(rows))
      batch = self._new_batch(len(rows))
      self._sampler.fill(batch, which, rows, check=True)
    elements = self.get_transition_elements(len(batch['indices']))
    return tuple(batch[e.name] for e in elements)

  def _new_batch(self, batch_size):
    return shard_lib.empty_batch(self.get_transition_elements(batch_size))

  # The JAX adapter is written against the public API both buffers share.
  sample = fixed_replay_buffer.FixedReplayBuffer.sample

  # ------------------------------------------------------ read-only dataset

  def add(self, *args, **kwargs):
    """The dataset is read-only: transitions are never added."""
    del args, kwargs
    raise NotImplementedError(
      'CompactReplayBuffer is read-only: offline agents must not add '
      'transitions to the dataset.'
    )

  def save(self, checkpoint_dir, iteration_number):
    """Does nothing: the store on disk is the buffer's state."""
    del checkpoint_dir, iteration_number

  def load(self, checkpoint_dir, suffix):
    """Does nothing: data comes from the store, never from a checkpoint."""
    del checkpoint_dir, suffix
