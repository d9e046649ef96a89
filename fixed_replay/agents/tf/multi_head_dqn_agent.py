"""Offline Ensemble-DQN and REM: K Q-heads on one torso.

Agarwal et al. (2020), "An Optimistic Perspective on Offline Reinforcement
Learning". batch_rl trains both with one agent and `transform_strategy`:

* 'IDENTITY' (Ensemble-DQN): head k regresses on
  r + gamma^n max_a Q_target_k(s', a) (1 - terminal) with a Huber loss; the
  loss is the mean over heads and over the minibatch.
* 'STOCHASTIC' (REM): every training step draws a K x M matrix whose M
  columns are U(0, 1)^K draws normalised to sum to 1; the online and the
  target heads are both mixed by that same matrix, giving M convex
  combinations sum_k alpha_k Q_k that take the heads' place in the loss
  above. M = `num_convex_combinations` is 1 in the REM paper.

Either way the agent acts greedily on the mean of the heads.
"""

from typing import Any

from dopamine.tf.agents.dqn import dqn_agent
import gin
import tensorflow as tf

from fixed_replay.agents.tf import networks
from fixed_replay.agents.tf import offline

# Published optimizer of Ensemble-DQN, REM and QR-DQN on the DQN Replay
# Dataset.
ADAM_LEARNING_RATE = 0.00005
ADAM_EPSILON = 0.0003125
TRANSFORM_STRATEGIES = ('IDENTITY', 'STOCHASTIC')


def default_adam() -> tf.compat.v1.train.Optimizer:
  """A fresh Adam optimizer with the published offline settings."""
  return tf.compat.v1.train.AdamOptimizer(
    learning_rate=ADAM_LEARNING_RATE, epsilon=ADAM_EPSILON
  )


def chosen_action_values(
  values: tf.Tensor, actions: tf.Tensor, num_actions: int
) -> tf.Tensor:
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


def minimize_mean(agent: Any, loss: tf.Tensor, name: str) -> tf.Operation:
  """Sets agent.loss to the mean loss (and its summary); returns the update op.

  Args:
    agent: the TF agent (its summary_writer and optimizer).
    loss: tensor of per-transition (or per-head) losses.
    name: str, the loss's summary name ('HuberLoss', ...).
  """
  agent.loss = tf.reduce_mean(loss)
  if agent.summary_writer is not None:
    with tf.compat.v1.variable_scope('Losses'):
      tf.compat.v1.summary.scalar(name, agent.loss)
  return agent.optimizer.minimize(agent.loss)


def random_convex_weights(
  num_heads: int, num_combinations: int = 1
) -> tf.Tensor:
  """Returns a [num_heads, num_combinations] tensor of convex weights.

  Each column holds U(0, 1) draws normalised to sum to 1. The draw is an
  op: every `sess.run` that needs it draws once, and every tensor computed
  from it in that run sees the same weights.
  """
  weights = tf.random.uniform(
    [num_heads, num_combinations], minval=0.0, maxval=1.0
  )
  return weights / tf.reduce_sum(weights, axis=0, keepdims=True)


def mix_heads(q_heads: tf.Tensor, weights: tf.Tensor) -> tf.Tensor:
  """[batch, num_actions, K] x [K, M] -> [batch, num_actions, M]."""
  return tf.tensordot(q_heads, weights, axes=[[2], [0]])


