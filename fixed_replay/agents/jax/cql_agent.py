"""Conservative Q-learning (CQL(H), Kumar et al. 2020) on DQN and QR-DQN.

Each update minimises the base agent's loss plus

  alpha * mean_batch(logsumexp_a Q(s, a) - Q(s, a_data)),

which pushes down the Q-values of actions the data does not take and pushes
up those it does. For QR-DQN, Q(s, a) is the mean of the action's quantiles
(as in the CQL authors' Atari code). The CQL authors' Atari settings use
alpha 4.0 on 1% of the data and 1.0 on 10% (and on the full data).
"""

import functools

from dopamine.jax import losses
from dopamine.jax.agents.dqn import dqn_agent
from dopamine.jax.agents.quantile import quantile_agent
import gin
import jax
import jax.numpy as jnp
import optax

from fixed_replay.agents.jax import dqn_agent as jax_dqn_agent
from fixed_replay.agents.jax import quantile_agent as jax_quantile_agent


def cql_penalty(q_values, actions):
  """Returns logsumexp_a Q(s, a) - Q(s, a_data) per transition.

  Args:
    q_values: [batch, num_actions] array.
    actions: [batch] int array, the data's actions.

  Returns:
    [batch] array.
  """
  chosen = jnp.take_along_axis(q_values, actions[:, None], axis=1)[:, 0]
  return jax.nn.logsumexp(q_values, axis=1) - chosen


def quantile_huber_loss(target, online, kappa):
  """Dopamine JAX's quantile Huber loss of each transition.

  Args:
    target: [batch, num_target] target quantiles.
    online: [batch, num_atoms] quantiles of the data's action.
    kappa: float, the Huber threshold.

  Returns:
    [batch]: sum over online quantiles of the mean over target quantiles of
    |tau_hat_i - 1{u < 0}| * huber_kappa(u), u = target_j - online_i,
    tau_hat_i = (i + 0.5) / num_atoms (huber not divided by kappa, as in
    Dopamine's JAX agent).
  """
  errors = target[:, None, :] - online[:, :, None]
  huber = jnp.where(
    jnp.abs(errors) <= kappa,
    0.5 * errors**2,
    kappa * (jnp.abs(errors) - 0.5 * kappa),
  )
  num_atoms = online.shape[1]
  tau_hat = (jnp.arange(num_atoms, dtype=jnp.float32) + 0.5) / num_atoms
  weights = jnp.abs(tau_hat[None, :, None] - (errors < 0).astype(jnp.float32))
  return jnp.sum(jnp.mean(weights * huber, axis=2), axis=1)


def _apply_update(optimizer, optimizer_state, online_params, grad):
  updates, optimizer_state = optimizer.update(
    grad, optimizer_state, params=online_params
  )
  return optimizer_state, optax.apply_updates(online_params, updates)


@functools.partial(jax.jit, static_argnums=(0, 3, 10, 11))
def train_dqn(
  network_def,
  online_params,
  target_params,
  optimizer,
  optimizer_state,
  states,
  actions,
  next_states,
  rewards,
  terminals,
  cumulative_gamma,
  loss_type,
  alpha,
):
  """One CQL update on DQN's TD loss.

  Returns:
    (optimizer_state, online_params, total loss, TD loss, penalty).
  """
  target = dqn_agent.target_q(
    lambda s: network_def.apply(target_params, s),
    next_states,
    rewards,
    terminals,
    cumulative_gamma,
  )
  td_loss_fn = losses.huber_loss if loss_type == 'huber' else losses.mse_loss

  def loss_fn(params):
    q_values = jax.vmap(lambda s: network_def.apply(params, s))(states).q_values
    chosen = jnp.take_along_axis(q_values, actions[:, None], axis=1)[:, 0]
    td_loss = jnp.mean(td_loss_fn(target, chosen))
    penalty = jnp.mean(cql_penalty(q_values, actions))
    return td_loss + alpha * penalty, (td_loss, penalty)

  (loss, (td_loss, penalty)), grad = jax.value_and_grad(loss_fn, has_aux=True)(
    online_params
  )
  optimizer_state, online_params = _apply_update(
    optimizer, optimizer_state, online_params, grad
  )
  return optimizer_state, online_params, loss, td_loss, penalty


