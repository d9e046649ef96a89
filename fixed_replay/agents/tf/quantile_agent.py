"""Offline QR-DQN (Dabney et al., 2018) as used on the DQN Replay Dataset.

The network gives N quantile values per action at the fractions
tau_hat_i = (i + 0.5) / N. The target of a transition is
r + gamma^n (1 - terminal) theta_target(s', a*), a* maximising the mean of
the target quantiles, and the loss is the quantile Huber loss: for each
pair (online quantile i, target quantile j) with u = target_j - online_i,
|tau_hat_i - 1{u < 0}| * huber_kappa(u) / kappa, averaged over the target
quantiles j and summed over the online quantiles i (then averaged over the
minibatch).
"""

from typing import Any

from dopamine.tf.agents.dqn import dqn_agent
import gin
import tensorflow as tf

from fixed_replay.agents.tf import multi_head_dqn_agent
from fixed_replay.agents.tf import networks
from fixed_replay.agents.tf import offline


def quantile_midpoints(num_quantiles: int) -> tf.Tensor:
  """Returns the [num_quantiles] fractions tau_hat_i = (i + 0.5) / N."""
  return (tf.range(num_quantiles, dtype=tf.float32) + 0.5) / num_quantiles


def quantile_huber_loss(
  target_quantiles: tf.Tensor, online_quantiles: tf.Tensor, kappa: float = 1.0
) -> tf.Tensor:
  """Quantile Huber loss of each transition.

  Args:
    target_quantiles: [batch, num_target] tensor, fixed targets.
    online_quantiles: [batch, num_quantiles] tensor, the online quantiles at
      tau_hat_i = (i + 0.5) / num_quantiles.
    kappa: float >= 0, the Huber threshold; 0 gives the plain quantile
      regression (pinball) loss.

  Returns:
    [batch] tensor: mean over target quantiles, sum over online quantiles.

  Raises:
    ValueError: if kappa is negative.
  """
  if kappa < 0:
    raise ValueError(f'kappa must be >= 0, got {kappa}')
  num_quantiles = tf.compat.dimension_value(online_quantiles.shape[-1])
  if num_quantiles is None:
    raise ValueError('online_quantiles needs a static last dimension')
  # errors[b, i, j] = target_j - online_i.
  errors = target_quantiles[:, None, :] - online_quantiles[:, :, None]
  abs_errors = tf.abs(errors)
  if kappa > 0:
    huber = tf.where(
      abs_errors <= kappa,
      0.5 * tf.square(errors),
      kappa * (abs_errors - 0.5 * kappa),
    )
    huber /= kappa
  else:
    huber = abs_errors
  tau_hat = quantile_midpoints(num_quantiles)[None, :, None]
  weights = tf.abs(tau_hat - tf.cast(errors < 0, tf.float32))
  return tf.reduce_sum(tf.reduce_mean(weights * huber, axis=2), axis=1)


def check_uniform(replay_scheme: str, agent: str) -> None:
  """Raises ValueError unless replay_scheme is 'uniform'."""
  if replay_scheme != 'uniform':
    raise ValueError(
      f'replay_scheme={replay_scheme!r}: offline {agent} samples the fixed '
      "dataset uniformly (it has no priorities); only 'uniform' is supported"
    )


@gin.configurable
class FixedReplayQuantileAgent(offline.OfflineAgent, dqn_agent.DQNAgent):
  """QR-DQN trained only from logged replay checkpoints."""

  method = 'QR-DQN'

  def __init__(
    self,
    *args: Any,
    num_atoms: int = 200,
    kappa: float = 1.0,
    network: type = networks.AtariQuantileNetwork,
    replay_scheme: str = 'uniform',
    **kwargs: Any,
  ) -> None:
    """Creates the agent.

    Args:
      *args: `OfflineAgent`'s (sess, num_actions, replay_data_dir,
        replay_suffix, init_checkpoint_dir), also taken by name.
      num_atoms: int, N, quantiles per action (batch_rl's name).
      kappa: float >= 0, Huber threshold of the quantile loss.
      network: Keras model class called as network(num_actions, num_atoms,
        name=...) and returning `networks.QuantileNetworkType`.
      replay_scheme: str, must be 'uniform' (batch_rl's argument).
      **kwargs: Dopamine DQNAgent arguments; `optimizer` None or absent
        gives Adam with the published learning rate 5e-5 and epsilon
        3.125e-4.

    Raises:
      ValueError: if num_atoms < 1, kappa < 0 or replay_scheme is not
        'uniform'.
    """
    check_uniform(replay_scheme, 'QR-DQN')
    if num_atoms < 1:
      raise ValueError(f'num_atoms must be positive, got {num_atoms}')
    if kappa < 0:
      raise ValueError(f'kappa must be >= 0, got {kappa}')
    self.num_atoms = num_atoms
    self.kappa = float(kappa)
    self.loss = None  # Scalar minibatch loss, set by _build_train_op.
    super().__init__(*args, network=network, **kwargs)

  def _default_optimizer(self):
    return multi_head_dqn_agent.default_adam()

  def _create_network(self, name):
    return self.network(self.num_actions, self.num_atoms, name=name)

  def _build_target_quantiles(self):
    """Returns the [batch, num_atoms] target quantiles."""
    next_outputs = self._replay_next_target_net_outputs
    next_actions = tf.argmax(next_outputs.q_values, axis=1)
    next_quantiles = tf.gather(
      next_outputs.quantile_values, next_actions, axis=1, batch_dims=1
    )
    not_terminal = 1.0 - tf.cast(self._replay.terminals, tf.float32)
    discount = self.cumulative_gamma * not_terminal
    return self._replay.rewards[:, None] + discount[:, None] * next_quantiles

  def _build_train_op(self):
    chosen_quantiles = multi_head_dqn_agent.chosen_action_values(
      self._replay_net_outputs.quantile_values,
      self._replay.actions,
      self.num_actions,
    )
    target = tf.stop_gradient(self._build_target_quantiles())
    loss = quantile_huber_loss(target, chosen_quantiles, self.kappa)
    return multi_head_dqn_agent.minimize_mean(self, loss, 'QuantileLoss')
