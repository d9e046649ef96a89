"""FixedReplayBuffer: samples any fixed replay dataset without the RAM.

Keeps the contract of batch_rl's `FixedReplayBuffer` and Dopamine's
`JaxFixedReplayBuffer` (same arguments, `reload_buffer`, `reload_data`) over
whatever `data_dir` holds, decided from its files:

* Dopamine's checkpoint files (a run directory or its `replay_logs/`, local
  or gs://): only the window [replay_transitions_start_index, +
  replay_capacity) of each checkpoint is decompressed and held, read by
  streaming, `num_buffers_to_load` checkpoints at a time (batch_rl's 5 when
  unbound), the next set loading in a background thread (`prefetch`) while
  training samples the current one.
* A compact store (`fixed-replay convert SRC DST`): frames stay compressed
  on disk and each batch decodes the units it uses, so every checkpoint can
  be sampled at once; that is what an unbound
  `num_buffers_to_load` does. Bound, it keeps batch_rl's meaning: that many
  checkpoints per iteration, drawn anew at each reload.

Either way every transition is exactly the one Dopamine's
`OutOfGraphReplayBuffer`, loaded with the whole file, returns for that file
row; rows whose stack or n-step future would leave the window are never
sampled, and no row of a damaged file ever reaches the samplers.

`subsample` and `subsample_fraction` choose among the published meanings of
"x% of the data" (see fixed_replay/sources/dopamine/subsample.py).
"""

import os
import sys
import types

from absl import logging
import gin
import numpy as np

from fixed_replay import arguments as arguments_lib
from fixed_replay.replay import batch_kernels
from fixed_replay.replay import buffer_arguments
from fixed_replay.replay import checkpoint_loading
from fixed_replay.replay import checkpoint_sets
from fixed_replay.replay import compact_windows
from fixed_replay.replay import core
from fixed_replay.replay import transitions
from fixed_replay.sources import layout
from fixed_replay.sources.dopamine import checkpoints
from fixed_replay.store import manifest as manifest_lib
from fixed_replay.store import observation_spec

STORE = 'compact store'
DOPAMINE = "Dopamine's checkpoint files"


def locate_dataset(data_dir: str) -> tuple[str, str]:
  """What `data_dir` holds and where to read it.

  The one place a buffer decides what kind of dataset it samples.

  Args:
    data_dir: str, a compact store, or Dopamine's checkpoint files: a run
      directory (with `replay_logs/`) or the checkpoint folder itself.

  Returns:
    (kind, directory): STORE or DOPAMINE, and the directory to read.
  """
  found = layout.detect(str(data_dir)).require_trainable()
  kind = STORE if found.kind is layout.Kind.STORE else DOPAMINE
  return kind, found.data_dir


