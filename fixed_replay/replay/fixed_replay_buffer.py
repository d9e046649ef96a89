"""FixedReplayBuffer: samples Dopamine replay checkpoints without the RAM.

Keeps the contract of batch_rl's `FixedReplayBuffer` and Dopamine's
`JaxFixedReplayBuffer` (same arguments, `reload_buffer`, `reload_data`), with
these differences a researcher can rely on:

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

The class only chooses the checkpoints (checkpoint_selection.py) and how
their windows are read (checkpoint_loading.py); holding sets in turn is
checkpoint_sets.py's, sampling the replay core's (core.py).
"""

import sys
import types

import gin
import numpy as np

from fixed_replay.dataset import checkpoints
from fixed_replay.replay import checkpoint_loading
from fixed_replay.replay import checkpoint_selection
from fixed_replay.replay import checkpoint_sets
from fixed_replay.replay import memory_budget as memory
from fixed_replay.replay import stacking

# Kept importable from here (its old home).
select_checkpoints = checkpoint_selection.select_checkpoints


@gin.configurable
class FixedReplayBuffer(checkpoint_sets.SetRotation):
  """Samples transitions from Dopamine replay checkpoints on disk."""

  # Deliberately spelled out (also in CompactReplayBuffer and the TF
  # wrapper): gin binds `FixedReplayBuffer.<name>` against this signature and
  # Dopamine's JaxFixedReplayBuffer relies on its names.
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
    # The first batch needs the stacking kernels: load them while the
    # windows inflate.
    stacking.warm_up_in_background()
    super().__init__(locals())
    # Dopamine's JaxFixedReplayBuffer (dopamine/labs/offline_rl) subclasses
    # batch_rl's buffer, i.e. this one, and keeps these two as attributes set
    # before calling us instead of passing them on.
    start = getattr(
      self, '_replay_transitions_start_index', replay_transitions_start_index
    )
    num_buffers = getattr(self, '_num_buffers_to_load', num_buffers_to_load)
    found = checkpoints.find_checkpoints(
      self._data_dir, wanted=self._replay_suffix
    )
    files = checkpoint_selection.select_checkpoints(
      found,
      self._replay_suffix,
      replay_file_start_index,
      replay_file_end_index,
      self._data_dir,
    )
    sets = checkpoint_selection.RandomSets(files, self._rng, self._data_dir)
    loader = checkpoint_loading.WindowLoader(
      files,
      self._data_dir,
      start,
      dict(
        replay_capacity=replay_capacity,
        observation_shape=self._observation_shape,
        observation_dtype=self._observation_dtype,
        stack_size=stack_size,
        update_horizon=update_horizon,
        gamma=gamma,
        extra_names=self._extra_names,
        subsample=subsample,
        subsample_fraction=subsample_fraction,
        seed=seed,
      ),
      bool(verify_checksums),
    )
    self._start_sets(
      loader,
      sets,
      1 if self._replay_suffix is not None else sets.available(num_buffers),
      memory.available_bytes() if memory_budget is None else memory_budget,
      prefetch,
    )

  @property
  def _replay_buffers(self):
    """batch_rl's list of loaded buffers, for code written against it.

    Dopamine's JaxFixedReplayBuffer reads `_replay_buffers[0]._replay_capacity`;
    each entry says the configured capacity and the checkpoint's suffix.
    """
    return [
      types.SimpleNamespace(_replay_capacity=self._replay_capacity, suffix=s)
      for s in self.loaded_suffixes
    ]


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
