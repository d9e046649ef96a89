"""Offline QR-DQN in JAX (Dopamine's JaxQuantileAgent), uniform replay."""

from dopamine.jax.agents.quantile import quantile_agent
import gin

from fixed_replay.agents.jax import offline as jax_offline


@gin.configurable
class FixedReplayJaxQuantileAgent(
  jax_offline.JaxOfflineAgent, quantile_agent.JaxQuantileAgent
):
  """Dopamine's JaxQuantileAgent trained only from logged replay checkpoints.

  The loss is Dopamine's `quantile_agent.train`: quantile Huber loss with
  tau_hat_i = (i + 0.5) / N, mean over target quantiles, sum over online
  quantiles, targets from the action maximising the mean target quantile.
  Sampling is uniform: the dataset has no priorities.
  """

  method = 'QR-DQN'
  loss_name = 'QuantileLoss'  # In summaries.

  def __init__(self, *args, replay_scheme: str = 'uniform', **kwargs) -> None:
    """Creates the agent.

    Args:
      *args: `JaxOfflineAgent`'s (num_actions, replay_data_dir,
        replay_suffix, init_checkpoint_dir, prefetch_batches), also taken by
        name.
      replay_scheme: str, must be 'uniform'.
      **kwargs: Dopamine JaxQuantileAgent arguments (num_atoms, kappa, ...).

    Raises:
      ValueError: if replay_scheme is not 'uniform'.
    """
    if replay_scheme != 'uniform':
      raise ValueError(
        f'replay_scheme={replay_scheme!r}: offline agents support only '
        "'uniform' (the dataset has no priorities)"
      )
    super().__init__(*args, replay_scheme=replay_scheme, **kwargs)

  @property
  def num_atoms(self) -> int:
    return self._num_atoms

  @property
  def kappa(self) -> float:
    return self._kappa

  def _update(self):
    self.optimizer_state, self.online_params, _, mean_loss = (
      quantile_agent.train(
        *self._train_arguments(),
        self._kappa,
        self._num_atoms,
        self.cumulative_gamma,
      )
    )
    return {self.loss_name: mean_loss}
