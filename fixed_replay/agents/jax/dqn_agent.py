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

  def __init__(self, *args, loss_type: str = 'huber', **kwargs) -> None:
    """Creates the agent.

    Args:
      *args: `JaxOfflineAgent`'s (num_actions, replay_data_dir,
        replay_suffix, init_checkpoint_dir, prefetch_batches), also taken by
        name.
      loss_type: str, 'huber' or 'mse'.
      **kwargs: Dopamine JaxDQNAgent arguments.
    """
    super().__init__(*args, loss_type=loss_type, **kwargs)

  @property
  def loss_name(self) -> str:
    """The TD loss's name in summaries: 'HuberLoss' or 'MSELoss'."""
    return 'HuberLoss' if self._loss_type == 'huber' else 'MSELoss'

  def _update(self):
    self.optimizer_state, self.online_params, loss = dqn_agent.train(
      *self._train_arguments(), self.cumulative_gamma, self._loss_type
    )
    return {self.loss_name: loss}
