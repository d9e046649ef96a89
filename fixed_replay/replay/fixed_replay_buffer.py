"""FixedReplayBuffer: samples Dopamine replay checkpoints without the RAM.

Keeps the contract of batch_rl's `FixedReplayBuffer` and Dopamine's
`JaxFixedReplayBuffer` (same arguments, `reload_buffer`, `reload_data`), with
three differences a researcher can rely on:

* Only the window [replay_transitions_start_index, + replay_capacity) of each
  checkpoint is decompressed and held, and it is read by streaming.
* Every transition is exactly the one Dopamine's `OutOfGraphReplayBuffer`,
  loaded with the whole file, returns for that file row; rows whose stack or
  n-step future would leave the window are never sampled.
* The next set of checkpoints loads in a background thread while training
  samples from the current one; by default every minibatch mixes all loaded
  checkpoints uniformly over their valid transitions.
* No row of a file that fails its gzip CRC-32 or length check is ever
  sampled: a checkpoint is published to the samplers only after all its
  files passed (see `verify_checksums`).

`subsample` and `subsample_fraction` choose among the published meanings of
"x% of the data" (see fixed_replay/dataset/subsample.py).
"""

import concurrent.futures
import os
import sys
import threading
import time
import types

from absl import logging
import gin
import numpy as np

from fixed_replay import progress
from fixed_replay.dataset import checkpoints
from fixed_replay.dataset import subsample as subsample_lib
from fixed_replay.replay import arguments
from fixed_replay.replay import memory_budget as memory
from fixed_replay.replay import shard as shard_lib


class _ShardSet:
  """An immutable set of loaded shards, swapped in by one assignment."""

  def __init__(self, shards):
    self.shards = tuple(shards)
    counts = [s.num_valid for s in self.shards]
    self.ends = np.cumsum(counts, dtype=np.int64)
    self.starts = self.ends - np.asarray(counts, dtype=np.int64)
    self.total = int(self.ends[-1]) if counts else 0
    self.by_suffix = {s.suffix: s for s in self.shards}
    self.suffix_array = np.array([s.suffix for s in self.shards], np.int32)

  @property
  def suffixes(self):
    return [s.suffix for s in self.shards]


def select_checkpoints(found, replay_suffix, file_start, file_end, data_dir):
  """Applies replay_suffix or the replay_file_*_index slice to `found`.

  Shared by every buffer, so the arguments mean the same over gzip
  checkpoints and over a compact store.

  Args:
    found: dict of suffix to what describes that checkpoint.
    replay_suffix: int or None, a single checkpoint.
    file_start: int, first position in the sorted suffixes.
    file_end: int or None, end (exclusive) of that slice.
    data_dir: str, for the messages.

  Returns:
    dict of the selected suffixes to their values in `found`.

  Raises:
    ValueError: if the selection is empty.
  """
  if replay_suffix is not None:
    if replay_suffix not in found:
      raise ValueError(
        f'replay_suffix={replay_suffix}: no complete checkpoint with that '
        f'suffix in {data_dir} (found {sorted(found)})'
      )
    return {replay_suffix: found[replay_suffix]}
  suffixes = sorted(found)[file_start:file_end]
  if not suffixes:
    raise ValueError(
      f'replay_file_start_index={file_start}, replay_file_end_index='
      f'{file_end} select none of the {len(found)} checkpoints in {data_dir}'
    )
  return {s: found[s] for s in suffixes}


def _position_of(active, suffix):
  """Index in active.shards of checkpoint `suffix` (None: the only one)."""
  if suffix is None:
    if len(active.shards) != 1:
      raise ValueError(
        f'{len(active.shards)} checkpoints are loaded {active.suffixes}: '
        'say which with `suffixes`'
      )
    return 0
  if suffix not in active.by_suffix:
    raise ValueError(
      f'Checkpoint {suffix} is not loaded (loaded: {active.suffixes})'
    )
  return active.suffixes.index(suffix)


