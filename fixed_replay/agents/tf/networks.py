"""Keras networks of the offline TF agents (graph mode, as Dopamine's).

Two families of outputs, each for Atari frames and for vector observations:

* multi-head Q-networks (Ensemble-DQN and REM): one shared torso and a last
  dense layer with num_actions x num_heads outputs. `q_heads` is
  [batch, num_actions, num_heads]; `q_values`, the mean over heads, is what
  the agents act on.
* quantile networks (QR-DQN): num_actions x num_quantiles outputs.
  `quantile_values` is [batch, num_actions, num_quantiles]; `q_values` is
  their mean.

The Atari torso is the Nature DQN one, with the layer names of Dopamine's
`atari_lib.NatureDQNNetwork`. The vector torso is a small MLP that, like
Dopamine's `gym_lib` networks, can rescale inputs to [-1, 1] from known
bounds; the `Cartpole*` networks are the MLP ones with Dopamine's CartPole
bounds.

A third family, multi-network Q-functions (batch_rl's multi_network_dqn),
gives the same [batch, num_actions, num_networks] `q_heads` from
num_networks separate networks instead of heads on one torso.

Importing this module also imports `runtime`, which registers the gin names
the configs use beside the networks (`preferred_tf_device`, TF1's
`tf.train.*` optimizers).
"""

import collections
from collections.abc import Sequence
import functools
from typing import Any

from dopamine.discrete_domains import atari_lib
from dopamine.discrete_domains import gym_lib
import gin
import tensorflow as tf

from fixed_replay.agents.tf import runtime  # noqa: F401  (gin names)

MultiHeadNetworkType = collections.namedtuple(
  'multi_head_dqn_network', ['q_heads', 'q_values']
)
QuantileNetworkType = collections.namedtuple(
  'qr_dqn_network', ['quantile_values', 'q_values']
)


class NatureTorso(tf.keras.layers.Layer):
  """Nature DQN convolutions and 512-unit layer; uint8 frames in [0, 255]."""

  def __init__(self, name: str | None = None) -> None:
    super().__init__(name=name)
    relu = tf.keras.activations.relu
    self.conv1 = tf.keras.layers.Conv2D(
      32, [8, 8], strides=4, padding='same', activation=relu, name='Conv'
    )
    self.conv2 = tf.keras.layers.Conv2D(
      64, [4, 4], strides=2, padding='same', activation=relu, name='Conv'
    )
    self.conv3 = tf.keras.layers.Conv2D(
      64, [3, 3], strides=1, padding='same', activation=relu, name='Conv'
    )
    self.flatten = tf.keras.layers.Flatten()
    self.dense = tf.keras.layers.Dense(
      512, activation=relu, name='fully_connected'
    )

  def call(self, state: tf.Tensor) -> tf.Tensor:
    x = tf.cast(state, tf.float32) / 255.0
    x = self.conv3(self.conv2(self.conv1(x)))
    return self.dense(self.flatten(x))


class MLPTorso(tf.keras.layers.Layer):
  """Fully connected ReLU layers over flattened vector observations."""

  def __init__(
    self,
    hidden_units: Sequence[int],
    min_vals: Any = None,
    max_vals: Any = None,
    name: str | None = None,
  ) -> None:
    """Creates the layers.

    Args:
      hidden_units: sequence of ints, width of each hidden layer.
      min_vals: array or None, lower bounds of the flattened observation;
        with max_vals, inputs are rescaled to [-1, 1].
      max_vals: array or None, upper bounds.
      name: str.

    Raises:
      ValueError: if only one of min_vals and max_vals is given.
    """
    super().__init__(name=name)
    if (min_vals is None) != (max_vals is None):
      raise ValueError('Give both min_vals and max_vals, or neither')
    self.min_vals = min_vals
    self.max_vals = max_vals
    self.flatten = tf.keras.layers.Flatten()
    self.hidden = [
      tf.keras.layers.Dense(
        units, activation=tf.keras.activations.relu, name='fully_connected'
      )
      for units in hidden_units
    ]

  def call(self, state: tf.Tensor) -> tf.Tensor:
    x = self.flatten(tf.cast(state, tf.float32))
    if self.min_vals is not None:
      low = tf.constant(self.min_vals, tf.float32)
      high = tf.constant(self.max_vals, tf.float32)
      x = 2.0 * (x - low) / (high - low) - 1.0
    for layer in self.hidden:
      x = layer(x)
    return x


class HeadedNetwork(tf.keras.Model):
  """A torso and one dense layer of num_outputs values per action.

  The values, [batch, num_actions, num_outputs], are read as Q-heads
  (`MultiHeadNetworkType`) or as quantiles (`QuantileNetworkType`); either
  way `q_values` is their mean over the last axis.
  """

  def __init__(
    self,
    torso: Any,
    num_actions: int,
    num_outputs: int,
    output_type: type,
    name: str | None = None,
  ) -> None:
    """Creates the network.

    Args:
      torso: Keras layer mapping a batch of states to features.
      num_actions: int.
      num_outputs: int, heads or quantiles per action.
      output_type: MultiHeadNetworkType or QuantileNetworkType.
      name: str, the variable scope ('Online' or 'Target' in the agents).
    """
    super().__init__(name=name)
    self.num_actions = num_actions
    self.num_outputs = num_outputs
    self.output_type = output_type
    self.torso = torso
    self.last_layer = tf.keras.layers.Dense(
      num_actions * num_outputs, name='fully_connected'
    )

  def call(self, state: tf.Tensor) -> Any:
    x = self.last_layer(self.torso(state))
    values = tf.reshape(x, [-1, self.num_actions, self.num_outputs])
    return self.output_type(values, tf.reduce_mean(values, axis=-1))


