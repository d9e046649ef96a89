"""Offline Ensemble-DQN and REM over K separate networks.

batch_rl's multi_network_dqn: the K Q-functions are K Nature networks with
nothing shared, instead of K heads on one torso; `transform_strategy`
chooses Ensemble-DQN ('IDENTITY') or REM ('STOCHASTIC') exactly as for the
multi-head agent, whose losses this agent reuses. Acting uses the mean of
the K networks.

Differences from batch_rl, by design: the networks are built on the agent's
`tf_device` (batch_rl spread them over '/gpu:{i // 4}'), and one optimizer
updates them all (batch_rl deep-copied one per network; for Adam and
RMSProp, whose state is per variable, the updates are the same).
`use_deep_exploration` only changes how batch_rl's agent acts while
collecting data online, so an offline agent accepts it and ignores it.
"""

from typing import Any

from absl import logging
import gin

from fixed_replay.agents.tf import multi_head_dqn_agent
from fixed_replay.agents.tf import networks


@gin.configurable
class FixedReplayMultiNetworkDQNAgent(
  multi_head_dqn_agent.FixedReplayMultiHeadDQNAgent
):
  """Ensemble-DQN or REM over separate networks, from logged checkpoints."""

  def __init__(
    self,
    *args: Any,
    num_networks: int = 4,
    transform_strategy: str = 'IDENTITY',
    network: type = networks.AtariMultiNetworkQNetwork,
    use_deep_exploration: bool = False,
    **kwargs: Any,
  ) -> None:
    """Creates the agent.

    Args:
      *args: `OfflineAgent`'s (sess, num_actions, replay_data_dir,
        replay_suffix, init_checkpoint_dir), also taken by name.
      num_networks: int, K, the number of separate Q-networks.
      transform_strategy: str, 'IDENTITY' (Ensemble-DQN) or 'STOCHASTIC'
        (REM).
      network: Keras model class called as network(num_actions,
        num_networks, name=...) and returning `networks.MultiHeadNetworkType`
        (one "head" per network).
      use_deep_exploration: bool, batch_rl's online-acting option; ignored
        offline.
      **kwargs: FixedReplayMultiHeadDQNAgent arguments
        (num_convex_combinations, optimizer, ...) and Dopamine DQNAgent ones.
    """
    if use_deep_exploration:
      logging.info(
        'use_deep_exploration only affects acting while collecting data '
        'online; the offline agent ignores it.'
      )
    self.num_networks = num_networks
    super().__init__(
      *args,
      num_heads=num_networks,
      transform_strategy=transform_strategy,
      network=network,
      **kwargs,
    )

  @property
  def method(self) -> str:
    return f'{super().method} over {self.num_networks} separate networks'
