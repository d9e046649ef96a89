"""The environments `generate` plays, and how their observations are stored.

Dopamine's own wrappers: atari_lib's AtariPreprocessing ((84, 84) uint8
frames, stack 4) and gym_lib's CartPole ((4, 1) float64, stack 1). Dopamine
(and with it TensorFlow) is imported inside create_environment, so that
importing this module is fast.
"""

import dataclasses
from typing import Any

import numpy as np

ENVIRONMENTS = ('atari', 'cartpole')
# Dopamine's Runner default and the published data's cut (27k agent steps =
# 108k frames; ALE's v5 games end at 100k frames first, as terminal).
ATARI_MAX_STEPS_PER_EPISODE = 27000
# Runner.max_steps_per_episode in Dopamine's CartPole gin configs.
CARTPOLE_MAX_STEPS_PER_EPISODE = 200


@dataclasses.dataclass(frozen=True)
class EnvironmentSpec:
  """How one environment's observations are stored.

  Attributes:
    observation_shape: tuple, shape of one stored observation.
    observation_dtype: numpy dtype of the stored observations.
    stack_size: int, frames per state (Dopamine pads stack_size - 1 rows).
    max_steps_per_episode: int, default episode cut.
  """

  observation_shape: tuple
  observation_dtype: type
  stack_size: int
  max_steps_per_episode: int


# Dopamine's NATURE_DQN_* and gym_lib.CARTPOLE_* gin constants.
ENVIRONMENT_SPECS = {
  'atari': EnvironmentSpec((84, 84), np.uint8, 4, ATARI_MAX_STEPS_PER_EPISODE),
  'cartpole': EnvironmentSpec(
    (4, 1), np.float64, 1, CARTPOLE_MAX_STEPS_PER_EPISODE
  ),
}


def create_environment(
  environment: str, game: str = 'Pong', sticky_actions: bool = True
) -> Any:
  """Creates a Dopamine environment.

  Args:
    environment: str, 'atari' or 'cartpole'.
    game: str, Atari game name (ignored for CartPole).
    sticky_actions: bool, Machado et al.'s sticky actions (Atari only).

  Returns:
    Dopamine's AtariPreprocessing or GymPreprocessing environment.
  """
  if environment == 'atari':
    from dopamine.discrete_domains import atari_lib

    return atari_lib.create_atari_environment(
      game, sticky_actions=sticky_actions
    )
  from dopamine.discrete_domains import gym_lib

  # CartPole-v0's 200-step time limit is not a terminal in Dopamine's wrapper
  # (game_over = terminated and not truncated); max_steps_per_episode cuts.
  return gym_lib.create_gym_environment('CartPole', 'v0')


def action_meanings(env: Any) -> list[str]:
  """The Atari action names of a Dopamine Atari environment."""
  return list(env.environment.unwrapped.get_action_meanings())
