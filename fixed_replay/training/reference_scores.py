"""Published reference scores for Atari: random, human and online DQN.

Normalized scores put an agent's return between two references of the same
game. The REM paper (Agarwal et al., ICML 2020) reports
100 * (agent - random) / (online DQN - random); the human-normalized score of
the DQN literature is 100 * (agent - random) / (human - random).

Sources, per column of `_SCORES`:

* random and human: DeepMind's DQN Zoo, `dqn_zoo/atari_data.py`
  (github.com/google-deepmind/dqn_zoo, commit 359945dcb6f6a04f16e380b210c4f
  22b57681905), the Atari-57 table of a uniformly random agent and a
  professional human game tester. Its docstring: episodes start after 1-30
  no-op actions, are capped at 108,000 frames, and each score averages at
  least 3 episodes. It has no entry for AirRaid, Carnival, ElevatorAction,
  JourneyEscape and Pooyan (in the DQN Replay Dataset, not in Atari-57).
* online DQN: Dopamine's published DQN baseline (github.com/google/dopamine,
  `baselines/atari/data/<game>.json`, commit 8842298e89cfe42c80ea71f63913017
  696785f0f), the agent family and protocol that logged the DQN Replay
  Dataset (Nature DQN, sticky actions, 200 iterations). The value is the mean
  over its 5 runs of the last iteration's average return (iteration 198,
  agent "DQN"), rounded to 0.1; e.g. for Pong:
    runs = [x['Value'] for x in json.load(open('pong.json'))
            if x['Agent'] == 'DQN' and x['Iteration'] == 198]
    round(sum(runs) / len(runs), 1)  # 16.6
  The REM paper's own per-game table of online DQN could not be read from
  here, so normalized medians may differ slightly from the paper's.

The references were measured under different protocols (no-op starts for
random and human, sticky actions for DQN and for `fixed-replay train`), as in
the papers that use them.
"""

import dataclasses
import re

# Game (ALE name): (random, human, online DQN); None where the source has no
# score.
_SCORES = {
  'AirRaid': (None, None, 7479.5),
  'Alien': (227.8, 7127.7, 2484.5),
  'Amidar': (5.8, 1719.5, 1207.7),
  'Assault': (222.4, 742.0, 1525.2),
  'Asterix': (210.0, 8503.3, 2711.4),
  'Asteroids': (719.1, 47388.7, 698.4),
  'Atlantis': (12850.0, 29028.1, 853640.0),
  'BankHeist': (14.2, 753.1, 601.8),
  'BattleZone': (2360.0, 37187.5, 17784.8),
  'BeamRider': (363.9, 16926.5, 5852.4),
  'Berzerk': (123.7, 2630.4, 487.5),
  'Bowling': (23.1, 160.7, 30.1),
  'Boxing': (0.1, 12.1, 78.0),
  'Breakout': (1.7, 30.5, 96.2),
  'Carnival': (None, None, 4784.8),
  'Centipede': (2090.9, 12017.0, 2583.0),
  'ChopperCommand': (811.0, 7387.8, 2690.6),
  'CrazyClimber': (10780.5, 35829.4, 104568.8),
  'Defender': (2874.5, 18688.9, None),
  'DemonAttack': (152.1, 1971.0, 6361.6),
  'DoubleDunk': (-18.6, -16.4, -6.5),
  'ElevatorAction': (None, None, 439.8),
  'Enduro': (0.0, 860.5, 628.9),
  'FishingDerby': (-91.7, -38.7, 0.6),
  'Freeway': (0.0, 29.6, 26.3),
  'Frostbite': (65.2, 4334.7, 367.1),
  'Gopher': (257.6, 2412.5, 5479.9),
  'Gravitar': (173.0, 3351.4, 330.1),
  'Hero': (1027.0, 30826.4, 17325.4),
  'IceHockey': (-11.2, 0.9, -5.8),
  'Jamesbond': (29.0, 302.8, 573.3),
  'JourneyEscape': (None, None, -3671.1),
  'Kangaroo': (52.0, 3035.0, 11486.0),
  'Krull': (1598.0, 2665.5, 6097.6),
  'KungFuMaster': (258.5, 22736.3, 23435.4),
  'MontezumaRevenge': (0.0, 4753.3, 0.0),
  'MsPacman': (307.3, 6951.6, 3402.4),
  'NameThisGame': (2292.3, 8049.0, 7278.7),
  'Phoenix': (761.4, 7242.6, 4996.6),
  'Pitfall': (-229.4, 6463.7, -73.8),
  'Pong': (-20.7, 14.6, 16.6),
  'Pooyan': (None, None, 3212.0),
  'PrivateEye': (24.9, 69571.3, -16.0),
  'Qbert': (163.9, 13455.0, 10117.5),
  'Riverraid': (1338.5, 17118.0, 11638.9),
  'RoadRunner': (11.5, 7845.0, 36925.5),
  'Robotank': (2.2, 11.9, 59.8),
  'Seaquest': (68.4, 42054.7, 1600.7),
  'Skiing': (-17098.1, -4336.9, -15824.6),
  'Solaris': (1236.3, 12326.7, 1436.4),
  'SpaceInvaders': (148.0, 1668.7, 1794.2),
  'StarGunner': (664.0, 10250.0, 42165.2),
  'Surround': (-10.0, 6.5, None),
  'Tennis': (-23.8, -8.3, -1.5),
  'TimePilot': (3568.0, 5229.2, 3654.4),
  'Tutankham': (11.4, 167.6, 103.8),
  'UpNDown': (533.4, 11693.2, 8488.3),
  'Venture': (0.0, 1187.5, 39.1),
  'VideoPinball': (16256.9, 17667.9, 63406.1),
  'WizardOfWor': (563.5, 4756.5, 2065.8),
  'YarsRevenge': (3092.9, 54576.9, 23909.4),
  'Zaxxon': (32.5, 9173.3, 4538.6),
}


