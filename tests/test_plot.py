"""`fixed-replay plot`: evaluation returns read from Dopamine's log files."""

# ruff: noqa: I001  (fixed_replay must be imported before Dopamine)
import os
import subprocess
import sys

import fixed_replay  # noqa: F401
from dopamine.discrete_domains import logger
import numpy as np
import pytest

from fixed_replay.training import plotting

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


def write_logs(base_dir, returns, first_iteration=0):
  """Logs iterations the way the runner does, through Dopamine's Logger.

  Dopamine's Logger keeps the last 4 files, each holding every iteration.
  """
  log = logger.Logger(os.path.join(base_dir, 'logs'))
  for offset, value in enumerate(returns):
    iteration = first_iteration + offset
    log[f'iteration_{iteration}'] = {
      'eval_episode_returns': [value - 1.0, value + 1.0],
      'eval_average_return': [value],
    }
    log.log_to_file('log', iteration)
  return base_dir


@pytest.fixture
def runs(tmp_path):
  pong = write_logs(tmp_path / 'dqn_pong', [-21.0, -20.0, -18.5, -15.0, -9.0])
  rem = write_logs(tmp_path / 'rem_pong', [-21.0, -19.0, -12.0])
  return [pong, rem]


def test_load_eval_returns_reads_every_iteration(runs):
  iterations, returns = plotting.load_eval_returns(runs[0])
  np.testing.assert_array_equal(iterations, [0, 1, 2, 3, 4])
  np.testing.assert_array_equal(returns, [-21.0, -20.0, -18.5, -15.0, -9.0])
  # The logger deleted log_0: later files carry all iterations.
  assert not os.path.exists(runs[0] / 'logs' / 'log_0')
  # A logs/ folder may be given directly.
  iterations, _ = plotting.load_eval_returns(runs[1] / 'logs')
  np.testing.assert_array_equal(iterations, [0, 1, 2])


def test_truncated_newest_log_falls_back_to_older_ones(runs):
  newest = runs[0] / 'logs' / 'log_4'
  newest.write_bytes(newest.read_bytes()[:20])
  iterations, returns = plotting.load_eval_returns(runs[0])
  np.testing.assert_array_equal(iterations, [0, 1, 2, 3])
  assert returns[-1] == -15.0


def test_returns_fall_back_to_episode_returns(tmp_path):
  log = logger.Logger(str(tmp_path / 'run' / 'logs'))
  log['iteration_0'] = {'eval_episode_returns': [1.0, 2.0, 6.0]}
  log.log_to_file('log', 0)
  _, returns = plotting.load_eval_returns(tmp_path / 'run')
  assert returns.tolist() == [3.0]


def test_missing_logs_name_the_directory(tmp_path):
  with pytest.raises(ValueError, match='no log files') as error:
    plotting.load_eval_returns(tmp_path)
  assert str(tmp_path) in str(error.value)


def test_plot_writes_a_png_with_one_line_per_run(runs, tmp_path):
  pytest.importorskip('matplotlib')
  output = tmp_path / 'plot.png'
  curves = plotting.plot_eval_returns(runs, output, title='Pong')
  assert [c.label for c in curves] == ['dqn_pong', 'rem_pong']
  assert output.read_bytes()[:8] == PNG_MAGIC
  figure = plotting.make_figure(curves)
  lines = figure.axes[0].get_lines()
  assert len(lines) == 2
  assert [line.get_label() for line in lines] == ['dqn_pong', 'rem_pong']
  np.testing.assert_array_equal(lines[1].get_ydata(), [-21.0, -19.0, -12.0])
  with pytest.raises(FileExistsError, match='--overwrite'):
    plotting.plot_eval_returns(runs, output)
  plotting.plot_eval_returns(runs[:1], output, overwrite=True)
  assert output.read_bytes()[:8] == PNG_MAGIC


def test_plot_command(runs, tmp_path):
  pytest.importorskip('matplotlib')
  output = tmp_path / 'cli.png'
  result = subprocess.run(
    [sys.executable, '-m', 'fixed_replay.cli', 'plot']
    + [str(r) for r in runs]
    + [f'--output={output}'],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert result.returncode == 0, result.stderr
  assert output.read_bytes()[:8] == PNG_MAGIC
  missing = subprocess.run(
    [sys.executable, '-m', 'fixed_replay.cli', 'plot'],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert missing.returncode != 0
  assert 'run directories' in missing.stderr
