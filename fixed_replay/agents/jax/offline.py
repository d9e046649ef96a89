"""What turns a Dopamine JAX agent into an offline one.

`JaxOfflineAgent` is mixed in before a `dopamine.jax.agents` class, as
`OfflineAgent` is for the TF agents:

* the replay is a `FixedReplayBuffer` over a logged dataset (Dopamine 4.x's
  `sample()` API), read-only: `begin_episode`, `step` and `end_episode` only
  act, nothing is ever added;
* minibatches are sampled and moved to the accelerator ahead of the update
  by a background thread (`prefetch.BatchPrefetcher`), unless the buffer's
  own sampling threads prepare them (then the buffer's is the one queue);
  `replay_wait_seconds` says how long the training loop waited;
* the runner drives training through `train_step()` and swaps data with
  `reload_data()`; an update happens every `update_period` train steps, the
  target network is synced every `target_update_period`, as in Dopamine;
* `init_checkpoint_dir` is kept for the runner, which continues from that
  run's latest checkpoint as batch_rl's does;
* checkpoints are Dopamine's bundles (parameters, target parameters,
  optimizer state, training steps) plus the agent's JAX RNG key; a bundle
  whose parameters do not fit the agent's networks is refused by name.

Subclasses implement `_update()`: one gradient step on `self.replay_elements`
returning {loss name: scalar}, calling their `train` function with
`self._update_arguments()` first (Dopamine's own `train` functions take
`self._train_arguments()`).

The `optimizer` argument takes either a name for Dopamine's gin-configurable
`create_optimizer` ('adam', 'rmsprop', 'sgd') or an optax
GradientTransformation, e.g. `@optax.rmsprop()` in gin (registered here) for
TF1's RMSProp semantics (`initial_scale=1.0`), which Dopamine's factory
cannot express.
"""

import collections
import contextlib
import time
from typing import Any

from absl import logging
from dopamine.jax.agents.dqn import dqn_agent
from dopamine.metrics import statistics_instance
import gin
import jax
import numpy as np
import optax
import tensorflow as tf

from fixed_replay import prefetch
from fixed_replay.replay.fixed_replay_buffer import replay_buffer_class

# optax's optimizers, configurable as `@optax.<name>()`.
for _optimizer in (optax.adam, optax.rmsprop, optax.sgd):
  with contextlib.suppress(ValueError):  # Registered in this process already.
    gin.external_configurable(_optimizer, module='optax')


def make_optimizer(optimizer):
  """The optax optimizer `optimizer` names (for Dopamine's
  `create_optimizer`) or is (an optax GradientTransformation); else a
  TypeError."""
  if isinstance(optimizer, str):
    return dqn_agent.create_optimizer(optimizer)
  if isinstance(optimizer, optax.GradientTransformation):
    return optimizer
  raise TypeError(
    f'optimizer must be a name for create_optimizer or an optax '
    f'GradientTransformation, got {optimizer!r}'
  )


def gradient_step(loss_fn, optimizer, optimizer_state, params, has_aux=False):
  """One optimizer step on `loss_fn(params)`, inside an update's jit.

  Returns:
    (optimizer_state, params, value): after the step, and loss_fn's value
    before it ((loss, aux) with has_aux).
  """
  value, grad = jax.value_and_grad(loss_fn, has_aux=has_aux)(params)
  updates, optimizer_state = optimizer.update(grad, optimizer_state, params)
  return optimizer_state, optax.apply_updates(params, updates), value


