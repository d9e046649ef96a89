"""The rule for the game a run evaluates in (training/data_game.py)."""

import logging

import pytest

from fixed_replay.errors import UsageError
from fixed_replay.sources import ale_games
from fixed_replay.training import data_game


def _choose(caplog, *args):
  caplog.clear()
  with caplog.at_level(logging.INFO):
    game = data_game.choose(*args)
  return game, [r.getMessage() for r in caplog.records]


def test_the_datas_game_wins_over_a_gin_file(caplog):
  game, logged = _choose(caplog, 'Asterix', '/d/Asterix/1', 'Pong', None)
  assert game == 'Asterix'
  assert logged == [
    "Evaluating in Asterix, the data's game (/d/Asterix/1), not in Pong, "
    'which the gin files bind: to play Pong, pass --gin_bindings='
    '"atari_lib.create_atari_environment.game_name = \'Pong\'"'
  ]
  game, logged = _choose(caplog, 'Pong', '/d/Pong/1', 'Pong', None)
  assert (game, logged) == ('Pong', ["Evaluating in Pong, the data's game"])


def test_a_gin_binding_wins_over_the_data_with_a_warning(caplog):
  game, logged = _choose(caplog, 'Asterix', '/d/Asterix/1', 'Pong', 'Pong')
  assert game == 'Pong'
  assert logged == [
    'Evaluating in Pong, as the gin bindings ask, but the data '
    '/d/Asterix/1 is Asterix'
  ]


def test_without_a_data_game_the_config_decides(caplog):
  # 'Data' is named like a game, but ALE has no such game.
  game, logged = _choose(caplog, 'Data', '/d/Data/1', 'Breakout', None)
  assert (game, logged) == ('Breakout', ['Evaluating in Breakout (gin files)'])
  with pytest.raises(UsageError, match='no game to evaluate in'):
    data_game.choose(None, '/d/x', None, None)


def test_atari_games_are_known_by_dopamines_names():
  for name in ('Pong', 'MsPacman', 'BeamRider', 'Asterix'):
    assert ale_games.is_atari_game(name), name
  for name in ('CartPole', 'Data', 'Pongg'):
    assert not ale_games.is_atari_game(name), name