@dataclasses.dataclass(frozen=True)
class References:
  """A game's reference returns; None where no published score exists."""

  game: str
  random: float | None
  human: float | None
  online_dqn: float | None


def _key(game: str):
  """'MsPacman', 'ms_pacman' and 'mspacman' name the same game."""
  return re.sub(r'[^a-z0-9]', '', str(game).lower())


_BY_KEY = {_key(name): name for name in _SCORES}


def references(game: str) -> 'References | None':
  """Returns the References of a game, or None if it has no entry."""
  name = _BY_KEY.get(_key(game))
  return None if name is None else References(name, *_SCORES[name])


# What a normalized score divides by, the name it has in messages, and why
# a game may lack it.
_TOPS = {
  'online_dqn': (
    'online DQN',
    "no online DQN score for {game} (not among the DQN Replay Dataset's 60 "
    'games)',
  ),
  'human': ('human', 'no published human score for {game}'),
}


def _normalized(game: str, score, top):
  """100 (score - random) / (top - random), or None and why it is missing."""
  found = references(game)
  if found is None:
    return None, f'no reference scores for {game} (not an Atari game)'
  if found.random is None:
    return None, f'no published random score for {found.game}'
  name, missing = _TOPS[top]
  high = getattr(found, top)
  if high is None:
    return None, missing.format(game=found.game)
  if high <= found.random:
    return None, (
      f'{name} ({high:g}) does not beat random ({found.random:g}) on '
      f'{found.game}'
    )
  return 100.0 * (score - found.random) / (high - found.random), ''


def dqn_normalized(game: str, score: float | None) -> tuple[float | None, str]:
  """REM paper's score in %: 100 (score - random) / (online DQN - random).

  Returns:
    (float or None, str): the score, or None and the reason it is missing.
  """
  return _normalized(game, score, 'online_dqn')


def human_normalized(
  game: str, score: float | None
) -> tuple[float | None, str]:
  """Human-normalized score in %: 100 (score - random) / (human - random).

  Returns:
    (float or None, str): the score, or None and the reason it is missing.
  """
  return _normalized(game, score, 'human')