class JaxOfflineAgent:
  """Mixin for Dopamine JAX agents that learn only from a fixed dataset."""

  # The method trained, named in the run log; subclasses refine it.
  method = 'DQN'

  def __init__(
    self,
    num_actions,
    replay_data_dir,
    replay_suffix=None,
    init_checkpoint_dir=None,
    prefetch_batches=2,
    **kwargs,
  ):
    """Records the dataset, then builds the Dopamine agent.

    Args:
      num_actions: int.
      replay_data_dir, replay_suffix, init_checkpoint_dir: the dataset, a
        single checkpoint of it (None: the buffer's gin bindings choose) and
        a run to continue from, as the TF agents' `OfflineAgent` takes them.
      prefetch_batches: int, minibatches prepared ahead in a background
        thread; 0 samples in the training step itself. Not used when the
        buffer prepares minibatches in its own threads
        (`FixedReplayBuffer.sampling_threads`, on by default over a store).
      **kwargs: the Dopamine agent's arguments.

    Raises:
      ValueError: if prefetch_batches is negative.
    """
    if prefetch_batches < 0:
      raise ValueError(f'prefetch_batches={prefetch_batches} must be >= 0')
    self._replay_data_dir = replay_data_dir
    self._replay_suffix = replay_suffix
    self._init_checkpoint_dir = init_checkpoint_dir
    self._prefetcher = None
    self._sync_wait_seconds = 0.0
    self._sync_batches = 0
    # {name: scalar} of the last update, left on the device (reading it
    # waits for the update to finish).
    self.last_losses = {}
    super().__init__(num_actions, **kwargs)
    # All the data exists from the start: a warm-up threshold means nothing.
    self.min_replay_history = 0
    if getattr(self._replay, 'sampling_threads', 0):
      # The buffer's own threads prepare the minibatches: a second queue on
      # top would only hold more of them.
      logging.info(
        "Minibatches are prepared by the buffer's %d sampling thread(s); "
        'prefetch_batches=%d not used.',
        self._replay.sampling_threads,
        prefetch_batches,
      )
    elif prefetch_batches:
      # The buffer's stream after the last minibatch trained on (the
      # prefetcher runs ahead of it): what a checkpoint saves, and where a
      # reload rewinds the buffer to.
      self._trained_place = self._place()  # None: a replay with no place.
      self._prefetcher = prefetch.BatchPrefetcher(
        self._sample_batch_and_place,
        depth=prefetch_batches,
        transform=lambda drawn: (jax.device_put(drawn[0]), drawn[1]),
        name=f'{type(self).__name__}_prefetch',
      )

  # ------------------------------------------------------------- the data

  def _build_replay_buffer(self):
    """Returns the buffer over the dataset (see `replay_buffer_class`).

    Shapes, n-step settings and dtypes are the agent's; everything else
    (replay_capacity, batch_size, num_buffers_to_load, ...) is bound in gin
    as `FixedReplayBuffer.<name>`. Arguments go by name, so a class with
    Dopamine's `JaxFixedReplayBuffer` argument order works too.
    """
    # replay_suffix is passed only when chosen here, so that a gin binding
    # of FixedReplayBuffer.replay_suffix takes effect otherwise.
    chosen = {}
    if self._replay_suffix is not None:
      chosen['replay_suffix'] = self._replay_suffix
    return replay_buffer_class()(
      data_dir=self._replay_data_dir,
      **chosen,
      observation_shape=self.observation_shape,
      stack_size=self.stack_size,
      update_horizon=self.update_horizon,
      gamma=self.gamma,
      observation_dtype=np.dtype(self.observation_dtype),
    )

  def _sample_batch(self):
    """One minibatch from the buffer, under Dopamine's replay_elements keys."""
    element = self._replay.sample()
    return collections.OrderedDict(
      state=element.state,
      next_state=element.next_state,
      action=element.action,
      reward=element.reward,
      terminal=element.is_terminal,
    )

  def _place(self):
    """The replay's stream place, where it has one (FixedReplayBuffer's)."""
    state_dict = getattr(self._replay, 'state_dict', None)
    return state_dict() if callable(state_dict) else None

  def _sample_batch_and_place(self):
    return self._sample_batch(), self._place()

  def _sample_from_replay_buffer(self):
    """Sets self.replay_elements to the next (on-device) minibatch."""
    if self._prefetcher is not None:
      self.replay_elements, self._trained_place = self._prefetcher.get()
      return
    began = time.perf_counter()
    self.replay_elements = jax.device_put(self._sample_batch())
    self._sync_wait_seconds += time.perf_counter() - began
    self._sync_batches += 1

  @property
  def replay_wait_seconds(self):
    """Seconds the training steps spent waiting for minibatches so far."""
    if self._prefetcher is not None:
      return self._prefetcher.wait_seconds
    return self._sync_wait_seconds

  @property
  def replay_batches(self):
    """Minibatches the training steps have taken so far."""
    if self._prefetcher is not None:
      return self._prefetcher.batches
    return self._sync_batches

  def reset_replay_wait(self):
    """Zeroes replay_wait_seconds and replay_batches."""
    if self._prefetcher is not None:
      self._prefetcher.reset_stats()
    self._sync_wait_seconds = 0.0
    self._sync_batches = 0

  def reload_data(self) -> None:
    """Swaps in the next set of checkpoints (prefetched in the background).

    Minibatches prepared from the previous set are dropped.
    """
    if self._prefetcher is None:
      self._replay.reload_data()
      return
    with self._prefetcher.paused():
      # Drawn ahead and dropped: the stream goes on from the last trained.
      if self._trained_place is not None:
        self._replay.load_state_dict(self._trained_place)
      self._replay.reload_data()

  def replay_state(self) -> dict:
    """The buffer's stream after the last minibatch trained on (plain
    numbers; FixedReplayBuffer.state_dict), for the runner's checkpoints."""
    if self._prefetcher is None:
      return self._replay.state_dict()
    return self._trained_place

  def load_replay_state(self, state: dict) -> None:
    """Trains from here on on what the run that saved `state` would have."""
    if self._prefetcher is None:
      self._replay.load_state_dict(state)
      return
    with self._prefetcher.paused():
      self._replay.load_state_dict(state)
      self._trained_place = state

  @property
  def replay(self) -> Any:
    """The FixedReplayBuffer the agent trains from."""
    return self._replay

  def close(self) -> None:
    """Stops background sampling and checkpoint loading."""
    if self._prefetcher is not None:
      self._prefetcher.close()
    self._replay.close()

  # ------------------------------------------------------------ acting only

  def _build_networks_and_optimizer(self):
    self._rng, rng = jax.random.split(self._rng)
    self.online_params = self.network_def.init(
      rng, x=self.preprocess_fn(self.state)
    )
    self.optimizer = make_optimizer(self._optimizer_name)
    self.optimizer_state = self.optimizer.init(self.online_params)
    self.target_network_params = self.online_params

  def _select_action(self):
    self._rng, action = dqn_agent.select_action(
      self.network_def,
      self.online_params,
      self.preprocess_fn(self.state),
      self._rng,
      self.num_actions,
      self.eval_mode,
      self.epsilon_eval,
      self.epsilon_train,
      self.epsilon_decay_period,
      self.training_steps,
      self.min_replay_history,
      self.epsilon_fn,
    )
    self.action = np.asarray(action)
    return self.action

  def begin_episode(self, observation: np.ndarray) -> int:
    """Returns the first action of an episode; never trains."""
    self._reset_state()
    self._record_observation(observation)
    return self._select_action()

  def step(self, reward: float, observation: np.ndarray) -> int:
    """Returns the next action; the transition is not stored anywhere."""
    del reward
    self._last_observation = self._observation
    self._record_observation(observation)
    return self._select_action()

  def end_episode(self, reward: float, terminal: bool = True) -> None:
    """Nothing to do: offline agents never add to their data."""
    del reward, terminal

  # --------------------------------------------------------------- training

  def train_step(self) -> None:
    """One training step (an update every `update_period` steps)."""
    self._train_step()

  def _train_step(self):
    """Dopamine's schedule, without the replay warm-up test."""
    if self.training_steps % self.update_period == 0:
      self._sample_from_replay_buffer()
      losses = self.last_losses = self._update()
      if (
        self.summary_writer is not None
        and self.training_steps > 0
        and self.training_steps % self.summary_writing_frequency == 0
      ):
        self._write_losses(losses)
    if self.training_steps % self.target_update_period == 0:
      self._sync_weights()
    self.training_steps += 1

  def _update(self):
    """One gradient step on self.replay_elements; returns {name: loss}."""
    raise NotImplementedError

  def _minibatch(self):
    """(states, actions, next_states, rewards, terminals) of this update."""
    elements = self.replay_elements
    return (
      self.preprocess_fn(elements['state']),
      elements['action'],
      self.preprocess_fn(elements['next_state']),
      elements['reward'],
      elements['terminal'],
    )

  def _train_arguments(self):
    """What Dopamine's `dqn_agent.train` and `quantile_agent.train` take
    first: the networks, the optimizer and the minibatch."""
    return (
      self.network_def,
      self.online_params,
      self.target_network_params,
      self.optimizer,
      self.optimizer_state,
      *self._minibatch(),
    )

  def _update_arguments(self):
    """What our updates (cql_agent.train, rem_agent.train) take first."""
    return (
      self.network_def,
      self.optimizer,
      (self.online_params, self.target_network_params),
      self.optimizer_state,
      self._minibatch(),
    )

  def _write_losses(self, losses):
    """Writes losses as Dopamine's JAX agents do (summaries, collectors)."""
    values = {name: float(np.asarray(value)) for name, value in losses.items()}
    with self.summary_writer.as_default():
      for name, value in values.items():
        tf.summary.scalar(name, value, step=self.training_steps)
    self.summary_writer.flush()
    if hasattr(self, 'collector_dispatcher'):
      self.collector_dispatcher.write(
        [
          statistics_instance.StatisticsInstance(
            name, value, step=self.training_steps
          )
          for name, value in values.items()
        ],
        collector_allowlist=self._collector_allowlist,
      )

  # ------------------------------------------------ checkpoints, warm start

  def bundle_and_checkpoint(self, checkpoint_dir, iteration_number):
    """Dopamine's bundle plus the agent's RNG key."""
    bundle = super().bundle_and_checkpoint(checkpoint_dir, iteration_number)
    if bundle is not None:
      bundle['rng'] = self._rng
    return bundle

  def unbundle(self, checkpoint_dir, iteration_number, bundle_dictionary):
    """Restores Dopamine's bundle and the RNG key (if saved).

    Raises:
      ValueError: if the bundle's parameters do not fit this agent.
    """
    if bundle_dictionary:
      self._check_fits(bundle_dictionary, checkpoint_dir, iteration_number)
    restored = super().unbundle(
      checkpoint_dir, iteration_number, bundle_dictionary
    )
    if restored and bundle_dictionary and 'rng' in bundle_dictionary:
      self._rng = bundle_dictionary['rng']
    return restored

  def _check_fits(self, bundle, checkpoint_dir, iteration_number):
    """Raises ValueError unless the bundle's parameters fit the networks."""
    where = f'{checkpoint_dir} (checkpoint {iteration_number})'
    if not isinstance(bundle, dict) or 'online_params' not in bundle:
      raise ValueError(f'{where}: not a JAX agent checkpoint')
    for key, current in (
      ('online_params', self.online_params),
      ('target_params', self.target_network_params),
    ):
      if key in bundle and _signature(bundle[key]) != _signature(current):
        raise ValueError(
          f'{where}: its {key} do not fit this agent ({type(self).__name__}, '
          f'{self.num_actions} actions): parameter names or shapes differ'
        )


def _signature(tree):
  """The structure and leaf shapes of a pytree."""
  leaves, structure = jax.tree.flatten(tree)
  return structure, [np.shape(leaf) for leaf in leaves]
