"""A replay core that holds random sets of checkpoints in turn, batch_rl's way.

`SetRotation` holds `num_buffers_to_load` checkpoints at a time (windows in
RAM, frame_sources.ShardFrames) and swaps in a new random set at each
`reload_buffer()`. With prefetching the next set loads in a background
thread while training samples the current one; when the budget cannot hold
both sets, the new checkpoints are rolled in one at a time instead. Without
prefetching, a reload that cannot hold both frees the outgoing checkpoints
first, and samplers in other threads wait for the new set: they never see an
empty one. A store's sets are opened whole at the reload instead.

Which checkpoints may be used at all (`replay_suffix`, the
`replay_file_*_index` slice) is decided here too, for every source.
"""

import concurrent.futures
import contextlib
import threading
import time

from absl import logging

from fixed_replay import progress
from fixed_replay.replay import checkpoint_loading
from fixed_replay.replay import core
from fixed_replay.replay import frame_sources


def select_checkpoints(
  found: dict,
  replay_suffix: int | None,
  file_start: int,
  file_end: int | None,
  data_dir: str,
) -> dict:
  """Applies replay_suffix or the replay_file_*_index slice to `found`.

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


class RandomSets:
  """Draws the sets of checkpoints a buffer holds, batch_rl's way."""

  def __init__(self, suffixes, rng, data_dir):
    """Keeps the selection.

    Args:
      suffixes: iterable of int, the selected checkpoints.
      rng: np.random.Generator, shared with sampling (one seed for both).
      data_dir: str, for the messages.
    """
    self.suffixes = sorted(suffixes)
    self._rng = rng
    self._data_dir = data_dir
    self._warned = False

  def available(self, num_buffers: int) -> int:
    """num_buffers, or all the checkpoints when fewer exist (warns once)."""
    if num_buffers <= len(self.suffixes):
      return num_buffers
    if not self._warned:
      self._warned = True
      logging.warning(
        'num_buffers_to_load=%d but %s has %d usable checkpoint(s) %s: '
        'using all of them.',
        num_buffers,
        self._data_dir,
        len(self.suffixes),
        self.suffixes,
      )
    return len(self.suffixes)

  def draw(self, num_buffers: int) -> list[int]:
    """Draws num_buffers distinct checkpoint suffixes at random."""
    chosen = self._rng.choice(self.suffixes, num_buffers, replace=False)
    return sorted(int(s) for s in chosen)


