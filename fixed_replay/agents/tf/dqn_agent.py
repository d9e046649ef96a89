"""Offline DQN (Nature network, Huber loss, RMSProp) on a fixed dataset."""

from dopamine.tf.agents.dqn import dqn_agent
import gin

from fixed_replay.agents.tf import offline


@gin.configurable
class FixedReplayDQNAgent(offline.OfflineAgent, dqn_agent.DQNAgent):
  """Dopamine's DQN trained only from logged replay checkpoints."""

  method = 'DQN'

  def __init__(
    self,
    sess,
    num_actions,
    replay_data_dir,
    replay_suffix=None,
    init_checkpoint_dir=None,
    **kwargs,
  ):
    """Creates the agent.

    Args:
      sess: tf.compat.v1.Session.
      num_actions: int.
      replay_data_dir: str, directory of replay checkpoints.
      replay_suffix: int or None, train on this checkpoint only.
      init_checkpoint_dir: str or None, a run to continue from (see
        FixedReplayRunner).
      **kwargs: Dopamine DQNAgent arguments.
    """
    kwargs = self._init_offline(
      replay_data_dir, replay_suffix, init_checkpoint_dir, kwargs
    )
    dqn_agent.DQNAgent.__init__(self, sess, num_actions, **kwargs)
    self._finish_offline_init()
