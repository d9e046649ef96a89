"""Offline Random Ensemble Mixture (REM) agent.

Agarwal et al. (2020): the network has K Q-heads; every training step draws
alpha ~ U(0, 1)^K, normalised to sum to 1, and both the online and the
target Q-functions become the same convex combination sum_k alpha_k Q_k. The
Huber TD loss is taken on that mixture. The agent acts greedily on the mean
of the heads.
"""

import gin
import tensorflow as tf

from fixed_replay.agents.tf import multi_head_dqn_agent


def random_convex_weights(num_heads):
  """Returns a [num_heads] tensor: U(0, 1) draws normalised to sum to 1.

  The draw is an op: every `sess.run` that needs it draws once, and every
  tensor computed from it in that run sees the same weights.
  """
  weights = tf.random.uniform([num_heads], minval=0.0, maxval=1.0)
  return weights / tf.reduce_sum(weights)


def mix_heads(q_heads, weights):
  """[batch, num_actions, num_heads] x [num_heads] -> [batch, num_actions]."""
  return tf.tensordot(q_heads, weights, axes=[[2], [0]])


@gin.configurable
class FixedReplayREMAgent(multi_head_dqn_agent.FixedReplayMultiHeadDQNAgent):
  """REM trained only from logged replay checkpoints.

  Arguments are those of FixedReplayMultiHeadDQNAgent. `mixing_weights` is
  the tensor of this training step's alpha: fetch it in the same `sess.run`
  as the train op to see the weights that update used.
  """

  def _build_networks(self):
    # Built before the Q-ops so online and target mixtures share one draw.
    self._mixing_weights = random_convex_weights(self.num_heads)
    super()._build_networks()

  @property
  def mixing_weights(self):
    """[num_heads] tensor: the convex combination of the current step."""
    return self._mixing_weights

  def _build_target_q_op(self):
    """Returns r + gamma^n max_a sum_k alpha_k Q_target_k(s', a) (1 - done)."""
    next_q = mix_heads(
      self._replay_next_target_net_outputs.q_heads, self._mixing_weights
    )
    discount = self.cumulative_gamma * self._not_terminal()
    return self._replay.rewards + discount * tf.reduce_max(next_q, axis=1)

  def _build_train_op(self):
    replay_q = mix_heads(self._replay_net_outputs.q_heads, self._mixing_weights)
    one_hot = tf.one_hot(self._replay.actions, self.num_actions, 1.0, 0.0)
    chosen_q = tf.reduce_sum(replay_q * one_hot, axis=1)
    target = tf.stop_gradient(self._build_target_q_op())
    loss = tf.compat.v1.losses.huber_loss(
      target, chosen_q, reduction=tf.compat.v1.losses.Reduction.NONE
    )
    return self._minimize(loss)