class FixedReplayBufferBase(core.ReplayCore):
  """Samples transitions from a fixed dataset on disk, outside gin.

  FixedReplayBuffer is this class under gin. Code that passes every argument
  itself (batches.py, for PyTorch and JAX loops) builds this one:
  gin's bindings are for its agents, and gin's note on errors ("In call to
  configurable 'FixedReplayBuffer'") would only mislead there.
  """

  # Sampling threads over a store when `sampling_threads` is None.
  store_sampling_threads = min(2, os.cpu_count() or 1)

  # Deliberately spelled out: gin binds `FixedReplayBuffer.<name>` against
  # this signature and Dopamine's JaxFixedReplayBuffer relies on its names.
  def __init__(
    self,
    data_dir,
    replay_suffix=None,
    observation_shape=None,
    stack_size=None,
    replay_capacity=1_000_000,
    batch_size=32,
    update_horizon=None,
    gamma=0.99,
    max_sample_attempts=1000,
    extra_storage_types=None,
    observation_dtype=None,
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
    memory_budget=None,
    seed=None,
    subsample=None,
    subsample_fraction=None,
    subsample_seed=None,
    verify_checksums=True,
    cache_bytes=None,
    sampling_threads=None,
    ready_batches=4,
  ):
    """Finds the checkpoints and loads (or opens) the first set.

    Returns once the first set is loaded and, by default, verified.

    Args:
      data_dir: str, Dopamine's checkpoint files (a run directory or its
        replay_logs/, local or gs://) or a compact store.
      replay_suffix: int or None; if set, only this checkpoint is used (0 is
        a checkpoint like any other).
      observation_shape: tuple, shape of one observation, or None (the
        default) for the data's (see store/observation_spec.py).
      stack_size: int, frames per state, or None: a store's, else 4 for
        Atari frames (84x84 uint8) and 1 for other observations.
      replay_capacity: int, rows kept per checkpoint, counted from
        replay_transitions_start_index; larger than a checkpoint means the
        whole checkpoint.
      batch_size: int, default minibatch size.
      update_horizon: int, n of the n-step return, or None: the one a
        store was converted for, else 1.
      gamma: float, discount.
      max_sample_attempts: int, kept for Dopamine compatibility; sampling
        draws only valid rows, so it never retries.
      extra_storage_types: list of ReplayElements stored beside the four
        standard arrays (Dopamine's `$store$_<name>` files, a store's
        `<name>.npy`), each added to every batch at the transition's own
        row, as Dopamine does: e.g. `ReplayElement('unclipped_reward', (),
        np.float32)`, the game's reward, which conversions of RL Unplugged
        data keep. Every selected checkpoint must hold them.
      observation_dtype: dtype of observations, or None for the data's.
      terminal_dtype: dtype of the returned terminal flags.
      action_shape: tuple, shape of one action.
      action_dtype: dtype of actions.
      reward_shape: tuple, shape of one reward (n-step sums need ()).
      reward_dtype: dtype of rewards.
      replay_file_start_index: int, first position in the sorted list of
        checkpoint suffixes to use (as in Dopamine's JaxFixedReplayBuffer).
      replay_file_end_index: int or None, end (exclusive) of that slice.
      replay_transitions_start_index: int, first file row of each window.
      num_buffers_to_load: int or None, checkpoints sampled per iteration
        (a new random set at each reload_buffer); more than the data holds
        uses all of them (with one warning). None: batch_rl's 5 over
        Dopamine's files (all of them, silently, where there are fewer),
        every checkpoint at once over a compact store.
      mix_checkpoints: bool, True samples uniformly over the valid
        transitions of all loaded checkpoints; False draws each minibatch
        from one checkpoint chosen at random, as batch_rl does.
      prefetch: bool, load the next set of Dopamine checkpoints in the
        background (batch_rl's meaning; a store's sets open at the reload,
        reading only their small arrays).
      memory_budget: int or None, bytes the loaded data may take; None uses
        the memory available when the buffer is created.
      seed: int or None, seeds sampling and the choice of checkpoints (and
        of the episodes 'random_episodes' keeps; 0 when None).
      subsample: None (every row of each window) or how to take "x% of the
        data" from each checkpoint's window: 'first_rows' (the CQL code),
        'random_episodes' (the REM paper) or 'first_episodes' (Dopamine's
        TFDS loader); see fixed_replay/sources/dopamine/subsample.py.
      subsample_fraction: float in (0, 1], the x (0.01 for 1%).
      subsample_seed: int or None, seeds the episodes 'random_episodes'
        keeps instead of `seed` (None: `seed`): the ranks of one model and
        their DataLoader workers keep one subsample while each draws its
        own stream (fixed_replay/ranks.py).
      verify_checksums: bool. True (default): a checkpoint's rows reach the
        samplers only after each of its files passed its gzip CRC-32 and
        length check; for a window shorter than its file that means
        inflating (and discarding) the rest of the file, in the constructor
        for the first set and in the background for later ones, and a
        failed check fails the load. False skips inflating the rest, for
        data verified once (`fixed-replay inspect --verify`); files read to
        their end are checked either way, at no cost. A store's small files
        are checked on opening (its frame units whenever decoded).
      cache_bytes: unused, and warned about when given: a store's buffer
        keeps no cache of decoded frames (kept so that configs binding it
        still parse).
      sampling_threads: int or None, threads preparing default-size
        minibatches ahead (0: sample in the caller). None: 2 (1 on one core)
        over a store, whose block decoding runs outside the GIL; 0 over
        Dopamine's files.
      ready_batches: int >= 1, minibatches the sampling threads keep ready
        (counted in the memory budget).

    Raises:
      CheckpointError: if the directory holds no usable checkpoint, or a
        file of the first set is damaged, a selected checkpoint lacks an
        element of extra_storage_types (naming it and the checkpoint's
        file), a store's checkpoints disagree with each other, or the
        observation shape or dtype asked for disagrees with the data.
      ValueError: on inconsistent arguments.
      MemoryError: if the configuration cannot fit, before allocating.
    """
    # The first batch needs the stacking kernels: load them while the
    # windows inflate.
    batch_kernels.warm_up_in_background()
    arguments = dict(locals())
    arguments_lib.check_arguments(arguments)
    kind, data_dir = locate_dataset(data_dir)
    self.kind = kind  # STORE or DOPAMINE.
    logging.info('FixedReplayBuffer over %s: %s', kind, data_dir)
    data = _DATA[kind]
    selected = checkpoint_sets.select_checkpoints(
      data.find(data_dir, replay_suffix),
      None if replay_suffix is None else int(replay_suffix),
      replay_file_start_index,
      replay_file_end_index,
      data_dir,
    )
    arguments.update(
      observation_spec.resolve(selected[min(selected)], arguments),
      data_dir=data_dir,
    )
    if cache_bytes is not None:
      logging.warning(
        'cache_bytes=%r is unused: a store buffer decodes the units each '
        'batch uses and caches none',
        cache_bytes,
      )
    a = buffer_arguments.BufferArguments.build(arguments)
    seed_sequence = np.random.SeedSequence(a.seed)
    super().__init__(a, np.random.default_rng(data.rng_seed(seed_sequence)))
    # Dopamine's JaxFixedReplayBuffer (dopamine/labs/offline_rl) subclasses
    # batch_rl's buffer, i.e. this one, and keeps these two as attributes set
    # before calling us instead of passing them on.
    start = getattr(
      self, '_replay_transitions_start_index', replay_transitions_start_index
    )
    num_buffers = getattr(self, '_num_buffers_to_load', num_buffers_to_load)
    budget = (
      checkpoint_loading.available_bytes()
      if memory_budget is None
      else memory_budget
    )
    if sampling_threads is None:
      sampling_threads = data.sampling_threads(self)
    sampling_threads = sampling_threads or 0
    if sampling_threads:
      self._use_sampling_threads(seed_sequence, sampling_threads, ready_batches)
    settings = checkpoint_loading.WindowSettings(
      arguments=a,
      start=start,
      verify=bool(verify_checksums),
      sampling_threads=sampling_threads,
      ready_batches=ready_batches,
      batch_bytes=transitions.batch_bytes(self.get_transition_elements()),
    )
    sets = checkpoint_sets.RandomSets(selected, self._rng, data_dir)
    self._rotation = data.rotation(
      settings, selected, sets, num_buffers, budget, prefetch
    )

  @property
  def _replay_buffers(self):
    """batch_rl's list of loaded buffers, for code written against it.

    Dopamine's JaxFixedReplayBuffer reads `_replay_buffers[0]._replay_capacity`;
    each entry says the configured capacity and the checkpoint's suffix (read
    from the arguments: that class's `replay_capacity` reads this list).
    """
    capacity = self._arguments.replay_capacity
    return [
      types.SimpleNamespace(_replay_capacity=capacity, suffix=s)
      for s in self.loaded_suffixes
    ]