@gin.configurable
class FixedReplayBuffer:
  """Samples transitions from Dopamine replay checkpoints on disk."""

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
    num_buffers_to_load=5,
    mix_checkpoints=True,
    prefetch=True,
    memory_budget=None,
    seed=None,
    subsample=None,
    subsample_fraction=None,
    verify_checksums=True,
  ):
    """Finds the checkpoints and loads the first set.

    Returns once the first set is loaded and, by default, verified.

    Args:
      data_dir: str, directory of checkpoint files (local or gs://).
      replay_suffix: int or None; if set, only this checkpoint is used (0 is
        a checkpoint like any other).
      observation_shape: tuple, shape of one observation.
      stack_size: int, frames per state.
      replay_capacity: int, rows kept per checkpoint, counted from
        replay_transitions_start_index; larger than a checkpoint means the
        whole checkpoint.
      batch_size: int, default minibatch size.
      update_horizon: int, n of the n-step return.
      gamma: float, discount.
      max_sample_attempts: int, kept for Dopamine compatibility; sampling
        draws only valid rows, so it never retries.
      extra_storage_types: list of ReplayElements stored beside the four
        standard arrays (read from `$store$_<name>` files).
      observation_dtype: dtype of observations.
      terminal_dtype: dtype of the returned terminal flags.
      action_shape: tuple, shape of one action.
      action_dtype: dtype of actions.
      reward_shape: tuple, shape of one reward (n-step sums need ()).
      reward_dtype: dtype of rewards.
      replay_file_start_index: int, first position in the sorted list of
        checkpoint suffixes to use (as in Dopamine's JaxFixedReplayBuffer).
      replay_file_end_index: int or None, end (exclusive) of that slice.
      replay_transitions_start_index: int, first file row of each window.
      num_buffers_to_load: int, checkpoints held at a time; more than the
        directory holds uses all of them (with one warning).
      mix_checkpoints: bool, True samples uniformly over the valid
        transitions of all loaded checkpoints; False draws each minibatch
        from one checkpoint chosen at random, as batch_rl does.
      prefetch: bool, load the next set of checkpoints in the background.
      memory_budget: int or None, bytes the loaded data may take; None uses
        the memory available when the buffer is created.
      seed: int or None, seeds sampling and the choice of checkpoints (and
        of the episodes 'random_episodes' keeps; 0 when None).
      subsample: None (every row of each window) or how to take "x% of the
        data" from each checkpoint's window: 'first_rows' (the CQL code),
        'random_episodes' (the REM paper) or 'first_episodes' (Dopamine's
        TFDS loader); see fixed_replay/dataset/subsample.py.
      subsample_fraction: float in (0, 1], the x (0.01 for 1%).
      verify_checksums: bool. True (default): a checkpoint's rows reach the
        samplers only after each of its files passed its gzip CRC-32 and
        length check; for a window shorter than its file that means
        inflating (and discarding) the rest of the file, in the constructor
        for the first set and in the background for later ones, and a
        failed check fails the load. False skips inflating the rest, for
        data verified once (`fixed-replay inspect --verify`); files read to
        their end are checked either way, at no cost.

    Raises:
      CheckpointError: if the directory holds no usable checkpoint, or a
        file of the first set is damaged.
      ValueError: on inconsistent arguments.
      MemoryError: if the configuration cannot fit, before allocating.
    """
    arguments.check(locals())
    del max_sample_attempts  # Only valid rows are ever drawn.
    if reward_shape != () and update_horizon > 1:
      raise ValueError('n-step returns need scalar rewards (reward_shape=())')
    subsample_lib.check_arguments(subsample, subsample_fraction)
    # Dopamine's JaxFixedReplayBuffer (dopamine/labs/offline_rl) subclasses
    # batch_rl's buffer, i.e. this one, and keeps these two as attributes set
    # before calling us instead of passing them on.
    replay_transitions_start_index = getattr(
      self, '_replay_transitions_start_index', replay_transitions_start_index
    )
    num_buffers_to_load = getattr(
      self, '_num_buffers_to_load', num_buffers_to_load
    )
    self._subsample = subsample
    self._subsample_fraction = subsample_fraction
    self._seed = seed
    self._plans = {}
    self._warned_buffers = False
    self._data_dir = str(data_dir)
    self._verify_checksums = bool(verify_checksums)
    self._observation_shape = tuple(observation_shape)
    self._stack_size = stack_size
    self._replay_capacity = replay_capacity
    self._batch_size = batch_size
    self._update_horizon = update_horizon
    self._gamma = gamma
    self._observation_dtype = np.dtype(observation_dtype)
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
    self._start = replay_transitions_start_index
    self._mix_checkpoints = mix_checkpoints
    self._rng = np.random.default_rng(seed)
    replay_suffix = None if replay_suffix is None else int(replay_suffix)
    self._replay_suffix = replay_suffix
    self._files = self._select_checkpoints(
      replay_suffix, replay_file_start_index, replay_file_end_index
    )
    if replay_suffix is not None:
      num_buffers_to_load = 1
    num_buffers_to_load = self._available(num_buffers_to_load)
    self._num_buffers_to_load = num_buffers_to_load
    self._shard_bytes = {}
    self._headers = {}
    self._budget = (
      memory_budget if memory_budget is not None else memory.available_bytes()
    )
    self._warned_capacity = False
    self._active = _ShardSet([])
    # Used while a reload without prefetch has freed the outgoing set and
    # the new one is not in yet: samplers wait instead of seeing nothing.
    self._swapped_in = threading.Condition()
    self._swapping = False
    self._executor = concurrent.futures.ThreadPoolExecutor(
      max_workers=1, thread_name_prefix='fixed_replay_prefetch'
    )
    self._pending = None  # Future of the next set (or of a rolling refresh).
    self._rolling = False

    first = self._draw_suffixes(num_buffers_to_load)
    memory.check_fits(
      self._set_bytes(first),
      self._budget,
      f'Loading {len(first)} checkpoint(s) {first}',
    )
    self._publish(self._load_shards(first, parallel=True))
    self._prefetch = prefetch and len(self._files) > num_buffers_to_load
    if self._prefetch:
      self._start_refresh()

  # ---------------------------------------------------------------- loading

  def _select_checkpoints(self, replay_suffix, file_start, file_end):
    """Returns {suffix: CheckpointFiles} of the checkpoints we may load."""
    found = checkpoints.find_checkpoints(self._data_dir, wanted=replay_suffix)
    return select_checkpoints(
      found, replay_suffix, file_start, file_end, self._data_dir
    )

  def _available(self, num_buffers):
    """num_buffers, or all the checkpoints when fewer exist (warns once)."""
    if num_buffers <= len(self._files):
      return num_buffers
    if not self._warned_buffers:
      self._warned_buffers = True
      logging.warning(
        'num_buffers_to_load=%d but %s has %d usable checkpoint(s) %s: '
        'using all of them.',
        num_buffers,
        self._data_dir,
        len(self._files),
        sorted(self._files),
      )
    return len(self._files)

  def _draw_suffixes(self, num_buffers):
    """Draws num_buffers distinct checkpoint suffixes at random."""
    chosen = self._rng.choice(sorted(self._files), num_buffers, replace=False)
    return sorted(int(s) for s in chosen)

  def _headers_of(self, suffix):
    """The checkpoint's `$store$_` headers, read once (remote reads cost)."""
    if suffix not in self._headers:
      self._headers[suffix] = checkpoints.read_store_headers(
        self._files[suffix]
      )
    return self._headers[suffix]

  def _window_of(self, suffix):
    """Returns (start, count) of the rows to load from a checkpoint."""
    return self._plan(suffix)[:2]

  def _plan(self, suffix):
    """(start, count, kept rows or None) of a checkpoint, decided once.

    The window is replay_capacity rows from replay_transitions_start_index,
    cut to its first rows by subsample='first_rows'; the episode methods
    read the window's terminal flags (not its frames), choose the kept
    episodes and shrink the window to the rows they need.
    """
    if suffix in self._plans:
      return self._plans[suffix]
    files = self._files[suffix]
    num_file_rows = self._headers_of(suffix)['observation'].num_rows
    if self._start >= num_file_rows:
      raise ValueError(
        f'replay_transitions_start_index={self._start} is beyond the '
        f'{num_file_rows} rows of {files.store_paths["observation"]}'
      )
    count = memory.window_rows(
      num_file_rows, self._start, self._replay_capacity
    )
    if count < self._replay_capacity and not self._warned_capacity:
      logging.info(
        'replay_capacity=%d reaches past the %d rows of checkpoint %d: '
        'using rows [%d, %d).',
        self._replay_capacity,
        num_file_rows,
        suffix,
        self._start,
        self._start + count,
      )
      self._warned_capacity = True
    plan = (self._start, count, None)
    if self._subsample == 'first_rows':
      where = f'checkpoint {suffix} of {self._data_dir}'
      count = subsample_lib.first_rows_count(
        count, self._subsample_fraction, where
      )
      plan = (self._start, count, None)
    elif self._subsample in subsample_lib.EPISODE_METHODS:
      plan = subsample_lib.plan_window(
        checkpoints.read_terminal_window(
          files, self._start, count, verify=self._verify_checksums
        ),
        self._stack_size,
        self._update_horizon,
        self._subsample,
        self._subsample_fraction,
        subsample_lib.episode_rng(self._seed, suffix),
      )
    self._plans[suffix] = plan
    return plan

  def _set_bytes(self, suffixes):
    """Bytes needed to hold the given checkpoints' windows."""
    for suffix in suffixes:
      if suffix not in self._shard_bytes:
        start, count = self._window_of(suffix)
        names = ['observation', 'action', 'reward', 'terminal']
        self._shard_bytes[suffix], _ = memory.shard_bytes(
          self._headers_of(suffix), start, count, names + self._extra_names
        )
    return memory.total([self._shard_bytes[s] for s in suffixes])

  def _load_shard(self, suffix):
    """Reads one checkpoint window and wraps it as a ReplayShard."""
    start, count, kept = self._plan(suffix)
    began = time.perf_counter()
    window = checkpoints.read_checkpoint(
      self._files[suffix],
      start,
      count,
      observation_shape=self._observation_shape,
      observation_dtype=self._observation_dtype,
      elements=self._extra_names,
      verify=self._verify_checksums,
    )
    # Only now, every file checked, may samplers see these rows.
    shard = shard_lib.ReplayShard(
      window, self._stack_size, self._update_horizon, self._gamma
    )
    if kept is not None:  # Only the rows of the episodes kept.
      shard.valid_rows = np.intersect1d(shard.valid_rows, kept)
    seconds = time.perf_counter() - began
    logging.info(
      'Loaded checkpoint %d rows [%d, %d): %d valid transitions, %s in '
      '%.1f s (%s)',
      suffix,
      start,
      start + count,
      shard.num_valid,
      memory.format_bytes(shard.nbytes),
      seconds,
      'files checked to their end'
      if self._verify_checksums
      else 'verify_checksums=False: files not checked past the window',
    )
    if not shard.num_valid:
      logging.warning(
        'Checkpoint %d has no valid transition in rows [%d, %d)',
        suffix,
        start,
        start + count,
      )
    return shard

  def _load_shards(self, suffixes, parallel=False, reuse=()):
    """Loads checkpoints (reusing already loaded shards), with progress."""
    reusable = {s.suffix: s for s in reuse}
    to_load = [s for s in suffixes if s not in reusable]
    logging.info(
      'Loading checkpoints %s from %s (reusing %s)',
      to_load,
      self._data_dir,
      sorted(set(suffixes) & set(reusable)),
    )
    workers = min(len(to_load), os.cpu_count() or 1) if parallel else 1
    with progress.bar(
      total=len(to_load), unit='ckpt', desc='loading checkpoints'
    ) as bar:
      if workers > 1:
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
          loaded = list(pool.map(self._load_shard, to_load))
          bar.update(len(to_load))
      else:
        loaded = []
        for suffix in to_load:
          loaded.append(self._load_shard(suffix))
          bar.update(1)
    reusable.update({s.suffix: s for s in loaded})
    return [reusable[s] for s in suffixes]

  def _publish(self, shards):
    """Makes `shards` the set samplers draw from (one assignment)."""
    active = _ShardSet(shards)
    if not active.total:
      raise ValueError(
        f'Checkpoints {active.suffixes} of {self._data_dir} hold no '
        f'valid transition for stack_size={self._stack_size}, '
        f'update_horizon={self._update_horizon} in their windows'
      )
    with self._swapped_in:
      self._active = active
      self._swapping = False
      self._swapped_in.notify_all()

  def _snapshot(self):
    """The current set; waits while a reload has nothing to show yet."""
    active = self._active
    if active.total:
      return active
    with self._swapped_in:
      while self._swapping:
        self._swapped_in.wait()
      if not self._active.total:
        raise RuntimeError(
          f'No checkpoint of {self._data_dir} is loaded: the last reload '
          'failed'
        )
      return self._active

  def _start_refresh(self):
    """Starts loading a new random set in the background."""
    suffixes = self._draw_suffixes(self._num_buffers_to_load)
    current = self._active
    new_bytes = self._set_bytes(
      [s for s in suffixes if s not in current.by_suffix]
    )
    held = self._set_bytes(current.suffixes)
    self._rolling = held + new_bytes > self._budget
    if self._rolling:
      largest = max(self._set_bytes([s]) for s in suffixes)
      memory.check_fits(
        held + largest,
        self._budget,
        'Replacing one loaded checkpoint at a time',
      )
      logging.info(
        'Double-buffering %s would need %s (budget %s): replacing '
        'checkpoints one at a time instead.',
        suffixes,
        memory.format_bytes(held + new_bytes),
        memory.format_bytes(self._budget),
      )
      self._pending = self._executor.submit(self._roll_in, suffixes)
    else:
      self._pending = self._executor.submit(
        self._load_shards, suffixes, False, current.shards
      )

  def _roll_in(self, suffixes):
    """Replaces loaded shards one at a time by those of `suffixes`."""
    for suffix in suffixes:
      current = self._active
      if suffix in current.by_suffix:
        continue
      new_shard = self._load_shard(suffix)
      shards = list(self._active.shards)
      outgoing = next(
        i for i, s in enumerate(shards) if s.suffix not in suffixes
      )
      shards[outgoing] = new_shard
      self._publish(shards)
    return None

  def reload_buffer(self, num_buffers=None):
    """Swaps in a new random set of checkpoints.

    With prefetching, the set loaded in the background since the last call is
    swapped in at once (waiting only if it is not ready yet) and the next set
    starts loading. Without it, the new set is loaded now.

    Args:
      num_buffers: int or None, checkpoints to hold (default
        num_buffers_to_load).
    """
    if self._replay_suffix is not None:
      return
    if num_buffers is not None:
      num_buffers = self._available(num_buffers)
    if num_buffers is not None and num_buffers != self._num_buffers_to_load:
      self._num_buffers_to_load = num_buffers
      self._cancel_pending()
    began = time.perf_counter()
    if self._prefetch and self._pending is not None:
      # A load that failed (a damaged file) raises here, once.
      pending, self._pending = self._pending, None
      shards = pending.result()
      if shards is not None:
        self._publish(shards)
    else:
      self._reload_now(self._draw_suffixes(self._num_buffers_to_load))
    logging.info(
      'Swapped in checkpoints %s after waiting %.2f s',
      self._active.suffixes,
      time.perf_counter() - began,
    )
    if self._prefetch:
      self._start_refresh()

  def _reload_now(self, suffixes):
    """Loads `suffixes` in the foreground (no prefetch) and swaps them in.

    Samplers in other threads keep the current set until the new one is in
    when both fit in the budget; otherwise the outgoing checkpoints are freed
    first and samplers wait for the new set: they never see an empty one.
    """
    current = self._active
    kept = [s for s in current.shards if s.suffix in suffixes]
    incoming = [s for s in suffixes if s not in current.by_suffix]
    memory.check_fits(
      self._set_bytes(suffixes),
      self._budget,
      f'Loading checkpoints {suffixes}',
    )
    if self._set_bytes(current.suffixes + incoming) > self._budget:
      with self._swapped_in:
        self._swapping = True
        self._active = _ShardSet(kept)
    try:
      self._publish(self._load_shards(suffixes, parallel=True, reuse=kept))
    finally:
      with self._swapped_in:
        self._swapping = False
        self._swapped_in.notify_all()

  def reload_data(self):
    """Dopamine JAX name for reloading: a new set unless one suffix is fixed."""
    self.reload_buffer(self._num_buffers_to_load)

  def _cancel_pending(self):
    if self._pending is not None:
      self._pending.cancel()
      try:
        self._pending.result()
      except concurrent.futures.CancelledError:
        pass
      self._pending = None

  def close(self):
    """Stops background loading."""
    self._cancel_pending()
    self._executor.shutdown(wait=True)

  # --------------------------------------------------------------- sampling

  @property
  def batch_size(self):
    return self._batch_size

  @property
  def replay_capacity(self):
    """Rows kept per checkpoint (a window may hold fewer, see the log)."""
    return self._replay_capacity

  @property
  def loaded_suffixes(self):
    """Suffixes of the checkpoints currently sampled from."""
    return self._active.suffixes

  @property
  def _replay_buffers(self):
    """batch_rl's list of loaded buffers, for code written against it.

    Dopamine's JaxFixedReplayBuffer reads `_replay_buffers[0]._replay_capacity`;
    each entry says the configured capacity and the checkpoint's suffix.
    """
    return [
      types.SimpleNamespace(_replay_capacity=self._replay_capacity, suffix=s)
      for s in self._active.suffixes
    ]

  @property
  def add_count(self):
    """Rows currently loaded (Dopamine agents compare it to a minimum)."""
    return np.array(sum(s.window.num_rows for s in self._active.shards))

  @property
  def num_valid_transitions(self):
    return self._active.total

  @property
  def nbytes(self):
    """Bytes held by the loaded shards."""
    return sum(s.nbytes for s in self._active.shards)

  def get_transition_elements(self, batch_size=None):
    """Dopamine's transition signature plus `suffix` (see shard.py)."""
    batch_size = self._batch_size if batch_size is None else batch_size
    if batch_size not in self._elements_by_batch_size:  # Built once per size.
      self._elements_by_batch_size[batch_size] = tuple(
        shard_lib.transition_elements(batch_size, **self._element_signature)
      )
    return self._elements_by_batch_size[batch_size]

  def shard(self, suffix=None):
    """The loaded ReplayShard of checkpoint `suffix` (None: the only one)."""
    active = self._active
    return active.shards[_position_of(active, suffix)]

  def is_valid_transition(self, index, suffix=None):
    """Whether file row `index` of checkpoint `suffix` may be sampled."""
    return self.shard(suffix).is_valid_transition(index)

  def _draw(self, batch_size, active):
    """Returns (shard positions, file rows) of batch_size valid transitions."""
    if self._mix_checkpoints:
      positions = self._rng.integers(0, active.total, batch_size)
      which = np.searchsorted(active.ends, positions, side='right')
    else:
      chosen = self._rng.integers(len(active.shards))
      which = np.full(batch_size, chosen)
      positions = active.starts[chosen] + self._rng.integers(
        0, active.shards[chosen].num_valid, batch_size
      )
    if len(active.shards) == 1:
      return which, active.shards[0].valid_rows[positions]
    rows = np.empty(batch_size, dtype=np.int64)
    for i in np.unique(which):  # One vectorized lookup per shard.
      members = which == i
      rows[members] = active.shards[i].valid_rows[
        positions[members] - active.starts[i]
      ]
    return which, rows

  def sample_index_batch(self, batch_size=None):
    """Draws (suffixes, file rows) of batch_size valid transitions."""
    batch_size = self._batch_size if batch_size is None else batch_size
    active = self._snapshot()
    which, rows = self._draw(batch_size, active)
    return active.suffix_array[which], rows

  def sample_transition_batch(
    self, batch_size=None, indices=None, suffixes=None
  ):
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
    """
    # One snapshot for the whole call: a background swap cannot pull the
    # checkpoints away between drawing rows and reading them.
    active = self._snapshot()
    if indices is None:
      batch_size = self._batch_size if batch_size is None else batch_size
      which, indices = self._draw(batch_size, active)
    else:
      indices = np.asarray(indices, dtype=np.int64)
      if suffixes is None:
        suffixes = active.suffixes[_position_of(active, None)]
      suffixes = np.broadcast_to(np.asarray(suffixes), indices.shape)
      which = np.empty(len(indices), dtype=np.int64)
      for suffix in np.unique(suffixes):
        which[suffixes == suffix] = _position_of(active, int(suffix))
    elements = self.get_transition_elements(len(indices))
    batch = shard_lib.empty_batch(elements)
    for i in np.unique(which) if len(active.shards) > 1 else [0]:
      destinations = np.flatnonzero(which == i)
      rows = indices[destinations]
      if suffixes is not None:  # Rows drawn here are valid by construction.
        active.shards[i].check_indices(rows)
      active.shards[i].write_transitions(rows, batch, destinations)
    return tuple(batch[e.name] for e in elements)

  def sample(self, size=None, with_sample_metadata=False):
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
    from dopamine.jax.replay_memory import samplers

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
      return element, samplers.SampleMetadata(keys=batch['indices'])
    return element

  # ------------------------------------------------------ read-only dataset

  def add(self, *args, **kwargs):
    """The dataset is read-only: transitions are never added."""
    del args, kwargs
    raise NotImplementedError(
      'FixedReplayBuffer is read-only: offline agents must not add '
      'transitions to the dataset.'
    )

  def save(self, checkpoint_dir, iteration_number):
    """Does nothing: the dataset on disk is the buffer's state."""
    del checkpoint_dir, iteration_number

  def load(self, checkpoint_dir, suffix):
    """Does nothing: data comes from `data_dir`, never from a checkpoint."""
    del checkpoint_dir, suffix


