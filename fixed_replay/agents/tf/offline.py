"""What turns a Dopamine TF agent into an offline one.

`OfflineAgent` is mixed in before a Dopamine agent class: the agent's replay
is a `WrappedFixedReplayBuffer` over a logged dataset, `step` and
`end_episode` only act (nothing is ever added to the data), and training is
driven by the runner through `train_step`.
"""

import os

from absl import logging
import tensorflow as tf

from fixed_replay.replay.wrapped_fixed_replay_buffer import (
  WrappedFixedReplayBuffer,
)


class OfflineAgent:
  """Mixin for Dopamine TF agents that learn only from a fixed dataset."""

  def _init_offline(self, replay_data_dir, replay_suffix, init_checkpoint_dir):
    """Records the dataset; call before the Dopamine agent's __init__.

    Args:
      replay_data_dir: str, directory of replay checkpoints.
      replay_suffix: int or None, a single checkpoint to train on.
      init_checkpoint_dir: str or None, a run directory (or its
        `checkpoints/` folder) whose latest weights initialise the networks.
    """
    self._replay_data_dir = replay_data_dir
    self._replay_suffix = replay_suffix
    self._init_checkpoint_dir = init_checkpoint_dir

  def _finish_offline_init(self):
    """Call after the Dopamine agent's __init__."""
    # All the data exists from the start: a warm-up threshold means nothing.
    self.min_replay_history = 0
    if self._init_checkpoint_dir:
      self._warm_start(self._init_checkpoint_dir)

  def _warm_start(self, directory):
    """Restores network weights from the latest TF checkpoint in directory."""
    candidates = [os.path.join(directory, 'checkpoints'), directory]
    for candidate in candidates:
      path = tf.train.latest_checkpoint(candidate)
      if path is None and tf.io.gfile.isdir(candidate):
        path = _latest_dopamine_checkpoint(candidate)
      if path:
        self._saver.restore(self._sess, path)
        logging.info('Warm-started %s from %s', self.__class__.__name__, path)
        return
    raise ValueError(
      f'init_checkpoint_dir={directory}: no TensorFlow '
      f'checkpoint (tf_ckpt-N) found there or in its '
      f'checkpoints/ folder'
    )

  def _build_replay_buffer(self, use_staging):
    """Returns the in-graph sampler over the fixed dataset."""
    return WrappedFixedReplayBuffer(
      data_dir=self._replay_data_dir,
      replay_suffix=self._replay_suffix,
      observation_shape=self.observation_shape,
      stack_size=self.stack_size,
      use_staging=use_staging,
      update_horizon=self.update_horizon,
      gamma=self.gamma,
      observation_dtype=self.observation_dtype.as_numpy_dtype,
    )

  def begin_episode(self, observation):
    """Returns the first action of an evaluation episode."""
    self._reset_state()
    self._record_observation(observation)
    self.action = self._select_action()
    return self.action

  def step(self, reward, observation):
    """Returns the next action; the transition is not stored anywhere."""
    del reward
    self._record_observation(observation)
    self.action = self._select_action()
    return self.action

  def end_episode(self, reward):
    """Nothing to do: offline agents never add to their data."""
    del reward

  def train_step(self):
    """One training step (an update every `update_period` steps)."""
    self._train_step()

  def reload_data(self):
    """Swaps in the next set of checkpoints (prefetched in the background)."""
    self._replay.reload_buffer()

  @property
  def replay(self):
    """The WrappedFixedReplayBuffer the agent trains from."""
    return self._replay


def _latest_dopamine_checkpoint(directory):
  """Returns the newest `tf_ckpt-N` prefix in a Dopamine checkpoint folder."""
  numbers = []
  for name in tf.io.gfile.listdir(directory):
    if name.startswith('tf_ckpt-') and name.endswith('.index'):
      numbers.append(int(name[len('tf_ckpt-') : -len('.index')]))
  if not numbers:
    return None
  return os.path.join(directory, f'tf_ckpt-{max(numbers)}')
