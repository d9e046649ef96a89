"""Which game a run evaluates in: the data's own, unless asked for another.

The configs in configs/ (like batch_rl's) bind
`atari_lib.create_atari_environment.game_name = 'Pong'`, so training on
Asterix data with them used to evaluate in Pong, silently. The rule:

1. A game bound by a gin binding (`--gin_bindings`, which `sweep --games`
   also uses) is played, as asked; if the data is another game's, a warning
   says so.
2. Otherwise the data's game, where its path or store names it (see
   dataset/layout.py), is played, even if a gin file binds another; a
   warning names the file's game and how to play it instead (rule 1).
3. Otherwise the gin files' game; with none at all, an error says how to
   bind one.

Only Dopamine's Atari environment has a game to choose; other environments
(CartPole, ...) are left as configured.
"""

import re

from absl import logging
import gin

from fixed_replay import gin_files as gin_files_lib
from fixed_replay.errors import UsageError

GAME_PARAMETER = 'atari_lib.create_atari_environment.game_name'
_GAME_BINDING = re.compile(r'(^|[./])create_atari_environment\.game_name\s*=')
_ENVIRONMENT_PARAMETERS = (
  'FixedReplayRunner.create_environment_fn',
  'Runner.create_environment_fn',
)


def _bound(parameter):
  try:
    return gin.query_parameter(parameter)
  except ValueError:
    return None


def bound_game() -> str | None:
  """The game the parsed config binds, or None."""
  return _bound(GAME_PARAMETER)


def plays_atari() -> bool:
  """Whether the parsed config evaluates in Dopamine's Atari environment."""
  for parameter in _ENVIRONMENT_PARAMETERS:
    value = _bound(parameter)
    if value is not None:
      return 'create_atari_environment' in str(
        getattr(value, 'selector', value)
      )
  return True  # Dopamine's Runner default.


def is_atari_game(name: str) -> bool:
  """Whether ALE knows the game Dopamine calls `name` ('MsPacman', ...)."""
  import ale_py.roms

  rom_id = re.sub(r'(?<!^)(?=[A-Z])', '_', name).lower()
  return rom_id in ale_py.roms.get_all_rom_ids()


def choose(data_game, data_dir, file_game, binding_game):
  """The game to evaluate in, by the module docstring's rule; logs it.

  Args:
    data_game: str or None, the data's game.
    data_dir: str, the data (for messages).
    file_game: str or None, the game the gin files bind.
    binding_game: str or None, the game the gin bindings bind.

  Returns:
    str, the game.

  Raises:
    UsageError: if no game is known at all.
  """
  if data_game is not None and not is_atari_game(data_game):
    data_game = None  # A directory named like a game, but no Atari game.
  if binding_game is not None:
    if data_game is not None and data_game != binding_game:
      logging.warning(
        'Evaluating in %s, as the gin bindings ask, but the data %s is %s',
        binding_game,
        data_dir,
        data_game,
      )
    else:
      logging.info('Evaluating in %s (gin bindings)', binding_game)
    return binding_game
  if data_game is not None:
    if file_game is not None and file_game != data_game:
      logging.warning(
        "Evaluating in %s, the data's game (%s), not in %s, which the gin "
        'files bind: to play %s, pass --gin_bindings="%s = \'%s\'"',
        data_game,
        data_dir,
        file_game,
        file_game,
        GAME_PARAMETER,
        file_game,
      )
    else:
      logging.info("Evaluating in %s, the data's game", data_game)
    return data_game
  if file_game is not None:
    logging.info('Evaluating in %s (gin files)', file_game)
    return file_game
  raise UsageError(
    f'no game to evaluate in: neither the data ({data_dir}) nor the config '
    f'names one; pass --gin_bindings="{GAME_PARAMETER} = \'Pong\'" (the '
    "game's name as Dopamine spells it)"
  )


def parse_configs(dataset, gin_files, gin_bindings):
  """Parses and locks the configs, binding the game `choose` picks.

  Args:
    dataset: layout.Layout, the data trained on.
    gin_files: sequence of gin files.
    gin_bindings: sequence of gin bindings, applied after the files.

  Returns:
    str, the Atari game evaluated in, or None for another environment.
  """
  gin_files_lib.load_gin_configs(list(gin_files), [], finalize_config=False)
  file_game = bound_game()
  gin_files_lib.load_gin_configs([], list(gin_bindings), finalize_config=False)
  if plays_atari():
    binds_game = any(_GAME_BINDING.search(b.strip()) for b in gin_bindings)
    game = choose(
      dataset.game,
      dataset.data_dir,
      file_game,
      bound_game() if binds_game else None,
    )
    gin.bind_parameter(GAME_PARAMETER, game)
  else:
    game = None
  gin.finalize()
  return game
