"""FixedReplayRunner: trains offline agents, evaluates them in the real game.

Each iteration swaps in the next set of replay checkpoints (loaded in the
background while the previous iteration trained), runs `training_steps`
agent train steps without touching the environment, then evaluates the agent
in the game with Dopamine's own episode loop (Atari preprocessing, sticky
actions). Logging, checkpointing and resuming are Dopamine's: `logs/log_N`
pickles, `checkpoints/` bundles restored through `agent.unbundle`.

The runner takes any Dopamine agent with batch_rl's contract: `_train_step()`
(or `train_step()`) trains once from the fixed data, `reload_data()` (or
`_replay.memory.reload_buffer()`, or `_replay.reload_data()`) swaps data, and
an `_init_checkpoint_dir` attribute names a run to continue from.
"""

from collections.abc import Callable
from collections.abc import Sequence
import functools
import inspect
import os
import time
from typing import Any

from absl import logging
from dopamine.discrete_domains import checkpointer

# Registers Dopamine's classic-control environments and networks with gin,
# so configs can name them without importing anything.
from dopamine.discrete_domains import gym_lib  # noqa: F401
from dopamine.discrete_domains import iteration_statistics
from dopamine.discrete_domains import run_experiment
import gin

from fixed_replay import agents
from fixed_replay import arguments as arguments_lib
from fixed_replay import progress
from fixed_replay.sources import layout
from fixed_replay.training import agent_contract
from fixed_replay.training import data_game
from fixed_replay.training import reporting

# Marks a runner argument left to Dopamine's Runner (its gin bindings, then
# its defaults).
_RUNNER_DEFAULT = object()


# A checkpoint's entry for the replay's stream (agent_contract.replay_state).
REPLAY_STREAM = 'replay_stream'