@functools.partial(jax.jit, static_argnums=(0, 3, 10, 11, 12))
def train_quantile(
  network_def,
  online_params,
  target_params,
  optimizer,
  optimizer_state,
  states,
  actions,
  next_states,
  rewards,
  terminals,
  kappa,
  num_atoms,
  cumulative_gamma,
  alpha,
):
  """One CQL update on QR-DQN's quantile loss.

  Returns:
    (optimizer_state, online_params, total loss, quantile loss, penalty).
  """
  del num_atoms  # Static in the signature, as in Dopamine's train.
  target = quantile_agent.target_distribution(
    lambda s: network_def.apply(target_params, s),
    next_states,
    rewards,
    terminals,
    cumulative_gamma,
  )

  def loss_fn(params):
    outputs = jax.vmap(lambda s: network_def.apply(params, s))(states)
    chosen = jnp.take_along_axis(
      outputs.logits, actions[:, None, None], axis=1
    )[:, 0]
    quantile_loss = jnp.mean(quantile_huber_loss(target, chosen, kappa))
    penalty = jnp.mean(cql_penalty(outputs.q_values, actions))
    return quantile_loss + alpha * penalty, (quantile_loss, penalty)

  (loss, (quantile_loss, penalty)), grad = jax.value_and_grad(
    loss_fn, has_aux=True
  )(online_params)
  optimizer_state, online_params = _apply_update(
    optimizer, optimizer_state, online_params, grad
  )
  return optimizer_state, online_params, loss, quantile_loss, penalty


@gin.configurable
class FixedReplayJaxCQLAgent(jax_dqn_agent.FixedReplayJaxDQNAgent):
  """CQL(H) on offline JAX DQN: TD loss + alpha * CQL penalty.

  Reports `Loss` (the total), the TD loss (`HuberLoss` or `MSELoss`) and
  `CQLLoss`, the penalty before weighting by alpha.
  """

  method = 'CQL(H) on DQN'

  def __init__(self, num_actions, replay_data_dir, cql_alpha=1.0, **kwargs):
    """Creates the agent.

    Args:
      num_actions: int.
      replay_data_dir: str, directory of replay checkpoints.
      cql_alpha: float >= 0, weight of the CQL penalty.
      **kwargs: FixedReplayJaxDQNAgent arguments.

    Raises:
      ValueError: if cql_alpha is negative.
    """
    if cql_alpha < 0:
      raise ValueError(f'cql_alpha={cql_alpha} must be >= 0')
    self.cql_alpha = float(cql_alpha)
    super().__init__(num_actions, replay_data_dir, **kwargs)

  def _update(self):
    elements = self.replay_elements
    self.optimizer_state, self.online_params, loss, td_loss, penalty = (
      train_dqn(
        self.network_def,
        self.online_params,
        self.target_network_params,
        self.optimizer,
        self.optimizer_state,
        self.preprocess_fn(elements['state']),
        elements['action'],
        self.preprocess_fn(elements['next_state']),
        elements['reward'],
        elements['terminal'],
        self.cumulative_gamma,
        self._loss_type,
        self.cql_alpha,
      )
    )
    name = 'HuberLoss' if self._loss_type == 'huber' else 'MSELoss'
    return {'Loss': loss, name: td_loss, 'CQLLoss': penalty}


@gin.configurable
class FixedReplayJaxQuantileCQLAgent(
  jax_quantile_agent.FixedReplayJaxQuantileAgent
):
  """CQL(H) on offline JAX QR-DQN: quantile loss + alpha * CQL penalty.

  Reports `Loss` (the total), `QuantileLoss` and `CQLLoss`, the penalty
  before weighting by alpha.
  """

  method = 'CQL(H) on QR-DQN'

  def __init__(self, num_actions, replay_data_dir, cql_alpha=1.0, **kwargs):
    """Creates the agent.

    Args:
      num_actions: int.
      replay_data_dir: str, directory of replay checkpoints.
      cql_alpha: float >= 0, weight of the CQL penalty.
      **kwargs: FixedReplayJaxQuantileAgent arguments.

    Raises:
      ValueError: if cql_alpha is negative.
    """
    if cql_alpha < 0:
      raise ValueError(f'cql_alpha={cql_alpha} must be >= 0')
    self.cql_alpha = float(cql_alpha)
    super().__init__(num_actions, replay_data_dir, **kwargs)

  def _update(self):
    elements = self.replay_elements
    self.optimizer_state, self.online_params, loss, quantile_loss, penalty = (
      train_quantile(
        self.network_def,
        self.online_params,
        self.target_network_params,
        self.optimizer,
        self.optimizer_state,
        self.preprocess_fn(elements['state']),
        elements['action'],
        self.preprocess_fn(elements['next_state']),
        elements['reward'],
        elements['terminal'],
        self._kappa,
        self._num_atoms,
        self.cumulative_gamma,
        self.cql_alpha,
      )
    )
    return {'Loss': loss, 'QuantileLoss': quantile_loss, 'CQLLoss': penalty}
