"""Conservative Q-learning (CQL(H), Kumar et al. 2020) on DQN and QR-DQN.

Each update minimises the base agent's loss plus

  alpha * mean_batch(logsumexp_a Q(s, a) - Q(s, a_data)),

which pushes down the Q-values of actions the data does not take and pushes
up those it does. For QR-DQN, Q(s, a) is the mean of the action's quantiles
(as in the CQL authors' Atari code). The CQL authors' Atari settings use
alpha 4.0 on 1% of the data and 1.0 on 10% (and on the full data).

One update (`train`) serves both agents: it adds the penalty to a base loss,
`TDLoss` (DQN's, from Dopamine's `target_q`) or `QuantileLoss` (QR-DQN's,
from Dopamine's `target_distribution`), and `ConservativeAgent` turns either
offline agent into its CQL version.
"""

import dataclasses
import functools

from dopamine.jax import losses
from dopamine.jax.agents.dqn import dqn_agent
from dopamine.jax.agents.quantile import quantile_agent
import gin
import jax
import jax.numpy as jnp

from fixed_replay.agents.jax import dqn_agent as jax_dqn_agent
from fixed_replay.agents.jax import offline as jax_offline
from fixed_replay.agents.jax import quantile_agent as jax_quantile_agent


def cql_penalty(q_values: jax.Array, actions: jax.Array) -> jax.Array:
  """Returns logsumexp_a Q(s, a) - Q(s, a_data) per transition.

  Args:
    q_values: [batch, num_actions] array.
    actions: [batch] int array, the data's actions.

  Returns:
    [batch] array.
  """
  chosen = jnp.take_along_axis(q_values, actions[:, None], axis=1)[:, 0]
  return jax.nn.logsumexp(q_values, axis=1) - chosen


def quantile_huber_loss(
  target: jax.Array, online: jax.Array, kappa: float
) -> jax.Array:
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


@dataclasses.dataclass(frozen=True)
class TDLoss:
  """DQN's TD loss, as Dopamine's `dqn_agent.train` computes it.

  Attributes:
    loss_type: str, 'huber' or 'mse'.
  """

  loss_type: str = 'huber'

  def target(self, target_network, next_states, rewards, terminals, gamma):
    """[batch] TD targets (Dopamine's `dqn_agent.target_q`)."""
    return dqn_agent.target_q(
      target_network, next_states, rewards, terminals, gamma
    )

  def __call__(self, outputs, actions, target):
    """The mean TD loss of the data's actions' Q-values."""
    q_values = outputs.q_values
    chosen = jnp.take_along_axis(q_values, actions[:, None], axis=1)[:, 0]
    loss = losses.huber_loss if self.loss_type == 'huber' else losses.mse_loss
    return jnp.mean(loss(target, chosen))


@dataclasses.dataclass(frozen=True)
class QuantileLoss:
  """QR-DQN's quantile Huber loss, as Dopamine's `quantile_agent.train`.

  Attributes:
    kappa: float, the Huber threshold.
  """

  kappa: float = 1.0

  def target(self, target_network, next_states, rewards, terminals, gamma):
    """[batch, num_atoms] target quantiles (Dopamine's target_distribution)."""
    return quantile_agent.target_distribution(
      target_network, next_states, rewards, terminals, gamma
    )

  def __call__(self, outputs, actions, target):
    """The mean quantile Huber loss of the data's actions' quantiles."""
    chosen = jnp.take_along_axis(
      outputs.logits, actions[:, None, None], axis=1
    )[:, 0]
    return jnp.mean(quantile_huber_loss(target, chosen, self.kappa))


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def train(
  base_loss,
  network_def,
  optimizer,
  params,
  optimizer_state,
  batch,
  gamma,
  alpha,
):
  """One CQL update: base_loss + alpha * the mean CQL penalty.

  Args:
    base_loss: `TDLoss` or `QuantileLoss` (static: hashable and frozen).
    network_def: the flax network (static).
    optimizer: the optax GradientTransformation (static).
    params: (online parameters, target parameters).
    optimizer_state: the optimizer's state.
    batch: (states, actions, next_states, rewards, terminals), see
      `JaxOfflineAgent._minibatch`.
    gamma: float, the n-step discount.
    alpha: float, the weight of the penalty.

  Returns:
    (optimizer_state, online_params, total loss, base loss, penalty).
  """
  online_params, target_params = params
  states, actions, next_states, rewards, terminals = batch
  target = base_loss.target(
    lambda s: network_def.apply(target_params, s),
    next_states,
    rewards,
    terminals,
    gamma,
  )

  def loss_fn(params):
    outputs = jax.vmap(lambda s: network_def.apply(params, s))(states)
    base = base_loss(outputs, actions, target)
    penalty = jnp.mean(cql_penalty(outputs.q_values, actions))
    return base + alpha * penalty, (base, penalty)

  optimizer_state, online_params, (loss, (base, penalty)) = (
    jax_offline.gradient_step(
      loss_fn, optimizer, optimizer_state, online_params, has_aux=True
    )
  )
  return optimizer_state, online_params, loss, base, penalty


class ConservativeAgent:
  """Mixin making an offline JAX agent's update CQL(H) over its own loss.

  List it before the offline agent; the agent gives `_base_loss()` and its
  loss's summary name `loss_name`. Updates report `Loss` (the total), the
  base loss under `loss_name` and `CQLLoss`, the penalty before weighting by
  alpha.
  """

  def __init__(self, *args, cql_alpha: float = 1.0, **kwargs) -> None:
    """Creates the agent.

    Args:
      *args: the offline agent's positional arguments.
      cql_alpha: float >= 0, weight of the CQL penalty.
      **kwargs: the offline agent's arguments.

    Raises:
      ValueError: if cql_alpha is negative.
    """
    if cql_alpha < 0:
      raise ValueError(f'cql_alpha={cql_alpha} must be >= 0')
    self.cql_alpha = float(cql_alpha)
    super().__init__(*args, **kwargs)

  def _base_loss(self):
    """The loss the penalty is added to (a `TDLoss` or `QuantileLoss`)."""
    raise NotImplementedError

  def _update(self):
    self.optimizer_state, self.online_params, loss, base, penalty = train(
      self._base_loss(),
      *self._update_arguments(),
      self.cumulative_gamma,
      self.cql_alpha,
    )
    return {'Loss': loss, self.loss_name: base, 'CQLLoss': penalty}


@gin.configurable
class FixedReplayJaxCQLAgent(
  ConservativeAgent, jax_dqn_agent.FixedReplayJaxDQNAgent
):
  """CQL(H) on offline JAX DQN: TD loss + alpha * CQL penalty.

  Arguments: `cql_alpha` and FixedReplayJaxDQNAgent's. Reports `Loss` (the
  total), the TD loss (`HuberLoss` or `MSELoss`) and `CQLLoss`.
  """

  method = 'CQL(H) on DQN'

  def _base_loss(self):
    return TDLoss(self._loss_type)


@gin.configurable
class FixedReplayJaxQuantileCQLAgent(
  ConservativeAgent, jax_quantile_agent.FixedReplayJaxQuantileAgent
):
  """CQL(H) on offline JAX QR-DQN: quantile loss + alpha * CQL penalty.

  Arguments: `cql_alpha` and FixedReplayJaxQuantileAgent's. Reports `Loss`
  (the total), `QuantileLoss` and `CQLLoss`.
  """

  method = 'CQL(H) on QR-DQN'

  def _base_loss(self):
    return QuantileLoss(self._kappa)
