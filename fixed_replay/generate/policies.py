"""Behaviour policies that play a game for `fixed-replay generate`.

Every policy has the acting half of Dopamine's agent interface:
`begin_episode(observation)` and `step(reward, observation)` both return the
action for `observation`, the observation exactly as the environment returned
it ((84, 84, 1) uint8 for Atari, (4,) float for CartPole).

* `RandomPolicy`: uniform random actions, each held for `action_repeat` agent
  steps.
* Scripted controllers (`CartPoleController`, `PongController`,
  `BreakoutController`), built with `make_scripted_policy`.
* `AgentPolicy`: the greedy action of a Dopamine agent restored from the
  checkpoints of Dopamine's Runner (`load_agent`).
* `EpsilonGreedyPolicy`: wraps the last two, taking a uniform random action
  with probability epsilon, as Dopamine's agents explore.
"""

from typing import Any

import numpy as np

from fixed_replay.errors import CheckpointError


class RandomPolicy:
  """Uniform random actions, each repeated for `action_repeat` agent steps.

  With action_repeat=1 this is the random agent of the Atari literature (and
  Dopamine's exploration). Larger values give temporally correlated
  exploration: a Pong paddle then travels across the screen instead of
  jittering in place.
  """

  def __init__(
    self, num_actions: int, rng: np.random.Generator, action_repeat: int = 1
  ) -> None:
    """Initializes the policy.

    Args:
      num_actions: int, size of the discrete action space.
      rng: np.random.Generator, the only source of randomness.
      action_repeat: int >= 1, agent steps each drawn action is held for.

    Raises:
      ValueError: if action_repeat < 1.
    """
    if action_repeat < 1:
      raise ValueError(f'action_repeat must be >= 1, got {action_repeat}')
    self._num_actions = num_actions
    self._rng = rng
    self._action_repeat = action_repeat
    self._action = 0
    self._steps_left = 0

  def begin_episode(self, observation: np.ndarray) -> int:
    del observation
    self._steps_left = 0
    return self._next_action()

  def step(self, reward: float, observation: np.ndarray) -> int:
    del reward, observation
    return self._next_action()

  def _next_action(self):
    if self._steps_left == 0:
      self._action = int(self._rng.integers(self._num_actions))
      self._steps_left = self._action_repeat
    self._steps_left -= 1
    return self._action


class EpsilonGreedyPolicy:
  """Takes a uniform random action with probability epsilon, else the base's.

  The base policy sees every observation, so stateful ones (an agent's frame
  stack) stay in sync even on exploratory steps.
  """

  def __init__(
    self,
    policy: Any,
    num_actions: int,
    epsilon: float,
    rng: np.random.Generator,
  ) -> None:
    """Initializes the policy.

    Args:
      policy: the greedy policy (begin_episode/step).
      num_actions: int, size of the discrete action space.
      epsilon: float in [0, 1], probability of a random action.
      rng: np.random.Generator.

    Raises:
      ValueError: if epsilon is outside [0, 1].
    """
    if not 0.0 <= epsilon <= 1.0:
      raise ValueError(f'epsilon must be in [0, 1], got {epsilon}')
    self._policy = policy
    self._num_actions = num_actions
    self._epsilon = epsilon
    self._rng = rng

  def begin_episode(self, observation: np.ndarray) -> int:
    return self._explore(self._policy.begin_episode(observation))

  def step(self, reward: float, observation: np.ndarray) -> int:
    return self._explore(self._policy.step(reward, observation))

  def _explore(self, action):
    # Always draw, so that the random stream does not depend on epsilon == 0.
    if self._rng.random() < self._epsilon:
      return int(self._rng.integers(self._num_actions))
    return int(action)


class _StatelessController:
  """A controller whose action depends on the current observation only."""

  def begin_episode(self, observation):
    return self.act(observation)

  def step(self, reward, observation):
    del reward
    return self.act(observation)  # Each controller defines act.


class CartPoleController(_StatelessController):
  """Pushes the cart toward the side the pole is falling to.

  A linear rule on (x, x_dot, theta, theta_dot): the angle and angular
  velocity terms balance the pole (push right when it leans or turns right);
  the small position terms keep the cart from drifting off the track. With
  epsilon = 0.1 it balances for thousands of steps; a random policy drops the
  pole after about 20.
  """

  GAINS = np.array([0.05, 0.1, 1.0, 0.5])

  def act(self, observation: np.ndarray) -> int:
    state = np.asarray(observation, dtype=np.float64).reshape(-1)
    return int(self.GAINS @ state > 0.0)


