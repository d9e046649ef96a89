"""Roots of many games' runs: ROOT/<Game>/<run>, as the DQN Replay Dataset.

A root is what `ReplayMixture` samples, `convert ROOT DST` converts and
`inspect ROOT` lists. Which runs it holds, and which game each is, is
decided here once: the game a run's data records (a store's manifest) or
else its folder's name, checked against ALE's games.
"""

from collections.abc import Mapping
from collections.abc import Sequence
import dataclasses

from absl import logging

from fixed_replay.errors import CheckpointError
from fixed_replay.io import files as storage
from fixed_replay.sources import ale_games
from fixed_replay.sources import layout

NO_RUNS = (
  'no runs found: expected <game>/<run>/ directories of Dopamine '
  'checkpoints or compact stores (as ROOT/Pong/1)'
)


@dataclasses.dataclass(frozen=True)
class GameRun:
  """One run under a root: its game, its name, where its data is and what
  that holds (layout.py's answer, found once)."""

  game: str
  name: str
  data_dir: str
  detected: layout.Layout


def _run_dirs(root: str) -> list[tuple[str, str, str, layout.Layout]]:
  """[(folder name, run name, run directory, its layout)] of ROOT/<g>/<r>."""
  found, problems = [], []
  for game in sorted(storage.listdir(root)):
    game_dir = storage.join(root, game)
    if game.startswith('.') or not storage.isdir(game_dir):
      continue
    for name in sorted(storage.listdir(game_dir)):
      run_dir = storage.join(game_dir, name)
      if name.startswith('.') or not storage.isdir(run_dir):
        continue
      detected = layout.detect(run_dir)
      if detected.trainable:
        found.append((game, name, run_dir, detected))
      elif detected.kind in (layout.Kind.PARTIAL, layout.Kind.RLU):
        problems.append(f'{run_dir}: {detected.error().problem}')
      else:  # Missing data must not go unnoticed.
        logging.warning('Skipping %s: %s, no run', run_dir, detected.kind.value)
  if problems:
    raise CheckpointError(root, '; '.join(problems))
  if not found:
    raise CheckpointError(root, NO_RUNS)
  return found


def find_runs(
  data: str | Mapping[str, str | Sequence[str]],
  games: Sequence[str] | None = None,
  runs: Sequence[str | int] | None = None,
) -> list[GameRun]:
  """The runs of a root of games, or of a mapping, sorted by game and name.

  A run's game is the one its data records (a store's manifest), else its
  folder's name (or the mapping's key); the two must agree, and ALE must
  know the game. A run folder holding no data is skipped with a warning
  naming it.

  Args:
    data: str, a root laid out as the dataset is (ROOT/Pong/1, ...); or a
      mapping {game: run directory or list of them}.
    games: games to keep, or one game's name (None: all found).
    runs: run names to keep under a root, e.g. [1, 2], or one (None: all).

  Returns:
    list of GameRun.

  Raises:
    CheckpointError: if a root holds no runs, or half-written ones.
    ValueError: if a game asked for is missing, a game is not ALE's, or
      the data records another game than its folder; naming the directories.
  """
  # One game or run may be named alone, as a user means it.
  games = [games] if isinstance(games, str) else games
  runs = [runs] if isinstance(runs, str | int) else runs
  given = isinstance(data, Mapping)
  if given:
    if runs is not None:
      raise ValueError('runs= selects runs under a root; a mapping lists them')
    listed = [
      (game, layout.run_name(d), str(d), layout.detect(str(d)))
      for game, dirs in data.items()
      for d in ([dirs] if isinstance(dirs, str) else dirs)
    ]
  else:
    wanted = None if runs is None else {str(r) for r in runs}
    listed = [
      entry
      for entry in _run_dirs(str(data))
      if wanted is None or entry[1] in wanted
    ]
  chosen, wrong, present = [], [], set()
  for listed_game, name, run_dir, detected in listed:
    recorded = detected.game
    game = recorded or listed_game
    present.add(game)
    if games is not None and game not in games:
      continue
    if recorded not in (None, listed_game):
      wrong.append(f'{run_dir} holds {recorded}, listed as {listed_game}')
    elif not ale_games.is_atari_game(game):
      wrong.append(f'{run_dir}: {game!r} is not a game ALE knows')
    chosen.append(GameRun(game, name, run_dir, detected))
  if wrong:
    raise ValueError('; '.join(wrong))
  missing = sorted(set(games or ()) - {r.game for r in chosen})
  if missing or not chosen:
    raise ValueError(
      f'{data}: no runs of {", ".join(missing) or "any game"} (runs={runs}); '
      f'it holds {", ".join(sorted(present)) or "none"}'
    )
  return sorted(chosen, key=lambda r: (r.game, r.name))


def runs_of_root(root: str, *selection: Sequence | None) -> list | None:
  """find_runs(root, games, runs), or None where the root holds no
  <game>/<run>/ at all (inspect and convert then take it as one run, and
  name what it holds).

  Raises:
    CheckpointError, ValueError: as find_runs, for a root of runs.
  """
  try:
    return find_runs(root, *selection)
  except CheckpointError as error:
    if error.problem != NO_RUNS:
      raise
  return None
