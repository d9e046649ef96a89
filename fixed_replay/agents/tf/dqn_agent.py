"""Offline DQN (Nature network, Huber loss, RMSProp) on a fixed dataset."""

from dopamine.tf.agents.dqn import dqn_agent
import gin

from fixed_replay.agents.tf import offline


@gin.configurable
class FixedReplayDQNAgent(offline.OfflineAgent, dqn_agent.DQNAgent):
  """Dopamine's DQN trained only from logged replay checkpoints.

  Arguments are `OfflineAgent`'s (sess, num_actions, replay_data_dir,
  replay_suffix, init_checkpoint_dir) and Dopamine DQNAgent's.
  """

  method = 'DQN'
