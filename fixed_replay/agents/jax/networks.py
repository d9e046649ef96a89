"""Flax networks of the offline JAX agents that Dopamine does not ship.

Like Dopamine's JAX networks, each module maps ONE state (no batch axis) to
its outputs; the agents `jax.vmap` them over a minibatch.

* Multi-head Q-networks (REM): a torso and one dense layer of
  num_actions x num_heads outputs. `q_heads` is [num_actions, num_heads];
  `q_values`, the mean over heads, is what the agent acts on.
* A quantile network for vector observations (QR-DQN on CartPole), with the
  outputs of Dopamine's `networks.QuantileNetwork`: q_values [num_actions],
  logits [num_actions, num_atoms] (the quantiles) and probabilities.

The Atari torso is Dopamine's JAX Nature DQN torso (uint8 frames scaled to
[0, 1], Xavier-uniform initialisation); the vector torso is that of
Dopamine's `ClassicControlDQNNetwork` (optional rescaling to [-1, 1] from
known bounds, `num_layers` ReLU layers of `hidden_units`).
"""

import collections

from dopamine.discrete_domains import atari_lib
from dopamine.jax import networks
from flax import linen as nn
import gin
import jax.numpy as jnp

MultiHeadNetworkType = collections.namedtuple(
  'multi_head_dqn_network', ['q_heads', 'q_values']
)


class NatureTorso(nn.Module):
  """Nature DQN convolutions and 512-unit layer of one stacked state."""

  inputs_preprocessed: bool = False

  @nn.compact
  def __call__(self, x):
    initializer = nn.initializers.xavier_uniform()
    if not self.inputs_preprocessed:
      x = networks.preprocess_atari_inputs(x)
    for features, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
      x = nn.Conv(
        features=features,
        kernel_size=(kernel, kernel),
        strides=(stride, stride),
        kernel_init=initializer,
      )(x)
      x = nn.relu(x)
    x = x.reshape(-1)
    return nn.relu(nn.Dense(features=512, kernel_init=initializer)(x))


class ClassicControlTorso(nn.Module):
  """ReLU layers over one flattened vector observation."""

  num_layers: int = 2
  hidden_units: int = 512
  min_vals: tuple | None = None
  max_vals: tuple | None = None

  @nn.compact
  def __call__(self, x):
    if (self.min_vals is None) != (self.max_vals is None):
      raise ValueError('Give both min_vals and max_vals, or neither')
    initializer = nn.initializers.xavier_uniform()
    x = x.astype(jnp.float32).reshape(-1)
    if self.min_vals is not None:
      low = jnp.array(self.min_vals, jnp.float32)
      high = jnp.array(self.max_vals, jnp.float32)
      x = 2.0 * (x - low) / (high - low) - 1.0
    for _ in range(self.num_layers):
      x = nn.relu(nn.Dense(self.hidden_units, kernel_init=initializer)(x))
    return x


def _multi_head_outputs(x, num_actions, num_heads):
  x = nn.Dense(
    features=num_actions * num_heads,
    kernel_init=nn.initializers.xavier_uniform(),
  )(x)
  q_heads = x.reshape((num_actions, num_heads))
  return MultiHeadNetworkType(q_heads, jnp.mean(q_heads, axis=-1))


@gin.configurable
class JaxMultiHeadQNetwork(nn.Module):
  """Nature DQN torso with num_heads Q-value heads (REM on Atari)."""

  num_actions: int
  num_heads: int
  inputs_preprocessed: bool = False

  @nn.compact
  def __call__(self, x):
    x = NatureTorso(self.inputs_preprocessed)(x)
    return _multi_head_outputs(x, self.num_actions, self.num_heads)


@gin.configurable
class JaxClassicControlMultiHeadQNetwork(nn.Module):
  """An MLP with num_heads Q-value heads, for vector observations."""

  num_actions: int
  num_heads: int
  num_layers: int = 2
  hidden_units: int = 512
  min_vals: tuple | None = None
  max_vals: tuple | None = None
  inputs_preprocessed: bool = False  # Dopamine's signature; unused.

  @nn.compact
  def __call__(self, x):
    x = ClassicControlTorso(
      self.num_layers, self.hidden_units, self.min_vals, self.max_vals
    )(x)
    return _multi_head_outputs(x, self.num_actions, self.num_heads)


@gin.configurable
class JaxClassicControlQuantileNetwork(nn.Module):
  """An MLP with num_atoms quantiles per action, for vector observations."""

  num_actions: int
  num_atoms: int
  num_layers: int = 2
  hidden_units: int = 512
  min_vals: tuple | None = None
  max_vals: tuple | None = None
  inputs_preprocessed: bool = False  # Dopamine's signature; unused.

  @nn.compact
  def __call__(self, x):
    x = ClassicControlTorso(
      self.num_layers, self.hidden_units, self.min_vals, self.max_vals
    )(x)
    x = nn.Dense(
      features=self.num_actions * self.num_atoms,
      kernel_init=nn.initializers.xavier_uniform(),
    )(x)
    logits = x.reshape((self.num_actions, self.num_atoms))
    return atari_lib.RainbowNetworkType(
      jnp.mean(logits, axis=1), logits, nn.softmax(logits)
    )
