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
  loaded with the whole gzip file, returns for that file row (the replay
  core's transition math, transitions.py, run once over a minibatch mixing
  any checkpoints; only the frames come from another place);
* frames stay compressed on disk, decoded a block at a time into a cache
  bounded in bytes; the small per-row arrays (action, reward, terminal: 9
  bytes) and the valid rows (int32) are held in memory, so memory is ~13
  bytes per row plus the cache (0.9 GB for 50 x 1M rows with the default
  256 MiB cache), checked against `memory_budget` before anything is read;
* background threads prepare minibatches ahead (decoding and stacking run
  outside the GIL).
"""

import os

from absl import logging
import gin
import numpy as np

from fixed_replay.replay import checkpoint_selection
from fixed_replay.replay import compact_windows
from fixed_replay.replay import core
from fixed_replay.store import manifest as manifest_lib

DEFAULT_MEMORY_BUDGET = 1_500_000_000
DEFAULT_CACHE_BYTES = compact_windows.DEFAULT_CACHE_BYTES


@gin.configurable
class CompactReplayBuffer(core.ReplayCore):
  """Samples uniformly over all checkpoints of a compact store.

  Nothing is loaded in sets: every selected checkpoint is sampled at once,
  its frames read through a bounded cache of decoded blocks
  (frame_sources.BlockFrames).
  """

  # Deliberately spelled out, as FixedReplayBuffer's: gin binds
  # `CompactReplayBuffer.<name>` against this signature, and the shared
  # arguments keep FixedReplayBuffer's names, order and defaults.
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
    super().__init__(locals())
    if num_buffers_to_load is not None:
      logging.info(
        'num_buffers_to_load=%s ignored: CompactReplayBuffer samples every '
        'selected checkpoint at once',
        num_buffers_to_load,
      )
    seed_sequence = np.random.SeedSequence(seed)
    self._rng = np.random.default_rng(seed_sequence.spawn(1)[0])
    workers = (
      min(2, os.cpu_count() or 1) if num_workers is None else num_workers
    )
    if prefetch and workers > 0:
      self._prefetch_batches(seed_sequence, workers, prefetch_batches)
    found = manifest_lib.find_stored_checkpoints(self._data_dir)
    selected = checkpoint_selection.select_checkpoints(
      found,
      self._replay_suffix,
      replay_file_start_index,
      replay_file_end_index,
      self._data_dir,
    )
    settings = self._window_settings(workers, prefetch_batches)
    settings.update(start=replay_transitions_start_index, verify=verify)
    self._publish(
      compact_windows.open_store(
        list(selected.values()), settings, memory_budget, cache_bytes
      )
    )

  def _window_settings(self, workers, prefetch_batches):
    elements = self.get_transition_elements()
    return dict(
      stack_size=self._stack_size,
      update_horizon=self._update_horizon,
      gamma=self._gamma,
      observation_shape=self._observation_shape,
      observation_dtype=self._observation_dtype,
      extra_names=self._extra_names,
      subsample=self._subsample,
      subsample_fraction=self._subsample_fraction,
      seed=self._seed,
      data_dir=self._data_dir,
      replay_capacity=self._replay_capacity,
      batch_bytes=sum(
        np.dtype(e.type).itemsize * int(np.prod(e.shape)) for e in elements
      ),
      workers=workers,
      prefetch_batches=prefetch_batches,
    )

  @property
  def cache(self):
    """The BlockCache of decoded frame blocks."""
    return self._source.cache