@gin.configurable
class FixedReplayRunner(run_experiment.Runner):
  """Runs an offline experiment: train from a fixed dataset, evaluate online.

  `training_steps` counts agent train steps (a gradient update every
  `update_period` of them, as Dopamine's online agents do per environment
  step), so the published setting of 250,000 training steps is 62,500
  updates per iteration.

  As in batch_rl, an argument not bound as `FixedReplayRunner.<name>` takes
  a `Runner.<name>` binding, then Dopamine's default (Atari, 200 iterations
  x 250,000 training steps, 125,000 evaluation steps, 27,000 steps per
  episode at most, clipped rewards).
  """

  def __init__(
    self,
    base_dir: str,
    create_agent_fn: Callable[..., Any],
    create_environment_fn: Any = _RUNNER_DEFAULT,
    checkpoint_file_prefix: Any = _RUNNER_DEFAULT,
    logging_file_prefix: Any = _RUNNER_DEFAULT,
    log_every_n: Any = _RUNNER_DEFAULT,
    num_iterations: Any = _RUNNER_DEFAULT,
    training_steps: Any = _RUNNER_DEFAULT,
    evaluation_steps: Any = _RUNNER_DEFAULT,
    max_steps_per_episode: Any = _RUNNER_DEFAULT,
    clip_rewards: Any = _RUNNER_DEFAULT,
  ) -> None:
    """Creates the environment and agent, and resumes from a checkpoint.

    Args:
      base_dir: str, directory for checkpoints/, logs/ and TensorBoard events.
      create_agent_fn: callable (sess, environment, summary_writer=...) ->
        an offline agent (see the module docstring for its contract).
      create_environment_fn, checkpoint_file_prefix, logging_file_prefix,
        log_every_n, num_iterations, training_steps, evaluation_steps,
        max_steps_per_episode, clip_rewards: Dopamine Runner's arguments
        (`num_iterations` counts the whole run: resuming continues up to it).
    """
    given = {
      name: value
      for name, value in locals().items()
      if value is not _RUNNER_DEFAULT and name in _RUNNER_ARGUMENTS
    }
    self._loss_tap = reporting.LossTap()
    self._iteration = 0
    self._eval_bar = None
    # What was passed fails before the agent loads its data; Runner.*
    # bindings are checked as Dopamine's Runner took them, below.
    arguments_lib.check_arguments(given)
    super().__init__(
      base_dir,
      agent_contract.graph_mode_hint(create_agent_fn),
      use_legacy_logger=True,
      # Progress goes to tqdm bars and one log line per iteration instead.
      fine_grained_print_to_console=False,
      **given,
    )
    arguments_lib.check_arguments(
      dict(
        num_iterations=self._num_iterations,
        training_steps=self._training_steps,
        evaluation_steps=self._evaluation_steps,
        max_steps_per_episode=self._max_steps_per_episode,
      )
    )
    reporting.tap_agent_losses(
      self._agent, self._collector_dispatcher, self._loss_tap
    )
    agent_contract.log_method(self._agent)
    agent_contract.warn_if_no_training(self._agent)

  # ------------------------------------------------------------ iterations

  def _run_one_iteration(self, iteration):
    """Reloads data, trains, evaluates; returns the iteration's statistics.

    Args:
      iteration: int, the iteration number (the TensorBoard step).

    Returns:
      dict of lists, the IterationStatistics data of this iteration.
    """
    self._iteration = iteration
    statistics = iteration_statistics.IterationStatistics()
    logging.info('Starting iteration %d', iteration)
    reload_seconds = 0.0
    # The first iteration of a process trains on what the buffer loaded when
    # it was built; later ones, and a resumed run's first (its buffer then
    # holds the saved run's set), take the set prefetched meanwhile.
    if iteration != self._start_iteration or self._stream_resumed:
      began = time.perf_counter()
      agent_contract.reload_data(self._agent)
      reload_seconds = time.perf_counter() - began
    wait_seconds = self._replay_wait_seconds(reset=True)
    train_seconds = self._run_train_phase(statistics)
    wait_seconds = self._replay_wait_seconds()
    began = time.perf_counter()
    num_episodes_eval, average_return_eval = self._run_eval_phase(statistics)
    eval_seconds = time.perf_counter() - began
    losses = self._loss_tap.pop_means()
    steps_per_second = self._training_steps / max(train_seconds, 1e-9)
    statistics.append(
      {
        'train_seconds': train_seconds,
        'reload_seconds': reload_seconds,
        'eval_seconds': eval_seconds,
      }
    )
    statistics.append(
      {f'train_average_{name}': value for name, value in losses.items()}
    )
    scalars = {
      'Eval/AverageReturns': average_return_eval,
      'Eval/NumEpisodes': num_episodes_eval,
      'Train/AverageStepsPerSecond': steps_per_second,
      'Time/TrainSeconds': train_seconds,
      'Time/ReloadSeconds': reload_seconds,
      'Time/EvalSeconds': eval_seconds,
    }
    if wait_seconds is not None:
      # Agents that sample in the background say how long training waited.
      statistics.append({'train_replay_wait_seconds': wait_seconds})
      scalars['Time/ReplayWaitSeconds'] = wait_seconds
    scalars.update({f'Train/{name}': value for name, value in losses.items()})
    dispatcher = None
    if self._has_collector_dispatcher:
      dispatcher = self._collector_dispatcher
    reporting.write_scalars(
      self._summary_writer, dispatcher, iteration, scalars
    )
    return statistics.data_lists

  def _replay_wait_seconds(self, reset: bool = False):
    """Seconds the agent's train steps waited on minibatches, if it counts."""
    if not hasattr(self._agent, 'replay_wait_seconds'):
      return None
    if reset:
      self._agent.reset_replay_wait()
    return self._agent.replay_wait_seconds

  def _run_train_phase(self, statistics):
    """Runs `training_steps` agent train steps; no environment step.

    Args:
      statistics: IterationStatistics, receives the steps per second.

    Returns:
      float, seconds spent in the train steps (sampling and updates).
    """
    self._agent.eval_mode = False
    train_step = agent_contract.train_step_of(self._agent)
    began = time.perf_counter()
    with self._steps_bar('train', self._training_steps) as bar:
      for _ in range(self._training_steps):
        train_step()
        bar.update(1)
    seconds = time.perf_counter() - began
    steps_per_second = self._training_steps / max(seconds, 1e-9)
    statistics.append({'train_average_steps_per_second': steps_per_second})
    logging.info(
      'Iteration %d: %d training steps in %.1f s (%.1f steps/s)',
      self._iteration,
      self._training_steps,
      seconds,
      steps_per_second,
    )
    return seconds

  def _run_eval_phase(self, statistics):
    """Dopamine's evaluation phase, with a progress bar over its steps."""
    with self._steps_bar('eval', self._evaluation_steps) as bar:
      self._eval_bar = bar
      try:
        return super()._run_eval_phase(statistics)
      finally:
        self._eval_bar = None

  def _steps_bar(self, phase, steps):
    return progress.bar(
      steps, f'iteration {self._iteration} {phase}', 'step', unit_scale=True
    )

  def _run_one_step(self, action):
    """One environment step (evaluation only), counted by the eval bar."""
    result = super()._run_one_step(action)
    if self._eval_bar is not None:
      self._eval_bar.update(1)
    return result

  def run_experiment(self) -> None:
    """Runs iterations start_iteration..num_iterations-1, checkpointing each.

    Logs one line per iteration with its speed, evaluation return and the
    estimated time left for the whole run.
    """
    if self._num_iterations <= self._start_iteration:
      logging.info(
        'The run in %s is complete: %d iterations done, num_iterations=%d; '
        'nothing is left to do (raise '
        'FixedReplayRunner.num_iterations to train further)',
        self._base_dir,
        self._start_iteration,
        self._num_iterations,
      )
      return
    logging.info(
      'Training iterations %d to %d in %s',
      self._start_iteration,
      self._num_iterations - 1,
      self._base_dir,
    )
    durations = []
    for iteration in range(self._start_iteration, self._num_iterations):
      began = time.perf_counter()
      statistics = self._run_one_iteration(iteration)
      self._log_experiment(iteration, statistics)
      self._checkpoint_experiment(iteration)
      if self._has_collector_dispatcher:
        self._collector_dispatcher.flush()
      durations.append(time.perf_counter() - began)
      remaining = self._num_iterations - 1 - iteration
      reporting.log_iteration(
        iteration, self._num_iterations, statistics, durations, remaining
      )
    if self._summary_writer is not None:
      self._summary_writer.flush()
    if self._has_collector_dispatcher:
      self._collector_dispatcher.close()

  # ------------------------------------------------- continuing another run

  def _checkpoint_experiment(self, iteration):
    """Dopamine's checkpoint, with the replay's stream beside the agent.

    A run killed after this iteration and started again on the same
    base_dir then draws, from the next iteration on, what this one draws.
    """
    data = self._agent.bundle_and_checkpoint(self._checkpoint_dir, iteration)
    if data:
      data['current_iteration'] = iteration
      data['logs'] = self._logger.data
      stream = agent_contract.replay_state(self._agent)
      if stream is not None:
        data[REPLAY_STREAM] = stream
      self._checkpointer.save_checkpoint(iteration, data)

  def _initialize_checkpointer_and_maybe_resume(self, checkpoint_file_prefix):
    """Resumes base_dir's own run, or continues the agent's init run.

    As batch_rl's runner: when base_dir holds no checkpoint yet and the
    agent has an `_init_checkpoint_dir`, the latest checkpoint there is
    restored through the agent's `unbundle` (weights, training steps, for
    JAX agents the optimizer state) with the logged history, and the run
    goes on from the next iteration, writing to base_dir. The directory may
    be the other run's base_dir or its checkpoints/ folder.

    Raises:
      ValueError: if the init directory holds no complete checkpoint.
    """
    super()._initialize_checkpointer_and_maybe_resume(checkpoint_file_prefix)
    self._stream_resumed = False
    if self._start_iteration:  # base_dir's own run: its replay stream too.
      data = self._checkpointer.load_checkpoint(self._start_iteration - 1)
      try:
        if data and REPLAY_STREAM in data:
          agent_contract.load_replay_state(self._agent, data[REPLAY_STREAM])
          self._stream_resumed = True
      except ValueError as error:  # Saved over other data or arguments.
        logging.warning('The replay stream starts anew: %s', error)
    init_dir = getattr(self._agent, '_init_checkpoint_dir', None)
    if not init_dir or self._start_iteration != 0:
      return
    if checkpointer.get_latest_checkpoint_number(self._checkpoint_dir) >= 0:
      return  # base_dir has its own run (it was unbundled above).
    try:
      directory, number, data = agent_contract.restore_init_checkpoint(
        self._agent, init_dir, checkpoint_file_prefix
      )
    except BaseException:
      if callable(getattr(self._agent, 'close', None)):
        self._agent.close()  # Stops its background threads.
      raise
    if data is not None:
      self._logger.data = data['logs']
      self._start_iteration = data['current_iteration'] + 1
    logging.info(
      'Continuing from checkpoint %d of %s: starting at iteration %d',
      number,
      directory,
      self._start_iteration,
    )

  @property
  def agent(self) -> Any:
    """The agent being trained."""
    return self._agent

  @property
  def environment(self) -> Any:
    """The evaluation environment."""
    return self._environment

  @property
  def start_iteration(self) -> int:
    """The first iteration this runner will run (after any resume)."""
    return self._start_iteration