def _action_index(action_meanings, name, game: str):
  try:
    return action_meanings.index(name)
  except ValueError:
    raise ValueError(
      f'{game} has no {name} action (actions: {action_meanings})'
    ) from None


def _background(region):
  """The most common pixel value of a uint8 region."""
  return np.bincount(region.ravel(), minlength=256).argmax()


class PongController(_StatelessController):
  """Moves the right (player's) paddle toward the ball's row.

  Works on Dopamine's (84, 84) frames: the playing field spans rows 14-76,
  the player's paddle columns 72-76, the opponent's columns 8-10. Pixels that
  differ from the field's background are paddle or ball. Without a ball in
  sight the paddle returns to the middle. In Pong RIGHT moves the paddle up
  and LEFT moves it down.
  """

  _FIELD_ROWS = slice(14, 77)
  _PADDLE_COLUMNS = slice(72, 77)
  _BALL_COLUMNS = slice(11, 72)
  _DEAD_ZONE = 2.0  # Rows; avoids jitter around the target.

  def __init__(self, action_meanings: list[str]) -> None:
    self._noop = _action_index(action_meanings, 'NOOP', 'Pong')
    self._up = _action_index(action_meanings, 'RIGHT', 'Pong')
    self._down = _action_index(action_meanings, 'LEFT', 'Pong')

  def act(self, observation: np.ndarray) -> int:
    field = np.asarray(observation)[self._FIELD_ROWS, :, ...]
    field = field.reshape(field.shape[0], field.shape[1])
    background = _background(field)
    paddle_rows = np.flatnonzero(
      (field[:, self._PADDLE_COLUMNS] != background).any(axis=1)
    )
    if not paddle_rows.size:
      return self._noop
    ball_rows = np.flatnonzero(
      (field[:, self._BALL_COLUMNS] != background).any(axis=1)
    )
    target = ball_rows.mean() if ball_rows.size else field.shape[0] / 2
    paddle = paddle_rows.mean()
    if target < paddle - self._DEAD_ZONE:
      return self._up
    if target > paddle + self._DEAD_ZONE:
      return self._down
    return self._noop


class BreakoutController(_StatelessController):
  """Moves the paddle under the ball; FIRE launches a new ball.

  Works on Dopamine's (84, 84) frames: the paddle is in rows 75-77 and the
  open space between the bricks and the paddle is rows 38-74, between the
  side walls (columns 5-78). The background is black.
  """

  _PADDLE_ROWS = slice(75, 78)
  _BALL_ROWS = slice(38, 75)
  _COLUMNS = slice(5, 79)
  _DEAD_ZONE = 2.0  # Columns.

  def __init__(self, action_meanings: list[str]) -> None:
    self._noop = _action_index(action_meanings, 'NOOP', 'Breakout')
    self._fire = _action_index(action_meanings, 'FIRE', 'Breakout')
    self._right = _action_index(action_meanings, 'RIGHT', 'Breakout')
    self._left = _action_index(action_meanings, 'LEFT', 'Breakout')

  def act(self, observation: np.ndarray) -> int:
    frame = np.asarray(observation)
    frame = frame.reshape(frame.shape[0], frame.shape[1])
    paddle_columns = np.flatnonzero(
      frame[self._PADDLE_ROWS, self._COLUMNS].any(axis=0)
    )
    ball_columns = np.flatnonzero(
      frame[self._BALL_ROWS, self._COLUMNS].any(axis=0)
    )
    if not ball_columns.size or not paddle_columns.size:
      # No ball in play (start of game or after a lost life): launch one.
      return self._fire
    ball, paddle = ball_columns.mean(), paddle_columns.mean()
    if ball > paddle + self._DEAD_ZONE:
      return self._right
    if ball < paddle - self._DEAD_ZONE:
      return self._left
    return self._noop


SCRIPTED_ATARI_GAMES = {'Pong': PongController, 'Breakout': BreakoutController}


