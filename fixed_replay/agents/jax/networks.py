"""Flax networks of the offline JAX agents that Dopamine does not ship.

Like Dopamine's JAX networks, each module maps ONE state (no batch axis) to
its outputs; the agents `jax.vmap` them over a minibatch.

One class, `HeadedNetwork`: a torso, then one dense layer of
num_actions x num_outputs values read in one of two ways:

* 'q_heads' (REM): `q_heads` is [num_actions, num_heads]; `q_values`, the
  mean over heads, is what the agent acts on;
* 'quantiles' (QR-DQN on CartPole): the outputs of Dopamine's
  `networks.QuantileNetwork`: q_values [num_actions], logits
  [num_actions, num_atoms] (the quantiles) and probabilities.

The gin names that configs use (`JaxMultiHeadQNetwork`,
`JaxClassicControlMultiHeadQNetwork`, `JaxClassicControlQuantileNetwork`)
build it with their torso and arguments, called as the agents call a network
class: network(num_actions=..., num_heads=...) for REM,
network(num_actions=..., num_atoms=...) for Dopamine's quantile agent.

The Atari torso is Dopamine's JAX Nature DQN torso (uint8 frames scaled to
[0, 1], Xavier-uniform initialisation); the vector torso is that of
Dopamine's `ClassicControlDQNNetwork` (optional rescaling to [-1, 1] from
known bounds, `num_layers` ReLU layers of `hidden_units`).
"""

import collections
from typing import Any

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


class HeadedNetwork(nn.Module):
  """A torso and a dense layer of num_outputs values per action.

  Attributes:
    num_actions: int.
    num_outputs: int, heads ('q_heads') or quantiles ('quantiles') per
      action.
    outputs: str, 'q_heads' (MultiHeadNetworkType) or 'quantiles'
      (Dopamine's RainbowNetworkType, as its QuantileNetwork).
    torso: str, 'nature' (Atari frames) or 'classic_control' (vectors).
    num_layers, hidden_units, min_vals, max_vals: the classic-control
      torso's (unused by the Nature torso).
    inputs_preprocessed: bool, the Nature torso's (Dopamine's signature).
  """

  num_actions: int
  num_outputs: int
  outputs: str = 'q_heads'
  torso: str = 'nature'
  num_layers: int = 2
  hidden_units: int = 512
  min_vals: tuple | None = None
  max_vals: tuple | None = None
  inputs_preprocessed: bool = False

  @property
  def num_heads(self) -> int:
    """The number of Q-heads (REM's update reads it)."""
    return self.num_outputs

  @nn.compact
  def __call__(self, x):
    if self.torso == 'nature':
      x = NatureTorso(self.inputs_preprocessed)(x)
    elif self.torso == 'classic_control':
      x = ClassicControlTorso(
        self.num_layers, self.hidden_units, self.min_vals, self.max_vals
      )(x)
    else:
      raise ValueError(
        f"torso={self.torso!r}: choose 'nature' or 'classic_control'"
      )
    x = nn.Dense(
      features=self.num_actions * self.num_outputs,
      kernel_init=nn.initializers.xavier_uniform(),
    )(x)
    values = x.reshape((self.num_actions, self.num_outputs))
    if self.outputs == 'q_heads':
      return MultiHeadNetworkType(values, jnp.mean(values, axis=-1))
    if self.outputs == 'quantiles':
      return atari_lib.RainbowNetworkType(
        jnp.mean(values, axis=1), values, nn.softmax(values)
      )
    raise ValueError(
      f"outputs={self.outputs!r}: choose 'q_heads' or 'quantiles'"
    )


# The gin names below are functions, not classes, on purpose: each only
# chooses HeadedNetwork's torso and outputs and keeps its own argument names
# (num_heads or num_atoms), which the agents and gin bindings use.


@gin.configurable
def JaxMultiHeadQNetwork(
  num_actions: int, num_heads: int, inputs_preprocessed: bool = False
) -> nn.Module:
  """Nature DQN torso with num_heads Q-value heads (REM on Atari)."""
  return HeadedNetwork(
    num_actions, num_heads, inputs_preprocessed=inputs_preprocessed
  )


@gin.configurable
def JaxClassicControlMultiHeadQNetwork(
  num_actions: int,
  num_heads: int,
  inputs_preprocessed: bool = False,
  **torso: Any,
) -> nn.Module:
  """An MLP with num_heads Q-value heads, for vector observations.

  Args:
    num_actions: int.
    num_heads: int.
    inputs_preprocessed: bool, Dopamine's signature; unused.
    **torso: num_layers (2), hidden_units (512), min_vals and max_vals (None:
      no rescaling), as HeadedNetwork takes them.
  """
  del inputs_preprocessed
  return HeadedNetwork(num_actions, num_heads, torso='classic_control', **torso)


@gin.configurable
def JaxClassicControlQuantileNetwork(
  num_actions: int,
  num_atoms: int,
  inputs_preprocessed: bool = False,
  **torso: Any,
) -> nn.Module:
  """An MLP with num_atoms quantiles per action, for vector observations.

  Arguments are JaxClassicControlMultiHeadQNetwork's, num_atoms (quantiles
  per action) in place of num_heads.
  """
  del inputs_preprocessed
  return HeadedNetwork(
    num_actions,
    num_atoms,
    outputs='quantiles',
    torso='classic_control',
    **torso,
  )
