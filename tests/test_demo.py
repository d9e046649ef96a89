"""The main job (`fixed-replay demo`) end to end, small."""

import os
import subprocess
import sys


def _demo(output_dir, *flags):
  return subprocess.run(
    [
      sys.executable,
      '-m',
      'fixed_replay.cli',
      'demo',
      f'--output_dir={output_dir}',
      '--checkpoint_rows=400',
      *flags,
    ],
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )


def test_demo_generates_verifies_and_samples(tmp_path):
  result = _demo(tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  assert '2/2 complete' in result.stdout
  assert 'verified' in result.stdout
  assert 'minibatches of (32, 84, 84, 4)' in result.stdout
  # Offline training ran, was evaluated, tabulated and plotted.
  table = result.stdout[result.stdout.index('dqn on Pong, offline:') :]
  assert (
    len(
      [
        line
        for line in table.splitlines()
        if line.strip().startswith(('0 ', '1 '))
      ]
    )
    == 2
  )
  plot = tmp_path / 'eval_returns.png'
  assert plot.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  assert (tmp_path / 'dqn_run' / 'checkpoints').is_dir()
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
