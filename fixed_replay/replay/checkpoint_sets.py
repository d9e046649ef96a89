"""Which checkpoints a buffer samples now, in random sets, batch_rl's way.

A buffer holds a `SetRotation` (composition: the buffer samples, the
rotation decides what from). It holds `num_buffers_to_load` checkpoints at
a time (windows in RAM, frame_sources.ShardFrames) and swaps in a new random
set at each `reload_buffer()`. With prefetching the next set loads in a
background thread while training samples the current one; when the budget
cannot hold both sets, the new checkpoints are rolled in one at a time
instead. Without prefetching, a reload that cannot hold both frees the
outgoing checkpoints first, and samplers in other threads wait for the new
set: they never see an empty one. A store's sets are opened whole at the
reload instead.

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


class SetRotation:
  """The checkpoints a buffer samples now, and the sets that follow them.

  A buffer holds one (composition: the buffer samples, this decides what it
  samples from). Either a fixed source (`sets` None: every checkpoint of a
  store, or one `replay_suffix`), store sets opened whole at each reload
  (`open_set`), or windows loaded into RAM a set at a time (`start_loading`).
  """

  def __init__(self, arguments, budget, sets=None, num_buffers=None):
    """Holds nothing yet: `open_sets` or `start_loading` fills it.

    Args:
      arguments: buffer_arguments.BufferArguments of the buffer (for the
        messages).
      budget: int, bytes the loaded windows may take.
      sets: RandomSets drawing the sets, or None for a fixed source.
      num_buffers: int, checkpoints held at a time (with `sets`).
    """
    self._arguments = arguments
    self._sets = sets
    self._num_buffers_to_load = num_buffers
    self._budget = budget
    # Used while a reload without prefetch has freed the outgoing set and
    # the new one is not in yet: samplers wait instead of seeing nothing.
    self._swapped_in = threading.Condition()
    self._swapping = False
    self._source = frame_sources.ShardFrames([])
    self._loader = None  # Loads windows into RAM (Dopamine's files).
    self._executor = None  # Loads the next set in the background.
    self._pending = None  # Future of the next set (or of a rolling refresh).
    self._pending_suffixes = None  # The checkpoints it loads.
    self._prefetch = False
    self._open_set = None  # suffixes -> a new source, for sets opened whole.
    self.rolling = False  # Whether the last refresh replaces one at a time.

  def open_sets(self, open_set) -> None:
    """Samples sets opened whole by `open_set(suffixes)`, the first now."""
    self._open_set = open_set
    if self._sets is None:
      self._source = open_set(None)
    else:
      self._source = open_set(self._sets.draw(self._num_buffers_to_load))

  def start_loading(self, loader, prefetch: bool) -> None:
    """Loads the first set into RAM (in the foreground), starts prefetching.

    Args:
      loader: checkpoint_loading.WindowLoader of the selected checkpoints.
      prefetch: bool, load the next set in the background.

    Raises:
      MemoryError: if the first set cannot fit, before reading it.
    """
    self._loader = loader
    self._executor = concurrent.futures.ThreadPoolExecutor(
      max_workers=1, thread_name_prefix='fixed_replay_prefetch'
    )
    first = self._sets.draw(self._num_buffers_to_load)
    checkpoint_loading.check_fits(
      loader.set_bytes(first),
      self._budget,
      f'Loading {len(first)} checkpoint(s) {first}',
    )
    self._publish_shards(loader.load_shards(first, parallel=True))
    self._prefetch = prefetch and self.rotates
    if self._prefetch:
      self._start_refresh()

  @property
  def rotates(self) -> bool:
    """Whether reload swaps in other checkpoints (some are not held)."""
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
      a = self._arguments
      raise ValueError(
        f'Checkpoints {source.table.suffixes} of {a.data_dir} hold no valid '
        f'transition for stack_size={a.stack_size}, '
        f'update_horizon={a.update_horizon} in their windows'
      )
    with self._swapped_in:
      self._source = source
      self._swapping = False
      self._swapped_in.notify_all()

  def current(self) -> frame_sources.FrameSource:
    """The current set; waits while a reload has nothing to show yet."""
    source = self._source
    if source.table.total:
      return source
    with self._swapped_in:
      while self._swapping:
        self._swapped_in.wait()
      if not self._source.table.total:
        raise RuntimeError(
          f'No checkpoint of {self._arguments.data_dir} is loaded: the last '
          'reload failed'
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

  def reload(self, num_buffers: int | None, paused) -> None:
    """Swaps in a new random set of checkpoints.

    With prefetching, the set loaded in the background since the last call is
    swapped in at once (waiting only if it is not ready yet) and the next set
    starts loading. Without it, the new set is loaded now.

    Args:
      num_buffers: int or None, checkpoints to hold (default: as many as
        now).
      paused: the buffer's context manager holding its sampling threads off
        while the source changes.
    """
    if self._sets is None:
      return
    if num_buffers is not None:
      num_buffers = self._sets.available(num_buffers)
    if num_buffers is not None and num_buffers != self._num_buffers_to_load:
      self._num_buffers_to_load = num_buffers
      self._cancel_pending()
    began = time.perf_counter()
    with paused():
      if self._prefetch and self._pending is not None:
        # A load that failed (a damaged file) raises here, once.
        pending, self._pending = self._pending, None
        shards = pending.result()
        if shards is not None:
          self._publish_shards(shards)
      else:
        self._swap_in(self._sets.draw(self._num_buffers_to_load))
    logging.info(
      'Swapped in checkpoints %s of %s after waiting %.2f s',
      self._source.table.suffixes,
      self._arguments.data_dir,
      time.perf_counter() - began,
    )
    if self._prefetch:
      self._start_refresh()

  def _swap_in(self, suffixes):
    """Makes `suffixes` the current set now, in the foreground."""
    if self._open_set is not None:
      self._replace_source(self._open_set(suffixes))
      return
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

  def state(self) -> dict:
    """The checkpoints held and loading (plain numbers), when it rotates."""
    if not self.rotates:
      return {}
    state = {'loaded': [int(s) for s in self._source.table.suffixes]}
    if self._pending is not None:
      state['next'] = [int(s) for s in self._pending_suffixes]
    return state

  def load_state(self, state: dict, paused) -> None:
    """Holds the checkpoints `state` held, and loads the set it was loading.

    The next reload then swaps in what it would have. Sets already held or
    loading are kept: rewinding within a set costs nothing.

    Raises:
      ValueError: if `state` names checkpoints this buffer may not load.
    """
    if not self.rotates or 'loaded' not in state:
      return
    wanted = [int(s) for s in state['loaded']]
    following = state.get('next')
    unknown = set(wanted).union(following or ()) - set(self._sets.suffixes)
    if unknown or len(wanted) != self._num_buffers_to_load:
      raise ValueError(
        f'a stream state holding checkpoints {wanted}, for a buffer of '
        f'{self._arguments.data_dir} holding {self._num_buffers_to_load} of '
        f'{self._sets.suffixes}: build it with the arguments of the run '
        'that saved it'
      )
    loading = self._pending_suffixes if self._pending else None
    held = list(self._source.table.suffixes)
    if wanted == held and following == loading:
      return
    self._cancel_pending()
    if wanted != held:
      with paused():
        self._swap_in(wanted)
    if following is not None:
      self._start_refresh([int(s) for s in following])

  def _cancel_pending(self):
    if self._pending is not None:
      self._pending.cancel()
      with contextlib.suppress(concurrent.futures.CancelledError):
        self._pending.result()
      self._pending = None

  def close(self) -> None:
    """Stops background loading and closes the current source."""
    self._cancel_pending()
    if self._executor is not None:
      self._executor.shutdown(wait=True)
    self._source.close()
