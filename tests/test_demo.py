"""The main job (examples/demo.py, what ./run.sh runs) end to end, small."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _demo(output_dir, *flags):
  return subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, 'examples', 'demo.py'),
      f'--output_dir={output_dir}',
      '--checkpoint_rows=400',
      '--num_iterations=2',
      '--training_steps=200',
      '--evaluation_steps=200',
      *flags,
    ],
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )


@pytest.mark.slow
def test_demo_generates_verifies_samples_and_learns(tmp_path):
  result = _demo(tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  assert '2/2 complete' in result.stdout
  assert 'verified' in result.stdout
  assert 'minibatches of (32, 84, 84, 4)' in result.stdout
  # Both offline runs were trained, evaluated in the game, tabulated...
  table = result.stdout[result.stdout.index('Offline training, evaluated') :]
  rows = [line.split() for line in table.splitlines()]
  pong = [r for r in rows if r[:2] == ['dqn', 'Pong'] and r[2].isdigit()]
  cartpole = [
    r for r in rows if r[:2] == ['dqn', 'CartPole'] and r[2].isdigit()
  ]
  assert [r[2] for r in pong] == ['0', '1']
  assert [r[2] for r in cartpole] == ['0', '1']
  # ... and offline DQN learned CartPole from random play (episodes of
  # about 22 steps) to near the 200-step cap (the README shows a run).
  data_return = re.search(
    r'dqn CartPole: the data averages ([0-9.]+) per episode; the best '
    r'evaluation of the offline agent averaged ([0-9.]+)',
    result.stdout,
  )
  assert data_return, result.stdout[-2000:]
  assert float(data_return.group(1)) < 40
  assert float(data_return.group(2)) >= 150
  plot = tmp_path / 'eval_returns.png'
  assert plot.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  assert (tmp_path / 'dqn_run' / 'checkpoints').is_dir()
  assert (tmp_path / 'dqn_cartpole_run' / 'checkpoints').is_dir()
  names = os.listdir(tmp_path / 'replay_logs')
  assert sorted(n for n in names if n.endswith('_ckpt.1.gz')) == [
    '$store$_action_ckpt.1.gz',
    '$store$_observation_ckpt.1.gz',
    '$store$_reward_ckpt.1.gz',
    '$store$_terminal_ckpt.1.gz',
    'add_count_ckpt.1.gz',
    'invalid_range_ckpt.1.gz',
  ]
  # A second run reuses the dataset instead of touching it.
  mtimes = {n: os.path.getmtime(tmp_path / 'replay_logs' / n) for n in names}
  again = _demo(tmp_path)
  assert again.returncode == 0, again.stderr[-3000:]
  assert mtimes == {
    n: os.path.getmtime(tmp_path / 'replay_logs' / n) for n in names
  }


def test_demo_refuses_foreign_files(tmp_path):
  (tmp_path / 'replay_logs').mkdir()
  (tmp_path / 'replay_logs' / 'mine.txt').write_text('keep me')
  result = _demo(tmp_path)
  assert result.returncode != 0
  assert 'nothing is overwritten' in result.stderr
  assert (tmp_path / 'replay_logs' / 'mine.txt').read_text() == 'keep me'
