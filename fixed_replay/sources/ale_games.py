"""ALE's games and their action sets, asked of ale-py itself.

The DQN Replay Dataset stores each game's actions as indices into that
game's *minimal* action set (Pong has 6, Breakout 4, MsPacman 9), in the
order ALE lists them. A model that plays many games acts in ALE's full set
of 18 instead. The map between the two is ALE's own minimal action set for
the game's ROM, read here from ale-py rather than typed in: a hand-typed
table is one more place for a wrong game to hide.

Dopamine names a game 'MsPacman'; ale-py's ROM id is 'ms_pacman'.
"""

import functools
import re

import numpy as np

# ALE's full action set: NOOP, FIRE, UP, ..., DOWNLEFTFIRE.
FULL_ACTIONS = 18


def rom_id(game: str) -> str:
  """ale-py's ROM id of the game Dopamine calls `game` ('MsPacman', ...)."""
  return re.sub(r'(?<!^)(?=[A-Z])', '_', game).lower()


def is_atari_game(game: str) -> bool:
  """Whether ALE knows the game Dopamine calls `game`."""
  import ale_py.roms

  return rom_id(game) in ale_py.roms.get_all_rom_ids()


@functools.cache
def minimal_action_set(game: str) -> np.ndarray:
  """The full-set index (0-17) of each of `game`'s minimal actions, in order.

  Raises:
    ValueError: if ALE does not know the game.
  """
  if not is_atari_game(game):
    raise ValueError(f'{game!r} is not a game ALE knows')
  import ale_py
  import ale_py.roms

  ale = ale_py.ALEInterface()
  ale.setLoggerMode(ale_py.LoggerMode.Error)
  ale.loadROM(ale_py.roms.get_rom_path(rom_id(game)))
  actions = np.array([int(a) for a in ale.getMinimalActionSet()], np.int64)
  actions.setflags(write=False)
  return actions
