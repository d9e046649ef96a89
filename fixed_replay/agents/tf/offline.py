"""What turns a Dopamine TF agent into an offline one.

`OfflineAgent` is mixed in before a Dopamine agent class, with batch_rl's
contract: the agent's replay is a `WrappedFixedReplayBuffer` over a logged
dataset, `step` and `end_episode` only act (nothing is ever added to the
data), training is driven by the runner through `_train_step` (also exposed
as `train_step`), and `_replay_data_dir`, `_replay_suffix` and
`_init_checkpoint_dir` hold the constructor's arguments (the runner reads
the last to continue from another run, as batch_rl's does).
"""

from typing import Any

import numpy as np

from fixed_replay.agents.tf import runtime
from fixed_replay.agents.tf.wrapped_fixed_replay_buffer import (
  WrappedFixedReplayBuffer,
)


class OfflineAgent:
  """Mixin for Dopamine TF agents that learn only from a fixed dataset.

  Cooperative: list it before the Dopamine agent class; its `__init__` takes
  the dataset's arguments and passes everything else on to the next class
  in the MRO (the Dopamine agent, or a subclass's own `__init__` first).
  """

  # The method trained, named in the run log; subclasses refine it.
  method = 'DQN'

  def __init__(
    self,
    sess,
    num_actions,
    replay_data_dir,
    replay_suffix=None,
    init_checkpoint_dir=None,
    **kwargs,
  ):
    """Records the dataset, then builds the Dopamine agent.

    Args:
      sess: tf.compat.v1.Session.
      num_actions: int.
      replay_data_dir: str, directory of replay checkpoints.
      replay_suffix: int or None, a single checkpoint to train on (None
        leaves the choice to the buffer's gin bindings).
      init_checkpoint_dir: str or None, a run directory (or its
        `checkpoints/` folder) the runner continues from when its own
        base_dir has no checkpoint yet.
      **kwargs: the Dopamine agent's arguments; `tf_device` falls back to
        the CPU if it names a GPU this machine does not have.
    """
    runtime.use_graph_mode()
    self._replay_data_dir = replay_data_dir
    self._replay_suffix = replay_suffix
    self._init_checkpoint_dir = init_checkpoint_dir
    if 'tf_device' in kwargs:
      kwargs['tf_device'] = runtime.resolve_device(kwargs['tf_device'])
    if kwargs.get('optimizer') is None:
      # Made here, in graph mode, and fresh for each agent.
      optimizer = self._default_optimizer()
      if optimizer is not None:
        kwargs['optimizer'] = optimizer
    super().__init__(sess, num_actions, **kwargs)
    # All the data exists from the start: a warm-up threshold means nothing.
    self.min_replay_history = 0

  def _default_optimizer(self):
    """The optimizer when none is given; None keeps the Dopamine default."""
    return None

  def _build_replay_buffer(self, use_staging):
    """Returns the in-graph sampler over the fixed dataset."""
    # replay_suffix is passed only when chosen here, so that a gin binding
    # of WrappedFixedReplayBuffer.replay_suffix or
    # FixedReplayBuffer.replay_suffix takes effect otherwise.
    chosen = {}
    if self._replay_suffix is not None:
      chosen['replay_suffix'] = self._replay_suffix
    return WrappedFixedReplayBuffer(
      data_dir=self._replay_data_dir,
      observation_shape=self.observation_shape,
      stack_size=self.stack_size,
      use_staging=use_staging,
      update_horizon=self.update_horizon,
      gamma=self.gamma,
      observation_dtype=self.observation_dtype.as_numpy_dtype,
      **chosen,
    )

  def begin_episode(self, observation: np.ndarray) -> int:
    """Returns the first action of an evaluation episode."""
    self._reset_state()
    self._record_observation(observation)
    self.action = self._select_action()
    return self.action

  def step(self, reward: float, observation: np.ndarray) -> int:
    """Returns the next action; the transition is not stored anywhere."""
    del reward
    self._record_observation(observation)
    self.action = self._select_action()
    return self.action

  def end_episode(self, reward: float) -> None:
    """Nothing to do: offline agents never add to their data."""
    del reward

  def train_step(self) -> None:
    """One training step (an update every `update_period` steps)."""
    self._train_step()

  def reload_data(self) -> None:
    """Swaps in the next set of checkpoints (prefetched in the background)."""
    self._replay.reload_buffer()

  @property
  def replay(self) -> Any:
    """The WrappedFixedReplayBuffer the agent trains from."""
    return self._replay