# The arguments FixedReplayRunner passes on to Dopamine's Runner when given.
_RUNNER_ARGUMENTS = tuple(
  inspect.signature(FixedReplayRunner.__init__).parameters
)[3:]


def create_runner(
  base_dir: str,
  agent_name: str = 'dqn',
  replay_dir: str | layout.Layout | None = None,
  gin_files: Sequence[str] = (),
  gin_bindings: Sequence[str] = (),
  init_checkpoint_dir: str | None = None,
  replay_suffix: int | None = None,
) -> FixedReplayRunner:
  """Parses gin configs and creates a FixedReplayRunner.

  The runner evaluates in the data's game unless a gin binding names
  another (see data_game.py for the rule).

  Args:
    base_dir: str, where the run writes checkpoints, logs and summaries.
    agent_name: str, a name registered in fixed_replay.agents.AGENTS.
    replay_dir: str, the dataset: a run directory, its replay_logs/ or a
      compact store (see sources/layout.py); or its trainable layout.Layout,
      already detected.
    gin_files: list of gin config files.
    gin_bindings: list of gin bindings, applied after the files.
    init_checkpoint_dir: str or None, a run whose latest weights initialise
      the agent (ignored once base_dir has its own checkpoint).
    replay_suffix: int or None, train on this one checkpoint only.

  Returns:
    FixedReplayRunner.

  Raises:
    CheckpointError: if replay_dir holds nothing trainable (saying why).
    UsageError: on an unknown agent name, a missing gin file or no game.
  """
  if not base_dir:
    raise ValueError('base_dir is required')
  if not replay_dir:
    raise ValueError('replay_dir is required')
  dataset = replay_dir
  if not isinstance(dataset, layout.Layout):
    dataset = layout.detect(replay_dir).require_trainable()
  # Registers every gin name the run uses before the configs are parsed
  # (and locked): the agent's, the buffers', the runner's.
  agents.import_gin_names(agents.agent_class(agent_name))
  game = data_game.parse_configs(dataset, gin_files, gin_bindings)
  logging.info('Agent %s on %s', agent_name, dataset.data_dir)
  create_agent_fn = functools.partial(
    agents.create_agent,
    agent_name=agent_name,
    replay_data_dir=dataset.data_dir,
    replay_suffix=replay_suffix,
    init_checkpoint_dir=init_checkpoint_dir,
  )
  # Before the agent loads any data: actions the game lacks are an error.
  create_agent_fn = data_game.checking_actions(create_agent_fn, dataset, game)
  return FixedReplayRunner(os.fspath(base_dir), create_agent_fn)
