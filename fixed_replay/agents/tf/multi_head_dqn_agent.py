"""Offline Ensemble-DQN: K Q-heads on one torso, each with its own TD target.

Agarwal et al. (2020), "An Optimistic Perspective on Offline Reinforcement
Learning": head k regresses on r + gamma^n max_a Q_target_k(s', a) (1 -
terminal) with a Huber loss; the loss is the mean over heads and over the
minibatch. The agent acts greedily on the mean of the heads.
"""

from dopamine.tf.agents.dqn import dqn_agent
import gin
import tensorflow as tf

from fixed_replay.agents.tf import networks
from fixed_replay.agents.tf import offline

# Published optimizer of Ensemble-DQN, REM and QR-DQN on the DQN Replay
# Dataset.
ADAM_LEARNING_RATE = 0.00005
ADAM_EPSILON = 0.0003125


def default_adam():
  """A fresh Adam optimizer with the published offline settings."""
  return tf.compat.v1.train.AdamOptimizer(
    learning_rate=ADAM_LEARNING_RATE, epsilon=ADAM_EPSILON
  )


def chosen_action_values(values, actions, num_actions):
  """Selects, per transition, the values of the action taken.

  Args:
    values: [batch, num_actions, k] tensor (heads or quantiles).
    actions: [batch] int tensor.
    num_actions: int.

  Returns:
    [batch, k] tensor.
  """
  one_hot = tf.one_hot(actions, num_actions, 1.0, 0.0)[:, :, None]
  return tf.reduce_sum(values * one_hot, axis=1)


@gin.configurable
class FixedReplayMultiHeadDQNAgent(offline.OfflineAgent, dqn_agent.DQNAgent):
  """Ensemble-DQN trained only from logged replay checkpoints."""

  def __init__(
    self,
    sess,
    num_actions,
    replay_data_dir,
    replay_suffix=None,
    init_checkpoint_dir=None,
    num_heads=200,
    network=networks.AtariMultiHeadQNetwork,
    optimizer=None,
    **kwargs,
  ):
    """Creates the agent.

    Args:
      sess: tf.compat.v1.Session.
      num_actions: int.
      replay_data_dir: str, directory of replay checkpoints.
      replay_suffix: int or None, train on this checkpoint only.
      init_checkpoint_dir: str or None, warm-start weights from here.
      num_heads: int, K, the number of Q-value heads.
      network: Keras model class called as network(num_actions, num_heads,
        name=...) and returning `networks.MultiHeadNetworkType`.
      optimizer: tf.compat.v1.train.Optimizer; None gives Adam with the
        published learning rate 5e-5 and epsilon 3.125e-4.
      **kwargs: Dopamine DQNAgent arguments.

    Raises:
      ValueError: if num_heads < 1.
    """
    if num_heads < 1:
      raise ValueError(f'num_heads must be positive, got {num_heads}')
    self.num_heads = num_heads
    self.loss = None  # Scalar minibatch loss, set by _build_train_op.
    self._init_offline(replay_data_dir, replay_suffix, init_checkpoint_dir)
    dqn_agent.DQNAgent.__init__(
      self,
      sess,
      num_actions,
      network=network,
      optimizer=optimizer or default_adam(),
      **kwargs,
    )
    self._finish_offline_init()

  def _create_network(self, name):
    return self.network(self.num_actions, self.num_heads, name=name)

  def _not_terminal(self):
    return 1.0 - tf.cast(self._replay.terminals, tf.float32)

  def _build_target_q_op(self):
    """Returns the [batch, num_heads] TD targets, one per head."""
    next_q_heads = self._replay_next_target_net_outputs.q_heads
    next_max = tf.reduce_max(next_q_heads, axis=1)  # Over actions.
    discount = self.cumulative_gamma * self._not_terminal()
    return self._replay.rewards[:, None] + discount[:, None] * next_max

  def _build_train_op(self):
    chosen_q = chosen_action_values(
      self._replay_net_outputs.q_heads, self._replay.actions, self.num_actions
    )
    target = tf.stop_gradient(self._build_target_q_op())
    loss = tf.compat.v1.losses.huber_loss(
      target, chosen_q, reduction=tf.compat.v1.losses.Reduction.NONE
    )
    return self._minimize(loss)

  def _minimize(self, loss):
    """Records the mean loss (and its summary); returns the update op."""
    self.loss = tf.reduce_mean(loss)
    if self.summary_writer is not None:
      with tf.compat.v1.variable_scope('Losses'):
        tf.compat.v1.summary.scalar('HuberLoss', self.loss)
    return self.optimizer.minimize(self.loss)
