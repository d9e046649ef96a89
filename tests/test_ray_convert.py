"""`fixed-replay convert --ray`: checkpoints as tasks on a real local Ray.

The stores must be the bytes the local conversion writes; a real failure
(a damaged source file, repaired after the first attempt failed) is retried;
a rerun skips what is stored; no Ray process outlives a test.
"""

import logging
import os
import re
import shutil
import subprocess
import sys
import time

from dopamine_data import content_digests
from dopamine_data import file_digests
import psutil
import pytest

from fixed_replay.convert import convert
from fixed_replay.convert import convert_runners
from fixed_replay.convert import rlu_convert
from fixed_replay.errors import CheckpointError

# One local Ray cluster at a time: these tests share one xdist worker.
pytestmark = pytest.mark.xdist_group('ray')


def _wait_gone(processes, timeout=20.0):
  """The processes still alive after `timeout` seconds (killed then)."""
  deadline = time.monotonic() + timeout
  alive = list(processes)
  while alive and time.monotonic() < deadline:
    alive = [p for p in alive if p.is_running() and not _zombie(p)]
    time.sleep(0.2)
  for process in alive:
    process.kill()
  return alive


def _zombie(process):
  try:
    return process.status() == psutil.STATUS_ZOMBIE
  except psutil.NoSuchProcess:
    return True


# local_ray (conftest) is the session's shared cluster.


@pytest.fixture(scope='module')
def reference(dopamine_dir, tmp_path_factory):
  """conftest's checkpoints converted in this process, without Ray."""
  store = tmp_path_factory.mktemp('reference')
  convert.convert(dopamine_dir[0], store, workers=0)
  return store


def test_ray_store_is_the_local_store_and_a_rerun_skips_it(
  dopamine_dir, reference, local_ray, tmp_path
):
  store = tmp_path / 'store'
  result = convert.convert(dopamine_dir[0], store, ray=local_ray)
  assert result.converted == [0, 1, 3, 7] and not result.skipped
  assert file_digests(store) == file_digests(reference)
  again = convert.convert(dopamine_dir[0], store, ray=local_ray)
  assert again.converted == [] and again.skipped == [0, 1, 3, 7]
  assert file_digests(store) == file_digests(reference)


def _flip_byte(path, fraction=0.6):
  """Damages a gzip file in the middle of its deflate data."""
  with open(path, 'r+b') as stream:
    stream.seek(int(os.path.getsize(path) * fraction))
    byte = stream.read(1)
    stream.seek(-1, os.SEEK_CUR)
    stream.write(bytes([byte[0] ^ 0xFF]))


class _RepairAfterFirstFailure(logging.Handler):
  """Puts the undamaged file back once the first attempt's failure is logged.

  run_tasks logs a failed attempt before it submits the next one, so the
  second attempt reads the repaired file.
  """

  def __init__(self, damaged, undamaged):
    super().__init__()
    self._damaged, self._undamaged = damaged, undamaged
    self.failures = []

  def emit(self, record):
    message = record.getMessage()
    if 'failed (attempt 1 of' in message:
      self.failures.append(message)
      shutil.copyfile(self._undamaged, self._damaged)


def test_a_failed_task_is_retried(dopamine_dir, reference, local_ray, tmp_path):
  source = tmp_path / 'run'
  shutil.copytree(dopamine_dir[0], source)
  damaged = source / '$store$_observation_ckpt.1.gz'
  _flip_byte(damaged)
  repair = _RepairAfterFirstFailure(damaged, dopamine_dir[0] / damaged.name)
  logger = logging.getLogger('absl')
  logger.addHandler(repair)
  try:
    result = convert.convert(source, tmp_path / 'store', ray=local_ray)
  finally:
    logger.removeHandler(repair)
  assert len(repair.failures) == 1, repair.failures
  assert 'checkpoint_1' in repair.failures[0]
  assert '$store$_observation_ckpt.1.gz' in repair.failures[0]
  assert result.converted == [0, 1, 3, 7]
  # The run's dictionary was trained without the damaged checkpoint.
  assert content_digests(tmp_path / 'store') == content_digests(reference)


def test_a_lasting_failure_names_the_file_and_keeps_the_rest(
  dopamine_dir, reference, local_ray, tmp_path
):
  source = tmp_path / 'run'
  shutil.copytree(dopamine_dir[0], source)
  _flip_byte(source / '$store$_observation_ckpt.3.gz')
  store = tmp_path / 'store'
  with pytest.raises(CheckpointError) as raised:
    convert.convert(source, store, ray=local_ray)
  assert raised.value.path.endswith('$store$_observation_ckpt.3.gz')
  stored = file_digests(store)
  assert not any(path.startswith('checkpoint_3') for path in stored)
  assert not any(path.startswith('.') for path in stored)  # No partial.
  # The rest stored (against a dictionary trained without checkpoint 3).
  assert {
    path: digest
    for path, digest in content_digests(reference).items()
    if not path.startswith('checkpoint_3')
  } == content_digests(store)


