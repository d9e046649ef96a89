"""Offline C51 (Bellemare et al., 2017): Dopamine's RainbowAgent, uniform.

As published for the DQN Replay Dataset: 51 atoms on [-10, 10], 1-step
targets, the categorical projection and cross-entropy loss of Dopamine's
RainbowAgent, sampled uniformly from the fixed data (the dataset has no
priorities, so prioritized replay is refused), Adam lr 2.5e-4, eps 3.125e-4.

`FixedReplayRainbowAgent` is the same agent under batch_rl's name: `--agent_name
c51` builds it, so bindings of either name apply (batch_rl's c51.gin binds
`FixedReplayRainbowAgent.*`, ours `FixedReplayC51Agent.*`).
"""

from dopamine.tf.agents.rainbow import rainbow_agent
import gin
import tensorflow as tf

from fixed_replay.agents.tf import offline
from fixed_replay.agents.tf import quantile_agent

ADAM_LEARNING_RATE = 0.00025
ADAM_EPSILON = 0.0003125


@gin.configurable
class FixedReplayC51Agent(offline.OfflineAgent, rainbow_agent.RainbowAgent):
  """C51 trained only from logged replay checkpoints."""

  method = 'C51'

  def __init__(self, *args, replay_scheme: str = 'uniform', **kwargs) -> None:
    """Creates the agent.

    Args:
      *args: `OfflineAgent`'s (sess, num_actions, replay_data_dir,
        replay_suffix, init_checkpoint_dir), also taken by name.
      replay_scheme: str, must be 'uniform'.
      **kwargs: Dopamine RainbowAgent arguments (num_atoms, vmax, ...);
        `optimizer` None or absent gives Adam with the published learning
        rate 2.5e-4 and epsilon 3.125e-4.

    Raises:
      ValueError: if replay_scheme is not 'uniform'.
    """
    quantile_agent.check_uniform(replay_scheme, 'C51')
    self.loss = None  # Scalar minibatch loss, set by _build_train_op.
    super().__init__(*args, replay_scheme=replay_scheme, **kwargs)

  def _default_optimizer(self):
    return tf.compat.v1.train.AdamOptimizer(
      learning_rate=ADAM_LEARNING_RATE, epsilon=ADAM_EPSILON
    )

  def _build_train_op(self):
    # Dopamine returns (update op, per-transition cross-entropy).
    train_op, loss = super()._build_train_op()
    self.loss = tf.reduce_mean(loss)
    return train_op, loss


@gin.configurable
class FixedReplayRainbowAgent(FixedReplayC51Agent):
  """batch_rl's name for FixedReplayC51Agent (what `--agent_name c51` builds).

  Arguments and behaviour are FixedReplayC51Agent's; gin bindings of
  `FixedReplayRainbowAgent.*` and of `FixedReplayC51Agent.*` both apply (the
  former win where both are set).
  """

  def __init__(self, *args, **kwargs) -> None:
    super().__init__(*args, **kwargs)