# Dopamine's labs/offline_rl buffer, built on this one (via batch_rl's path).
_LABS_MODULE = 'dopamine.labs.offline_rl.fixed_replay'


def _labs_buffer_class():
  """Dopamine's JaxFixedReplayBuffer when a config has bound it, else None.

  Every gin file of Dopamine's labs/offline_rl imports its fixed_replay
  module and binds `JaxFixedReplayBuffer.replay_capacity` (a required
  argument there).
  """
  labs = sys.modules.get(_LABS_MODULE)
  if labs is None:
    return None
  try:
    gin.query_parameter('JaxFixedReplayBuffer.replay_capacity')
  except ValueError:
    return None
  return labs.JaxFixedReplayBuffer


@gin.configurable
def replay_buffer_class(memory_class=None):
  """The buffer every offline agent, TF or JAX, trains from.

  Bind `replay_buffer_class.memory_class = @CompactReplayBuffer` (after
  `import fixed_replay.replay.compact_replay_buffer`) to train on a compact
  store. Unbound, it is FixedReplayBuffer, or Dopamine's
  `JaxFixedReplayBuffer` (itself a FixedReplayBuffer) when a config of
  Dopamine's labs/offline_rl binds that, so its bindings take effect.

  Args:
    memory_class: a class taking FixedReplayBuffer's constructor arguments
      by name, or None.

  Returns:
    the buffer class.
  """
  return memory_class or _labs_buffer_class() or FixedReplayBuffer