class SetRotation(core.ReplayCore):
  """ReplayCore over a rotating set of checkpoints loaded into RAM."""

  def _start_sets(self, loader, sets, num_buffers, budget, prefetch):
    """Loads the first set (in the foreground) and starts prefetching.

    Args:
      loader: checkpoint_loading.WindowLoader of the selected checkpoints.
      sets: RandomSets drawing the sets.
      num_buffers: int, checkpoints held at a time.
      budget: int, bytes the loaded windows may take.
      prefetch: bool, load the next set in the background.

    Raises:
      MemoryError: if the first set cannot fit, before reading it.
    """
    self._loader = loader
    self._init_sets(sets, num_buffers, budget)
    self._executor = concurrent.futures.ThreadPoolExecutor(
      max_workers=1, thread_name_prefix='fixed_replay_prefetch'
    )
    first = sets.draw(num_buffers)
    checkpoint_loading.check_fits(
      loader.set_bytes(first),
      budget,
      f'Loading {len(first)} checkpoint(s) {first}',
    )
    self._publish_shards(loader.load_shards(first, parallel=True))
    self._prefetch = prefetch and len(sets.suffixes) > num_buffers
    if self._prefetch:
      self._start_refresh()

  def _init_sets(self, sets, num_buffers, budget):
    """The state every way of holding sets in turn shares."""
    self._sets = sets
    self._num_buffers_to_load = num_buffers
    self._budget = budget
    # Used while a reload without prefetch has freed the outgoing set and
    # the new one is not in yet: samplers wait instead of seeing nothing.
    self._swapped_in = threading.Condition()
    self._swapping = False
    self._source = frame_sources.ShardFrames([])
    self._executor = None  # Loads the next set in the background.
    self._pending = None  # Future of the next set (or of a rolling refresh).
    self._pending_suffixes = None  # The checkpoints it loads.
    self._prefetch = False
    self._open_set = None  # suffixes -> a new source, for sets opened whole.
    self.rolling = False  # Whether the last refresh replaces one at a time.

  @property
  def rotates(self) -> bool:
    """Whether reload_buffer swaps in other checkpoints (some are not held)."""
    return self._sets is not None and (
      len(self._sets.suffixes) > self._num_buffers_to_load
    )

  def _replace_source(self, source):
    """Publishes a source opened whole, then closes the one it replaces."""
    with self._swapped_in:
      outgoing, self._source = self._source, source
    outgoing.close()

  def _publish_shards(self, shards):
    """Makes `shards` the set samplers draw from (one assignment)."""
    source = frame_sources.ShardFrames(shards)
    if not source.table.total:
      raise ValueError(
        f'Checkpoints {source.table.suffixes} of {self.data_dir} hold no '
        f'valid transition for stack_size={self._arguments.stack_size}, '
        f'update_horizon={self._arguments.update_horizon} in their windows'
      )
    with self._swapped_in:
      self._source = source
      self._swapping = False
      self._swapped_in.notify_all()

  def _current(self):
    """The current set; waits while a reload has nothing to show yet."""
    source = self._source
    if source.table.total:
      return source
    with self._swapped_in:
      while self._swapping:
        self._swapped_in.wait()
      if not self._source.table.total:
        raise RuntimeError(
          f'No checkpoint of {self.data_dir} is loaded: the last reload '
          'failed'
        )
      return self._source

  def _start_refresh(self, suffixes=None):
    """Starts loading `suffixes` (None: a new random set) in the background."""
    if suffixes is None:
      suffixes = self._sets.draw(self._num_buffers_to_load)
    self._pending_suffixes = suffixes
    current = self._source
    set_bytes = self._loader.set_bytes
    new_bytes = set_bytes([s for s in suffixes if s not in current.by_suffix])
    held = set_bytes(current.table.suffixes)
    self.rolling = held + new_bytes > self._budget
    if self.rolling:
      largest = max(set_bytes([s]) for s in suffixes)
      checkpoint_loading.check_fits(
        held + largest,
        self._budget,
        'Replacing one loaded checkpoint at a time',
      )
      logging.info(
        'Double-buffering %s would need %s (budget %s): replacing '
        'checkpoints one at a time instead.',
        suffixes,
        progress.format_bytes(held + new_bytes),
        progress.format_bytes(self._budget),
      )
      self._pending = self._executor.submit(self._roll_in, suffixes)
    else:
      self._pending = self._executor.submit(
        self._loader.load_shards, suffixes, False, current.shards
      )

  def _roll_in(self, suffixes):
    """Replaces loaded shards one at a time by those of `suffixes`."""
    for suffix in suffixes:
      if suffix in self._source.by_suffix:
        continue
      new_shard = self._loader.load_shard(suffix)
      shards = list(self._source.shards)
      outgoing = next(
        i for i, s in enumerate(shards) if s.suffix not in suffixes
      )
      shards[outgoing] = new_shard
      self._publish_shards(shards)
    return None

  def reload_buffer(self, num_buffers: int | None = None) -> None:
    """Swaps in a new random set of checkpoints.

    With prefetching, the set loaded in the background since the last call is
    swapped in at once (waiting only if it is not ready yet) and the next set
    starts loading. Without it, the new set is loaded now.

    Args:
      num_buffers: int or None, checkpoints to hold (default
        num_buffers_to_load).
    """
    if self._arguments.replay_suffix is not None or self._sets is None:
      return
    if num_buffers is not None:
      num_buffers = self._sets.available(num_buffers)
    if num_buffers is not None and num_buffers != self._num_buffers_to_load:
      self._num_buffers_to_load = num_buffers
      self._cancel_pending()
    began = time.perf_counter()
    with self._batches_paused():
      if self._prefetch and self._pending is not None:
        # A load that failed (a damaged file) raises here, once.
        pending, self._pending = self._pending, None
        shards = pending.result()
        if shards is not None:
          self._publish_shards(shards)
      elif self._open_set is not None:
        self._replace_source(
          self._open_set(self._sets.draw(self._num_buffers_to_load))
        )
      else:
        self._reload_now(self._sets.draw(self._num_buffers_to_load))
    logging.info(
      'Swapped in checkpoints %s of %s after waiting %.2f s',
      self._source.table.suffixes,
      self.data_dir,
      time.perf_counter() - began,
    )
    if self._prefetch:
      self._start_refresh()

  def _reload_now(self, suffixes):
    """Loads `suffixes` in the foreground (no prefetch) and swaps them in."""
    current = self._source
    kept = [s for s in current.shards if s.suffix in suffixes]
    incoming = [s for s in suffixes if s not in current.by_suffix]
    set_bytes = self._loader.set_bytes
    checkpoint_loading.check_fits(
      set_bytes(suffixes), self._budget, f'Loading checkpoints {suffixes}'
    )
    if set_bytes(current.table.suffixes + incoming) > self._budget:
      with self._swapped_in:
        self._swapping = True
        self._source = frame_sources.ShardFrames(kept)
    try:
      self._publish_shards(
        self._loader.load_shards(suffixes, parallel=True, reuse=kept)
      )
    finally:
      with self._swapped_in:
        self._swapping = False
        self._swapped_in.notify_all()

  def state_dict(self) -> dict:
    """ReplayCore's stream place, and the checkpoints held and loading."""
    state = super().state_dict()
    if self.rotates:
      state['loaded'] = [int(s) for s in self._source.table.suffixes]
      if self._pending is not None:
        state['next'] = [int(s) for s in self._pending_suffixes]
    return state

  def load_state_dict(self, state: dict) -> None:
    """ReplayCore's, after loading the checkpoints `state` held.

    The set loading in the background is then the one that was loading
    (so the next reload swaps in what it would have). Sets already held or
    loading are kept: rewinding within a set costs nothing.

    Raises:
      ValueError: if `state` names checkpoints this buffer may not load.
    """
    if self.rotates and 'loaded' in state:
      wanted = [int(s) for s in state['loaded']]
      following = state.get('next')
      unknown = set(wanted).union(following or ()) - set(self._sets.suffixes)
      if unknown or len(wanted) != self._num_buffers_to_load:
        raise ValueError(
          f'a stream state holding checkpoints {wanted}, for a buffer of '
          f'{self.data_dir} holding {self._num_buffers_to_load} of '
          f'{self._sets.suffixes}: build it with the arguments of the run '
          'that saved it'
        )
      loading = self._pending_suffixes if self._pending else None
      if wanted != list(self._source.table.suffixes) or following != loading:
        self._cancel_pending()
        if wanted != list(self._source.table.suffixes):
          with self._batches_paused():
            if self._open_set is not None:
              self._replace_source(self._open_set(wanted))
            else:
              self._reload_now(wanted)
        if following is not None:
          self._start_refresh([int(s) for s in following])
    super().load_state_dict(state)

  def reload_data(self) -> None:
    """Dopamine JAX name for reloading: a new set unless one suffix is fixed."""
    self.reload_buffer(self._num_buffers_to_load)

  def _cancel_pending(self):
    if self._pending is not None:
      self._pending.cancel()
      with contextlib.suppress(concurrent.futures.CancelledError):
        self._pending.result()
      self._pending = None

  def close(self) -> None:
    """Stops background loading."""
    self._cancel_pending()
    if self._executor is not None:
      self._executor.shutdown(wait=True)
    super().close()
