"""Offline Random Ensemble Mixture (REM) agent.

Agarwal et al. (2020): the network has K Q-heads; every training step draws
alpha ~ U(0, 1)^K, normalised to sum to 1, and both the online and the
target Q-functions become the same convex combination sum_k alpha_k Q_k. The
Huber TD loss is taken on that mixture. The agent acts greedily on the mean
of the heads.

This is batch_rl's multi-head agent with `transform_strategy='STOCHASTIC'`
(see multi_head_dqn_agent.py), under its own name.
"""

import gin

from fixed_replay.agents.tf import multi_head_dqn_agent


@gin.configurable
class FixedReplayREMAgent(multi_head_dqn_agent.FixedReplayMultiHeadDQNAgent):
  """REM trained only from logged replay checkpoints.

  Arguments are those of FixedReplayMultiHeadDQNAgent, with
  transform_strategy 'STOCHASTIC' by default. `mixing_weights` is the tensor
  of this training step's alpha: fetch it in the same `sess.run` as the
  train op to see the weights that update used.
  """

  def __init__(
    self, *args, transform_strategy: str = 'STOCHASTIC', **kwargs
  ) -> None:
    super().__init__(*args, transform_strategy=transform_strategy, **kwargs)