class _StoreData:
  """What a compact store decides: its checkpoints, sampling, rotation."""

  @staticmethod
  def find(data_dir, replay_suffix):
    del replay_suffix  # select_checkpoints picks it from all of them.
    return manifest_lib.find_stored_checkpoints(data_dir)

  @staticmethod
  def rng_seed(seed_sequence):
    # The generator CompactReplayBuffer always drew from, so seeded streams
    # over a store stay what they were.
    return seed_sequence.spawn(1)[0]

  @staticmethod
  def sampling_threads(buffer):
    # Its units decode outside the GIL, so threads sample in parallel.
    return buffer.store_sampling_threads

  @staticmethod
  def rotation(settings, selected, sets, num_buffers, budget, prefetch):
    """Every checkpoint opened at once, or num_buffers a set (prefetch is
    moot: a set opens at the reload, reading only its small arrays)."""
    del prefetch
    a = settings.arguments
    manifests = compact_windows.check_selection(selected, settings)

    def open_set(suffixes):
      return compact_windows.open_store(
        [selected[s] for s in suffixes or sorted(selected)],
        settings,
        budget,
        manifests,
      )

    every = num_buffers is None or a.replay_suffix is not None
    if not every and num_buffers >= len(selected):
      sets.available(num_buffers)  # Warns when more were asked for.
      every = True
    if every:
      rotation = checkpoint_sets.SetRotation(a, budget)
    else:
      logging.info(
        'num_buffers_to_load=%d: sampling %d of the %d checkpoints of %s per '
        'iteration, drawn anew at each reload as batch_rl does. Bind '
        '`FixedReplayBuffer.num_buffers_to_load = None` to sample all of them '
        'at once, uniformly.',
        num_buffers,
        num_buffers,
        len(selected),
        a.data_dir,
      )
      rotation = checkpoint_sets.SetRotation(a, budget, sets, num_buffers)
    rotation.open_sets(open_set)
    return rotation


