"""In-graph sampling from a FixedReplayBuffer for Dopamine's TF agents.

This module also holds `FixedReplayBuffer`, as batch_rl's
`fixed_replay_buffer` module held both (its old path is an alias of this
one).
"""

from dopamine.tf.replay_memory import circular_replay_buffer
import gin
import numpy as np

from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer
from fixed_replay.replay.fixed_replay_buffer import replay_buffer_class

__all__ = ['FixedReplayBuffer', 'WrappedFixedReplayBuffer']


@gin.configurable(
  denylist=['observation_shape', 'stack_size', 'update_horizon', 'gamma']
)
class WrappedFixedReplayBuffer(circular_replay_buffer.WrappedReplayBuffer):
  """Dopamine's `WrappedReplayBuffer` whose memory is a FixedReplayBuffer.

  Each `sess.run` of a tensor in `self.transition` samples a new minibatch
  (through `tf.numpy_function`), exactly as with Dopamine's own buffer. The
  transition dict has one more entry than Dopamine's: `suffix`.
  """

  # Deliberately spelled out: batch_rl's and Dopamine's argument order, for
  # positional callers and `WrappedFixedReplayBuffer.<name>` gin bindings.
  def __init__(
    self,
    data_dir,
    replay_suffix=None,
    observation_shape=(84, 84),
    stack_size=4,
    use_staging=False,
    replay_capacity=None,
    batch_size=None,
    update_horizon=1,
    gamma=0.99,
    wrapped_memory=None,
    max_sample_attempts=1000,
    extra_storage_types=None,
    observation_dtype=np.uint8,
    terminal_dtype=np.uint8,
    action_shape=(),
    action_dtype=np.int32,
    reward_shape=(),
    reward_dtype=np.float32,
    memory_class=None,
    **memory_kwargs,
  ):
    """Creates (or wraps) a FixedReplayBuffer and its sampling ops.

    batch_rl's arguments, in batch_rl's order; everything else is passed on
    to the buffer.

    Args:
      data_dir: str, directory of replay checkpoints.
      replay_suffix: int or None, a single checkpoint to use; None leaves it
        to FixedReplayBuffer's own gin binding.
      observation_shape: tuple of ints.
      stack_size: int.
      use_staging: bool, ignored by Dopamine 4.x (kept for its signature).
      replay_capacity: int or None, rows kept per checkpoint; None leaves it
        to FixedReplayBuffer's own default or gin binding.
      batch_size: int or None, likewise.
      update_horizon: int.
      gamma: float.
      wrapped_memory: an existing FixedReplayBuffer to use instead.
      max_sample_attempts: int, for Dopamine compatibility.
      extra_storage_types: list of ReplayElements.
      observation_dtype: np.dtype.
      terminal_dtype: np.dtype.
      action_shape: tuple of ints.
      action_dtype: np.dtype.
      reward_shape: tuple of ints.
      reward_dtype: np.dtype.
      memory_class: None (the class `replay_buffer_class()` chooses for TF
        and JAX agents alike), or a class to pass it; kept for configs that
        bind it here.
      **memory_kwargs: any other argument of the buffer class
        (num_buffers_to_load, replay_file_start_index, subsample, seed, ...),
        bindable here as `WrappedFixedReplayBuffer.<name>`.
    """
    # Only what is decided here is passed on explicitly: everything else
    # (replay_suffix, replay_capacity, num_buffers_to_load, ...) stays
    # bindable in gin as `FixedReplayBuffer.<name>`, where our configs bind
    # it.
    chosen = dict(
      replay_suffix=replay_suffix,
      replay_capacity=replay_capacity,
      batch_size=batch_size,
    )
    chosen = {k: v for k, v in chosen.items() if v is not None}
    # One decision of the class, replay_buffer_class's; a class given here
    # (the old `WrappedFixedReplayBuffer.memory_class` binding) goes to it.
    memory_class = (
      replay_buffer_class(memory_class=memory_class)
      if memory_class is not None
      else replay_buffer_class()
    )
    # The element signature, passed alike to the buffer and to Dopamine.
    signature = dict(
      extra_storage_types=extra_storage_types,
      observation_dtype=observation_dtype,
      terminal_dtype=terminal_dtype,
      action_shape=action_shape,
      action_dtype=action_dtype,
      reward_shape=reward_shape,
      reward_dtype=reward_dtype,
    )
    memory = wrapped_memory or memory_class(
      data_dir,
      observation_shape=observation_shape,
      stack_size=stack_size,
      update_horizon=update_horizon,
      gamma=gamma,
      **signature,
      **chosen,
      **memory_kwargs,
    )
    super().__init__(
      observation_shape,
      stack_size,
      use_staging=use_staging,
      replay_capacity=memory.replay_capacity,
      batch_size=memory.batch_size,
      update_horizon=update_horizon,
      gamma=gamma,
      wrapped_memory=memory,
      max_sample_attempts=max_sample_attempts,
      **signature,
    )

  def reload_buffer(self, num_buffers: int | None = None) -> None:
    """Swaps in a new set of checkpoints (see FixedReplayBuffer)."""
    self.memory.reload_buffer(num_buffers)

  def reload_data(self) -> None:
    self.memory.reload_data()