@gin.configurable
class FixedReplayMultiHeadDQNAgent(offline.OfflineAgent, dqn_agent.DQNAgent):
  """Ensemble-DQN or REM trained only from logged replay checkpoints."""

  def __init__(
    self,
    *args: Any,
    num_heads: int = 200,
    transform_strategy: str = 'IDENTITY',
    num_convex_combinations: int = 1,
    network: type = networks.AtariMultiHeadQNetwork,
    **kwargs: Any,
  ) -> None:
    """Creates the agent.

    Args:
      *args: `OfflineAgent`'s (sess, num_actions, replay_data_dir,
        replay_suffix, init_checkpoint_dir), also taken by name.
      num_heads: int, K, the number of Q-value heads.
      transform_strategy: str, 'IDENTITY' (Ensemble-DQN) or 'STOCHASTIC'
        (REM), batch_rl's argument.
      num_convex_combinations: int, M, mixtures drawn per step with
        'STOCHASTIC' (batch_rl's argument; the REM paper uses 1).
      network: Keras model class called as network(num_actions, num_heads,
        name=...) and returning `networks.MultiHeadNetworkType`.
      **kwargs: Dopamine DQNAgent arguments; `optimizer` None or absent
        gives Adam with the published learning rate 5e-5 and epsilon
        3.125e-4.

    Raises:
      ValueError: on a non-positive num_heads or num_convex_combinations, or
        an unknown transform_strategy.
    """
    if num_heads < 1:
      raise ValueError(f'num_heads must be positive, got {num_heads}')
    if transform_strategy not in TRANSFORM_STRATEGIES:
      raise ValueError(
        f'transform_strategy={transform_strategy!r}: choose '
        f"'IDENTITY' (Ensemble-DQN) or 'STOCHASTIC' (REM)"
      )
    if num_convex_combinations < 1:
      raise ValueError(
        'num_convex_combinations must be positive, got '
        f'{num_convex_combinations}'
      )
    self.num_heads = num_heads
    self.transform_strategy = transform_strategy
    self.num_convex_combinations = num_convex_combinations
    self.loss = None  # Scalar minibatch loss, set by _build_train_op.
    self._mixing_weights = None
    super().__init__(*args, network=network, **kwargs)

  def _default_optimizer(self):
    return default_adam()

  @property
  def method(self) -> str:
    """'REM' or 'Ensemble-DQN', as transform_strategy says."""
    return 'REM' if self.transform_strategy == 'STOCHASTIC' else 'Ensemble-DQN'

  @property
  def mixing_weights(self) -> tf.Tensor | None:
    """REM's mixture of the current step: [K] tensor ([K, M] when M > 1).

    Fetch it in the same `sess.run` as the train op to see the weights that
    update used. None for Ensemble-DQN.
    """
    if self._mixing_weights is None or self.num_convex_combinations > 1:
      return self._mixing_weights
    return self._mixing_weights[:, 0]

  def _create_network(self, name):
    return self.network(self.num_actions, self.num_heads, name=name)

  def _build_networks(self) -> None:
    if self.transform_strategy == 'STOCHASTIC':
      # Drawn before the Q-ops so online and target mixtures share it.
      self._mixing_weights = random_convex_weights(
        self.num_heads, self.num_convex_combinations
      )
    super()._build_networks()

  def _transformed(self, q_heads):
    """The heads the loss sees: as they are, or REM's mixtures of them."""
    if self._mixing_weights is None:
      return q_heads
    return mix_heads(q_heads, self._mixing_weights)

  def _not_terminal(self):
    return 1.0 - tf.cast(self._replay.terminals, tf.float32)

  def _build_target_q_op(self):
    """Returns the [batch, K or M] TD targets, one per head or mixture."""
    next_q = self._transformed(self._replay_next_target_net_outputs.q_heads)
    next_max = tf.reduce_max(next_q, axis=1)  # Over actions.
    discount = self.cumulative_gamma * self._not_terminal()
    return self._replay.rewards[:, None] + discount[:, None] * next_max

  def _build_train_op(self):
    chosen_q = chosen_action_values(
      self._transformed(self._replay_net_outputs.q_heads),
      self._replay.actions,
      self.num_actions,
    )
    target = tf.stop_gradient(self._build_target_q_op())
    loss = tf.compat.v1.losses.huber_loss(
      target, chosen_q, reduction=tf.compat.v1.losses.Reduction.NONE
    )
    return minimize_mean(self, loss, 'HuberLoss')
