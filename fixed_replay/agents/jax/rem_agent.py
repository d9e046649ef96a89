"""Offline Random Ensemble Mixture (REM) in JAX.

Agarwal et al. (2020): the network has K Q-heads; every gradient step draws
alpha ~ U(0, 1)^K, normalised to sum to 1, and both the online and the
target Q-functions become the same convex combination sum_k alpha_k Q_k. The
Huber TD loss is taken on that mixture. The agent acts greedily on the mean
of the heads (the network's `q_values`).
"""

import functools
from typing import Any

from dopamine.jax import losses
from dopamine.jax.agents.dqn import dqn_agent
import gin
import jax
import jax.numpy as jnp

from fixed_replay.agents.jax import networks as jax_networks
from fixed_replay.agents.jax import offline as jax_offline


def random_convex_weights(key: jax.Array, num_heads: int) -> jax.Array:
  """Returns [num_heads] draws of U(0, 1), normalised to sum to 1."""
  weights = jax.random.uniform(key, (num_heads,), minval=0.0, maxval=1.0)
  return weights / jnp.sum(weights)


def mix_heads(q_heads: jax.Array, weights: jax.Array) -> jax.Array:
  """[..., num_actions, num_heads] x [num_heads] -> [..., num_actions]."""
  return jnp.tensordot(q_heads, weights, axes=([-1], [0]))


@functools.partial(jax.jit, static_argnums=(0, 1))
def train(network_def, optimizer, params, optimizer_state, batch, rng, gamma):
  """One REM update with a freshly drawn mixture.

  Args: as cql_agent.train's, and `rng`, the JAX key to draw the mixture
  from.

  Returns:
    (rng, optimizer_state, online_params, loss, weights): the advanced RNG
    key, the new optimizer state and parameters, the mean Huber loss and the
    mixture this step used.
  """
  online_params, target_params = params
  states, actions, next_states, rewards, terminals = batch
  rng, key = jax.random.split(rng)
  weights = random_convex_weights(key, network_def.num_heads)
  next_heads = jax.vmap(lambda s: network_def.apply(target_params, s))(
    next_states
  ).q_heads
  next_q = jnp.max(mix_heads(next_heads, weights), axis=1)
  target = jax.lax.stop_gradient(rewards + gamma * next_q * (1.0 - terminals))

  def loss_fn(params):
    heads = jax.vmap(lambda s: network_def.apply(params, s))(states).q_heads
    q_values = mix_heads(heads, weights)
    chosen = jnp.take_along_axis(q_values, actions[:, None], axis=1)[:, 0]
    return jnp.mean(losses.huber_loss(target, chosen))

  optimizer_state, online_params, loss = jax_offline.gradient_step(
    loss_fn, optimizer, optimizer_state, online_params
  )
  return rng, optimizer_state, online_params, loss, weights


@gin.configurable
class FixedReplayJaxREMAgent(
  jax_offline.JaxOfflineAgent, dqn_agent.JaxDQNAgent
):
  """REM trained only from logged replay checkpoints.

  `mixing_weights` holds the convex combination of the last update.
  """

  method = 'REM'

  def __init__(
    self,
    *args: Any,
    num_heads: int = 200,
    network: Any = jax_networks.JaxMultiHeadQNetwork,
    **kwargs: Any,
  ) -> None:
    """Creates the agent.

    Args:
      *args: `JaxOfflineAgent`'s (num_actions, replay_data_dir,
        replay_suffix, init_checkpoint_dir, prefetch_batches), also taken by
        name.
      num_heads: int, K, the number of Q-heads.
      network: a flax module (or a factory of one) taking num_actions and
        num_heads whose outputs have q_heads [num_actions, num_heads] and
        q_values.
      **kwargs: Dopamine JaxDQNAgent arguments.
    """
    self.num_heads = num_heads
    self.mixing_weights = None
    super().__init__(
      *args,
      network=functools.partial(network, num_heads=num_heads),
      loss_type='huber',
      **kwargs,
    )

  def _update(self):
    (
      self._rng,
      self.optimizer_state,
      self.online_params,
      loss,
      self.mixing_weights,
    ) = train(*self._update_arguments(), self._rng, self.cumulative_gamma)
    return {'HuberLoss': loss}
