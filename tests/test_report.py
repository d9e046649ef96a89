"""`fixed-replay report`: tables, normalized scores and curves of sweeps."""

# ruff: noqa: I001  (fixed_replay must be imported before Dopamine)
import csv
import os
import subprocess
import sys

import fixed_replay  # noqa: F401
from dopamine.discrete_domains import logger
import numpy as np
import pytest

from fixed_replay.training import reference_scores
from fixed_replay.training import report

PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


def write_trial(base_dir, game, agent, seed, returns, run='1'):
  """Logs a trial's iterations through Dopamine's Logger, as the runner."""
  directory = os.path.join(base_dir, game, run, agent, f'seed_{seed}')
  log = logger.Logger(os.path.join(directory, 'logs'))
  for iteration, value in enumerate(returns):
    log[f'iteration_{iteration}'] = {'eval_average_return': [value]}
    log.log_to_file('log', iteration)
  return directory


@pytest.fixture
def sweep_dir(tmp_path):
  """Pong, Breakout and CartPole trials of two agents with known returns."""
  base = str(tmp_path / 'sweep')
  # Pong: random -20.7, online DQN 16.6, human 14.6.
  write_trial(base, 'Pong', 'dqn', 0, [-21.0, 10.0, -2.05])
  write_trial(base, 'Pong', 'dqn', 1, [-21.0, 20.0, -2.05])
  write_trial(base, 'Pong', 'rem', 0, [-20.0, 16.6])
  # Breakout: random 1.7, online DQN 96.2, human 30.5.
  write_trial(base, 'Breakout', 'dqn', 0, [1.0, 96.2])
  write_trial(base, 'Breakout', 'rem', 0, [2.0, 30.0, 191.2])
  write_trial(base, 'CartPole', 'dqn', 0, [20.0, 200.0, 150.0])
  os.makedirs(os.path.join(base, 'CartPole', '1', 'rem', 'seed_0'))
  return base


def test_reference_scores_cite_and_normalize():
  pong = reference_scores.references('pong')
  assert (pong.game, pong.random, pong.human, pong.online_dqn) == (
    'Pong',
    -20.7,
    14.6,
    16.6,
  )
  assert reference_scores.references('ms_pacman').game == 'MsPacman'
  score, reason = reference_scores.dqn_normalized('Pong', 16.6)
  assert (score, reason) == (pytest.approx(100.0), '')
  assert reference_scores.human_normalized('Pong', -20.7)[0] == 0.0
  # Games the tables do not cover say why instead of guessing.
  assert reference_scores.dqn_normalized('CartPole', 1.0) == (
    None,
    'no reference scores for CartPole (not an Atari game)',
  )
  assert (
    'no published random' in reference_scores.dqn_normalized('Pooyan', 1.0)[1]
  )
  assert (
    'no online DQN score' in reference_scores.dqn_normalized('Defender', 1.0)[1]
  )
  assert reference_scores.human_normalized('Defender', 2874.5)[0] == 0.0
  # Online DQN below random (Asteroids) would flip the scale.
  assert (
    'does not beat random'
    in reference_scores.dqn_normalized('Asteroids', 1.0)[1]
  )


def test_summary_per_game_and_agent(sweep_dir):
  curves, skipped = report.load_curves([sweep_dir])
  assert [os.path.basename(os.path.dirname(p)) for p, _ in skipped] == ['rem']
  rows = {(r.game, r.agent): r for r in report.summarize(curves)}
  pong = rows['Pong', 'dqn']
  assert pong.trials == 2
  assert pong.last_iterations == 3
  assert pong.final_mean == pytest.approx(-2.05)
  assert pong.final_std == pytest.approx(0.0)
  assert pong.best_mean == pytest.approx(15.0)
  assert pong.best_std == pytest.approx(np.std([10.0, 20.0], ddof=1))
  # Halfway between random (-20.7) and online DQN (16.6).
  assert pong.dqn_normalized == pytest.approx(50.0)
  assert pong.human_normalized == pytest.approx(
    100 * (-2.05 + 20.7) / (14.6 + 20.7)
  )
  assert rows['Pong', 'rem'].dqn_normalized == pytest.approx(100.0)
  assert rows['Breakout', 'dqn'].dqn_normalized == pytest.approx(100.0)
  assert rows['Breakout', 'rem'].dqn_normalized == pytest.approx(
    100 * (191.2 - 1.7) / (96.2 - 1.7)
  )
  cartpole = rows['CartPole', 'dqn']
  assert cartpole.final_mean == 150.0 and cartpole.best_mean == 200.0
  assert cartpole.dqn_normalized is None and cartpole.human_normalized is None
  assert 'no reference scores for CartPole' in cartpole.note
  medians = {m[0]: m for m in report.medians(list(rows.values()))}
  # dqn: Pong 50%, Breakout 100% (CartPole has no reference).
  assert medians['dqn'][1:4] == (3, pytest.approx(75.0), 2)
  assert medians['rem'][2] == pytest.approx(
    np.median([100.0, 100 * 189.5 / 94.5])
  )


def test_report_command_writes_tables_and_curves(sweep_dir, tmp_path):
  prefix = str(tmp_path / 'out' / 'pong_breakout')
  os.makedirs(os.path.dirname(prefix))
  command = [
    sys.executable,
    '-m',
    'fixed_replay.cli',
    'report',
    sweep_dir,
    f'--output={prefix}',
  ]
  result = subprocess.run(
    command, capture_output=True, text=True, timeout=300, check=False
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert '| Pong | dqn | 2 | 3 | -2.05 ± 0.00 | 15.00 ± 7.07 | 50.0 |' in (
    result.stdout
  )
  assert '| dqn | 3 | 75.0 (2 games) |' in result.stdout
  with open(prefix + '.csv') as f:
    rows = list(csv.DictReader(f))
  assert [(r['game'], r['agent']) for r in rows] == [
    ('Breakout', 'dqn'),
    ('Breakout', 'rem'),
    ('CartPole', 'dqn'),
    ('Pong', 'dqn'),
    ('Pong', 'rem'),
    ('median', 'dqn'),
    ('median', 'rem'),
  ]
  assert float(rows[3]['dqn_normalized_pct']) == pytest.approx(50.0)
  assert float(rows[5]['dqn_normalized_pct']) == pytest.approx(75.0)
  for game in ('Breakout', 'CartPole', 'Pong'):
    with open(f'{prefix}_{game}.png', 'rb') as f:
      assert f.read(8) == PNG_MAGIC
  # Existing files are kept unless --overwrite.
  again = subprocess.run(
    command, capture_output=True, text=True, timeout=300, check=False
  )
  assert again.returncode != 0
  assert 'pass --overwrite' in again.stderr
  again = subprocess.run(
    command + ['--overwrite'],
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert again.returncode == 0, again.stderr[-3000:]


def test_report_refuses_a_directory_without_trials(tmp_path):
  result = subprocess.run(
    [sys.executable, '-m', 'fixed_replay.cli', 'report', str(tmp_path)],
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert result.returncode != 0
  assert 'no trial directories' in result.stderr