def make_scripted_policy(
  environment: str,
  game: str | None = None,
  action_meanings: list[str] | None = None,
) -> Any:
  """Returns the scripted controller for an environment.

  Args:
    environment: str, 'atari' or 'cartpole'.
    game: str, the Atari game (ignored for CartPole).
    action_meanings: list of str, the Atari game's action names in action
      index order (`env.unwrapped.get_action_meanings()`).

  Returns:
    A policy with begin_episode/step.

  Raises:
    ValueError: for a game without a scripted controller.
  """
  if environment == 'cartpole':
    return CartPoleController()
  if environment == 'atari' and game in SCRIPTED_ATARI_GAMES:
    return SCRIPTED_ATARI_GAMES[game](list(action_meanings))
  raise ValueError(
    f'no scripted policy for {environment} game {game!r}; supported: '
    f'CartPole and the Atari games {sorted(SCRIPTED_ATARI_GAMES)} (use '
    'policy=random or policy=agent for other games)'
  )


class AgentPolicy:
  """The greedy action of a Dopamine agent (TF or JAX) in evaluation mode.

  Evaluation mode stops the agent from storing transitions and training;
  epsilon_eval = 0 makes it act greedily, so exploration comes only from the
  EpsilonGreedyPolicy around it (and is seeded by fixed_replay). The agent
  still keeps its own frame stack from the observations it is given.
  """

  def __init__(self, agent: Any) -> None:
    self._agent = agent
    agent.eval_mode = True
    agent.epsilon_eval = 0.0

  @property
  def agent(self) -> Any:
    return self._agent

  def begin_episode(self, observation: np.ndarray) -> int:
    return int(self._agent.begin_episode(observation))

  def step(self, reward: float, observation: np.ndarray) -> int:
    return int(self._agent.step(reward, observation))


def load_agent(
  checkpoint_dir,
  environment,
  agent_name='dqn',
  gin_files=(),
  gin_bindings=(),
  iteration=None,
):
  """Restores a Dopamine agent from the checkpoints written by its Runner.

  The agent is built like Dopamine's `run_experiment.create_agent` (after
  loading the gin files and bindings the agent was trained with) and restored
  with `Checkpointer.load_checkpoint` + `agent.unbundle`, as the Runner does
  when it resumes. TF agents get their own graph so that several can live in
  one process. Note that `unbundle` also loads the agent's replay buffer (as
  Dopamine does when resuming): about 7 GB for an Atari agent with the default
  1M-transition buffer.

  Args:
    checkpoint_dir: str, the Runner's base_dir or its checkpoints/ directory.
    environment: the Dopamine environment the agent will act in.
    agent_name: str, a name `run_experiment.create_agent` accepts ('dqn',
      'rainbow', 'implicit_quantile', 'jax_dqn', ...).
    gin_files: sequence of gin config files.
    gin_bindings: sequence of gin binding strings.
    iteration: int or None, the checkpoint iteration (None: the latest).

  Returns:
    The restored agent.

  Raises:
    CheckpointError: if no checkpoint is found or the agent cannot be
      restored from it.
  """
  # Dopamine (and TensorFlow) only when an agent is asked for.
  from dopamine.discrete_domains import checkpointer
  from dopamine.discrete_domains import run_experiment
  import gin
  import tensorflow as tf

  from fixed_replay import gin_files as gin_files_lib
  from fixed_replay.training import agent_contract

  directory, latest = agent_contract.latest_agent_checkpoint(checkpoint_dir)
  iteration = latest if iteration is None else iteration
  # Unlocked: the caller may already have parsed (and so locked) a config,
  # e.g. when the agent was trained in this process.
  with gin.unlock_config():
    gin_files_lib.load_gin_configs(list(gin_files), list(gin_bindings))
  with tf.Graph().as_default():
    agent = run_experiment.create_agent(
      None, environment, agent_name=agent_name
    )
    bundle = checkpointer.Checkpointer(directory).load_checkpoint(iteration)
    if bundle is None:
      raise CheckpointError(
        directory, f'no agent checkpoint ckpt.{iteration} to restore'
      )
    hint = (
      f'{agent_name} agent could not be restored from iteration {iteration}'
      ' (are its network and replay files complete, and do the gin files '
      'match the ones it was trained with?)'
    )
    try:
      restored = agent.unbundle(directory, iteration, bundle)
    except (tf.errors.OpError, ValueError, KeyError) as error:
      raise CheckpointError(directory, f'{hint}: {error}') from error
    if not restored:
      raise CheckpointError(directory, hint)
  return agent