class _DopamineData:
  """What Dopamine's checkpoint files decide: windows loaded into RAM."""

  @staticmethod
  def find(data_dir, replay_suffix):
    return checkpoints.find_checkpoints(data_dir, wanted=replay_suffix)

  @staticmethod
  def rng_seed(seed_sequence):
    return seed_sequence

  @staticmethod
  def sampling_threads(buffer):
    del buffer  # Samples in the caller, as batch_rl's buffer does.
    return 0

  @staticmethod
  def rotation(settings, selected, sets, num_buffers, budget, prefetch):
    """batch_rl's sets of num_buffers (5 unbound) loaded in turn."""
    a = settings.arguments
    checkpoint_loading.check_gzip_extras(selected, settings.extra_names)
    if num_buffers is None:  # batch_rl's 5, or all there are: no warning.
      num_buffers = min(5, len(selected))
    num_buffers = (
      1 if a.replay_suffix is not None else sets.available(num_buffers)
    )
    rotation = checkpoint_sets.SetRotation(a, budget, sets, num_buffers)
    rotation.start_loading(
      checkpoint_loading.WindowLoader(selected, settings), prefetch
    )
    return rotation


# The one place each kind of data's decisions are looked up.
_DATA = {STORE: _StoreData, DOPAMINE: _DopamineData}


@gin.configurable
class FixedReplayBuffer(FixedReplayBufferBase):
  """Samples transitions from a fixed dataset on disk.

  Takes FixedReplayBufferBase's arguments; gin binds them as
  `FixedReplayBuffer.<name>`.
  """


DEFAULT_STORE_BUDGET = 1_500_000_000


@gin.configurable
class CompactReplayBuffer(FixedReplayBuffer):
  """FixedReplayBuffer under the name older store configs bind.

  `replay_buffer_class.memory_class = @CompactReplayBuffer` and
  `CompactReplayBuffer.<name>` keep working (its module path is an alias of
  this one); the one other default is a 1.5 GB memory budget.
  """

  def __init__(
    self,
    data_dir,
    replay_suffix=None,
    *,
    memory_budget=DEFAULT_STORE_BUDGET,
    **kwargs,
  ):
    """Takes FixedReplayBuffer's arguments, by name after the first two."""
    super().__init__(
      data_dir, replay_suffix, memory_budget=memory_budget, **kwargs
    )


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
def replay_buffer_class(memory_class: type | None = None) -> type:
  """The buffer class every offline agent, TF or JAX, trains from.

  The one place the class is chosen. FixedReplayBuffer reads Dopamine's
  files and compact stores alike, so no binding is needed for either;
  Dopamine's `JaxFixedReplayBuffer` (itself a FixedReplayBuffer) is taken
  when a config of Dopamine's labs/offline_rl binds it, so its bindings take
  effect. `replay_buffer_class.memory_class = @CompactReplayBuffer` (older
  configs' way to train on a store) still works.

  Args:
    memory_class: a class taking FixedReplayBuffer's constructor arguments
      by name, or None.

  Returns:
    the buffer class.
  """
  return memory_class or _labs_buffer_class() or FixedReplayBuffer