class _MultiNetworkQNetwork(tf.keras.Model):
  """num_networks separate networks, each giving one Q-value per action."""

  def __init__(
    self, make_torso, num_actions: int, num_networks: int, name=None
  ) -> None:
    super().__init__(name=name)
    self.num_actions = num_actions
    self.num_heads = num_networks
    self.subnets = []
    for i in range(num_networks):
      subnet = tf.keras.Sequential(
        [
          make_torso(),
          tf.keras.layers.Dense(num_actions, name='fully_connected'),
        ],
        name=f'subnet_{i}',
      )
      self.subnets.append(subnet)

  def call(self, state):
    q_heads = tf.stack([subnet(state) for subnet in self.subnets], axis=-1)
    return MultiHeadNetworkType(q_heads, tf.reduce_mean(q_heads, axis=-1))


@gin.configurable
class AtariMultiHeadQNetwork(HeadedNetwork):
  """Nature DQN torso with num_heads Q-value heads (batch_rl's network)."""

  def __init__(
    self, num_actions: int, num_heads: int, name: str | None = None
  ) -> None:
    super().__init__(
      NatureTorso(), num_actions, num_heads, MultiHeadNetworkType, name=name
    )


@gin.configurable
class AtariQuantileNetwork(HeadedNetwork):
  """Nature DQN torso with num_quantiles outputs per action (QR-DQN)."""

  def __init__(
    self, num_actions: int, num_quantiles: int, name: str | None = None
  ) -> None:
    super().__init__(
      NatureTorso(), num_actions, num_quantiles, QuantileNetworkType, name=name
    )


@gin.configurable
class AtariMultiNetworkQNetwork(_MultiNetworkQNetwork):
  """num_networks Nature DQN networks (batch_rl's MulitNetworkQNetwork)."""

  def __init__(
    self, num_actions: int, num_networks: int, name: str | None = None
  ) -> None:
    super().__init__(NatureTorso, num_actions, num_networks, name=name)


@gin.configurable
class MLPQNetwork(tf.keras.Model):
  """A small MLP Q-network for vector observations (Dopamine's DQN API)."""

  def __init__(
    self,
    num_actions: int,
    name: str | None = None,
    hidden_units: Sequence[int] = (64, 64),
    min_vals: Any = None,
    max_vals: Any = None,
  ) -> None:
    super().__init__(name=name)
    self.num_actions = num_actions
    self.torso = MLPTorso(hidden_units, min_vals, max_vals)
    self.last_layer = tf.keras.layers.Dense(num_actions, name='fully_connected')

  def call(self, state: tf.Tensor) -> Any:
    return atari_lib.DQNNetworkType(self.last_layer(self.torso(state)))


class _MLPHeadedNetwork(HeadedNetwork):
  """An MLP torso and num_outputs values per action (see subclasses)."""

  output_type = None  # Set by the subclasses.

  def __init__(
    self,
    num_actions: int,
    num_outputs,
    name=None,
    hidden_units=(64, 64),
    min_vals=None,
    max_vals=None,
  ) -> None:
    torso = MLPTorso(hidden_units, min_vals, max_vals)
    super().__init__(
      torso, num_actions, num_outputs, type(self).output_type, name=name
    )


@gin.configurable
class MLPMultiHeadQNetwork(_MLPHeadedNetwork):
  """A small MLP with num_heads Q-value heads, for vector observations.

  Called as MLPMultiHeadQNetwork(num_actions, num_heads, name=None,
  hidden_units=(64, 64), min_vals=None, max_vals=None).
  """

  output_type = MultiHeadNetworkType


@gin.configurable
class MLPQuantileNetwork(_MLPHeadedNetwork):
  """A small MLP with num_quantiles outputs per action.

  Called as MLPQuantileNetwork(num_actions, num_quantiles, name=None,
  hidden_units=(64, 64), min_vals=None, max_vals=None).
  """

  output_type = QuantileNetworkType


@gin.configurable
class MLPMultiNetworkQNetwork(_MultiNetworkQNetwork):
  """num_networks small MLPs, each giving one Q-value per action."""

  def __init__(
    self,
    num_actions: int,
    num_networks: int,
    name: str | None = None,
    hidden_units: Sequence[int] = (64, 64),
    min_vals: Any = None,
    max_vals: Any = None,
  ) -> None:
    def make_torso():
      return MLPTorso(hidden_units, min_vals, max_vals)

    super().__init__(make_torso, num_actions, num_networks, name=name)


def _with_cartpole_bounds(network: type, name: str) -> Any:
  """`network` with its inputs rescaled by Dopamine's CartPole bounds.

  Gin-configurable as `name` (`CartpoleQNetwork.hidden_units = ...`), and
  called as the network is, less `min_vals` and `max_vals`.
  """
  bounded = functools.partial(
    network,
    min_vals=gym_lib.CARTPOLE_MIN_VALS,
    max_vals=gym_lib.CARTPOLE_MAX_VALS,
  )
  return gin.external_configurable(bounded, name=name, module=__name__)


CartpoleQNetwork = _with_cartpole_bounds(MLPQNetwork, 'CartpoleQNetwork')
CartpoleMultiHeadQNetwork = _with_cartpole_bounds(
  MLPMultiHeadQNetwork, 'CartpoleMultiHeadQNetwork'
)
CartpoleQuantileNetwork = _with_cartpole_bounds(
  MLPQuantileNetwork, 'CartpoleQuantileNetwork'
)
CartpoleMultiNetworkQNetwork = _with_cartpole_bounds(
  MLPMultiNetworkQNetwork, 'CartpoleMultiNetworkQNetwork'
)
