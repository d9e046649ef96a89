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

  def __init__(
    self,
    num_actions,
    replay_data_dir,
    replay_suffix=None,
    init_checkpoint_dir=None,
    prefetch_batches=2,
    replay_scheme='uniform',
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
    self._init_offline(
      replay_data_dir, replay_suffix, init_checkpoint_dir, prefetch_batches
    )
    quantile_agent.JaxQuantileAgent.__init__(
      self, num_actions, replay_scheme=replay_scheme, **kwargs
    )
    self._finish_offline_init()

  @property
  def num_atoms(self):
    return self._num_atoms

  @property
  def kappa(self):
    return self._kappa

  def _update(self):
    elements = self.replay_elements
    self.optimizer_state, self.online_params, _, mean_loss = (
      quantile_agent.train(
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
        self._kappa,
        self._num_atoms,
        self.cumulative_gamma,
      )
    )
    return {'QuantileLoss': mean_loss}
