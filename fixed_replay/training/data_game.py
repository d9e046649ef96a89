"""Which game a run evaluates in: the data's own, unless asked for another.

The configs in configs/ (like batch_rl's) bind
`atari_lib.create_atari_environment.game_name = 'Pong'`, so training on
Asterix data with them used to evaluate in Pong, silently. The rule:

1. A game bound by a gin binding (`--gin_bindings`, which `sweep --games`
   also uses) is played, as asked; if the data is another game's, a warning
   says so.
2. Otherwise the data's game, where its path or store names it (see
   sources/layout.py), is played, even if a gin file binds another; a
   warning names the file's game and how to play it instead (rule 1).
3. Otherwise the gin files' game; with none at all, an error says how to
   bind one.

Only Dopamine's Atari environment has a game to choose; other environments
(CartPole, ...) are left as configured. Whatever the game, data whose actions
it lacks is refused before the agent loads anything (`checking_actions`).
"""

import functools
import re

from absl import logging
import gin

from fixed_replay import gin_files as gin_files_lib
from fixed_replay.errors import CheckpointError
from fixed_replay.errors import UsageError
from fixed_replay.sources import ale_games

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
  if data_game is not None and not ale_games.is_atari_game(data_game):
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
  game = None
  if plays_atari():
    binds_game = any(_GAME_BINDING.search(b.strip()) for b in gin_bindings)
    game = choose(
      dataset.game,
      dataset.data_dir,
      file_game,
      bound_game() if binds_game else None,
    )
    gin.bind_parameter(GAME_PARAMETER, game)
  gin.finalize()
  return game


def largest_action(dataset):
  """The largest action a dataset holds (every complete checkpoint).

  Reads only the action arrays: for Dopamine's files each
  `$store$_action_ckpt.N.gz` (about 1 MB compressed per million rows), for a
  store its memory-mapped action arrays.

  Args:
    dataset: layout.Layout, trainable.

  Returns:
    (int, str): the largest action and the file holding it.
  """
  from fixed_replay.io import npy_stream
  from fixed_replay.sources import layout
  from fixed_replay.sources.dopamine import checkpoints
  from fixed_replay.store import compact_store
  from fixed_replay.store import manifest as manifest_lib

  # Rows past add_count of a buffer that never filled were never written
  # (Dopamine saves them uninitialised): only the rows below it count.
  largest, where = -1, dataset.data_dir
  if dataset.kind is layout.Kind.STORE:
    stored = manifest_lib.find_stored_checkpoints(dataset.data_dir)
    for directory in stored.values():
      checkpoint = compact_store.StoredCheckpoint(directory)
      actions = checkpoint.arrays['action'][: checkpoint.add_count]
      if len(actions) and int(actions.max()) > largest:
        largest, where = int(actions.max()), directory
      checkpoint.close()
    return largest, where
  for files in checkpoints.find_checkpoints(dataset.data_dir).values():
    add_count = int(npy_stream.read_rows(files.add_count_path))
    path = files.store_paths['action']
    actions = npy_stream.read_rows(path)[:add_count]
    if actions.size and int(actions.max()) > largest:
      largest, where = int(actions.max()), path
  return largest, where


def check_actions(dataset, num_actions, game):
  """Raises CheckpointError if the data acts outside the action space.

  Args:
    dataset: layout.Layout, the data trained on.
    num_actions: int, the evaluation environment's number of actions.
    game: str or None, the game evaluated in (None: not Atari).

  Raises:
    CheckpointError: naming the dataset, its largest action and the game.
  """
  largest, where = largest_action(dataset)
  if largest >= num_actions:
    played = game or 'the evaluation environment'
    raise CheckpointError(
      dataset.path,
      f'its actions reach {largest} ({where}), but {played} has '
      f'{num_actions} actions (0 to {num_actions - 1}): the data is of '
      'another game; evaluate in its game (see --gin_bindings '
      '"atari_lib.create_atari_environment.game_name = \'...\'")',
    )
  logging.info(
    'Actions of the data: 0 to %d, within the %d of %s',
    largest,
    num_actions,
    game or 'the environment',
  )


def checking_actions(create_agent_fn, dataset, game):
  """create_agent_fn, checking the data's actions against the environment."""

  @functools.wraps(create_agent_fn)
  def create_agent(sess, environment, **kwargs):
    check_actions(dataset, environment.action_space.n, game)
    return create_agent_fn(sess, environment, **kwargs)

  return create_agent
