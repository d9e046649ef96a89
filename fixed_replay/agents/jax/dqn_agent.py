"""Offline DQN in JAX (Dopamine's JaxDQNAgent) on a fixed dataset."""

from dopamine.jax.agents.dqn import dqn_agent
import gin

from fixed_replay.agents.jax import offline as jax_offline


@gin.configurable
class FixedReplayJaxDQNAgent(
  jax_offline.JaxOfflineAgent, dqn_agent.JaxDQNAgent
):
  """Dopamine's JaxDQNAgent trained only from logged replay checkpoints.

  The TD loss is Dopamine's `dqn_agent.train` (Huber by default here, as in
  Nature DQN; `loss_type='mse'` gives Dopamine JAX's default).
  """

  method = 'DQN'

  def __init__(
    self,
    num_actions,
    replay_data_dir,
    replay_suffix=None,
    init_checkpoint_dir=None,
    prefetch_batches=2,
    loss_type='huber',
    **kwargs,
  ):
    """Creates the agent.

    Args:
      num_actions: int.
      replay_data_dir: str, directory of replay checkpoints.
      replay_suffix: int or None, train on this checkpoint only.
      init_checkpoint_dir: str or None, a run to continue from (see
        FixedReplayRunner).
      prefetch_batches: int, minibatches prepared ahead in the background (0:
        sample in the training step).
      loss_type: str, 'huber' or 'mse'.
      **kwargs: Dopamine JaxDQNAgent arguments.
    """
    self._init_offline(
      replay_data_dir, replay_suffix, init_checkpoint_dir, prefetch_batches
    )
    dqn_agent.JaxDQNAgent.__init__(
      self, num_actions, loss_type=loss_type, **kwargs
    )
    self._finish_offline_init()

  def _update(self):
    elements = self.replay_elements
    self.optimizer_state, self.online_params, loss = dqn_agent.train(
      self.network_def,
      self.online_params,
      self.target_network_params,
      self.optimizer,
      self.optimizer_state,
      self.preprocess_fn(elements['state']),
      elements['action'],
      self.preprocess_fn(elements['next_state']),
      elements['reward'],
      elements['terminal'],
      self.cumulative_gamma,
      self._loss_type,
    )
    name = 'HuberLoss' if self._loss_type == 'huber' else 'MSELoss'
    return {name: loss}