@pytest.mark.slow  # RL Unplugged shards converted twice.
def test_rl_unplugged_through_ray_is_the_local_store(
  rlu_dir, local_ray, tmp_path
):
  directory, _ = rlu_dir
  local, on_ray = tmp_path / 'local', tmp_path / 'ray'
  # Run 2 is not laid out as published: both rounds of convert_rlu work.
  rlu_convert.convert_rlu(directory, local, run=2, workers=0)
  result = rlu_convert.convert_rlu(directory, on_ray, run=2, ray=local_ray)
  assert result.converted == [0, 1, 2]
  assert file_digests(on_ray) == file_digests(local)


def test_a_store_no_node_sees_is_named(tmp_path):
  with pytest.raises(CheckpointError, match='does not see the store'):
    convert_runners.check_shared(str(tmp_path), 'token')
  (tmp_path / convert_runners.JOB_FILE).write_text('other')
  with pytest.raises(CheckpointError, match='another job'):
    convert_runners.check_shared(str(tmp_path), 'token')
  (tmp_path / convert_runners.JOB_FILE).write_text('token')
  convert_runners.check_shared(str(tmp_path), 'token')


def _game_dir(dopamine_dir, directory):
  """Two runs in the DQN Replay Dataset's layout, hard links to conftest's."""
  suffixes = {'1': (0, 3), '2': (1, 7)}
  for run, kept in suffixes.items():
    logs = directory / run / 'replay_logs'
    logs.mkdir(parents=True)
    for name in os.listdir(dopamine_dir):
      if any(name.endswith(f'_ckpt.{s}.gz') for s in kept):
        os.link(dopamine_dir / name, logs / name)
  return suffixes


def _cli(*args):
  return subprocess.run(
    [sys.executable, '-m', 'fixed_replay.cli', 'convert', *map(str, args)],
    capture_output=True,
    text=True,
    check=False,
  )


def test_cli_converts_a_game_directory_on_ray(dopamine_dir, tmp_path):
  """Each run into DST/<run>, as the local pool does; Ray is gone after."""
  game = tmp_path / 'Pong'
  suffixes = _game_dir(dopamine_dir[0], game)
  local = tmp_path / 'local'
  convert.convert_runs(
    [(game / run / 'replay_logs', local / run) for run in suffixes],
    workers=0,
  )
  completed = _cli(game, tmp_path / 'ray', '--ray', '--workers=2')
  assert completed.returncode == 0, completed.stderr
  assert sorted(os.listdir(tmp_path / 'ray')) == ['1', '2']
  assert file_digests(tmp_path / 'ray') == file_digests(local)
  assert 'converting: 4/4 checkpoints done' in completed.stderr
  session = re.search(r'Ray logs in (\S+)', completed.stderr).group(1)
  left = []
  for process in psutil.process_iter(['cmdline']):
    if session in ' '.join(process.info['cmdline'] or ()):
      left.append(process)
  assert not _wait_gone(left, timeout=10.0)


def test_cli_without_ray_never_imports_it(dopamine_dir, tmp_path):
  completed = subprocess.run(
    [
      sys.executable,
      '-X',
      'importtime',
      '-m',
      'fixed_replay.cli',
      'convert',
      str(dopamine_dir[0]),
      str(tmp_path / 'store'),
      '--workers=0',
    ],
    capture_output=True,
    text=True,
    check=False,
  )
  assert completed.returncode == 0, completed.stderr
  imported = [
    line.rsplit('|', 1)[-1].strip()
    for line in completed.stderr.splitlines()
    if line.startswith('import time:')
  ]
  assert 'fixed_replay.convert.convert' in imported
  assert not [name for name in imported if name.split('.')[0] == 'ray']


def test_cli_converts_listed_runs_each_into_its_store(dopamine_dir, tmp_path):
  game = tmp_path / 'Pong'
  _game_dir(dopamine_dir[0], game)
  # A run's directory, or its replay_logs/: both name the run.
  completed = _cli(
    game / '1' / 'replay_logs', game / '2', tmp_path / 'out', '--workers=0'
  )
  assert completed.returncode == 0, completed.stderr
  for run, suffixes in (('1', [0, 3]), ('2', [1, 7])):
    reference = convert.convert(
      game / run / 'replay_logs', tmp_path / f'reference_{run}', workers=0
    )
    assert reference.converted == suffixes
    assert file_digests(tmp_path / 'out' / run) == file_digests(
      tmp_path / f'reference_{run}'
    )
  clash = _cli(game / '1', game / '1' / 'replay_logs', tmp_path / 'clash')
  assert clash.returncode != 0
  assert "runs named ['1'] would go into the same store" in clash.stderr
  assert not (tmp_path / 'clash').exists()
