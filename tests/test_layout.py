"""sources/layout.py over every layout, and the one-line errors of `train`.

The files are real: Dopamine checkpoints written by Dopamine's own buffer
(conftest.dopamine_dir), a compact store written by `fixed-replay convert`
in a fresh process, RL Unplugged shards written with TensorFlow's TFRecord
writer (conftest.rlu_dir). The TFDS layout is tested in test_rlu_tfds.py,
next to the dataset TFDS prepares there.
"""

import concurrent.futures
import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fixed_replay import gin_files
from fixed_replay.errors import CheckpointError
from fixed_replay.sources import layout
from fixed_replay.training import data_game

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ACCEPTED = 'accepted: Dopamine replay checkpoints (*_ckpt.N.gz)'


def _link_run(dopamine_dir, run_dir, skip=()):
  """run_dir/replay_logs holding (hard links to) dopamine_dir's files."""
  replay_logs = run_dir / 'replay_logs'
  replay_logs.mkdir(parents=True)
  for name in os.listdir(dopamine_dir):
    if name not in skip:
      os.link(dopamine_dir / name, replay_logs / name)
  return replay_logs


def _convert(*argv):
  result = subprocess.run(
    [sys.executable, '-m', 'fixed_replay.cli', 'convert', *map(str, argv)],
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope='module')
def data(dopamine_dir, tmp_path_factory):
  """DATA/Pong/1/replay_logs (Dopamine's files) and two stores of them.

  DATA/stores/pong_1 from DATA/Pong/1 (the game from the path) and
  DATA/stores/named from the same files where no game is in the path, named
  with --game, each by `fixed-replay convert` in a process of its own.
  """
  root = tmp_path_factory.mktemp('layouts')
  replay_logs = _link_run(dopamine_dir[0], root / 'Pong' / '1')
  with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    converted = [
      pool.submit(
        _convert, root / 'Pong' / '1', root / 'stores' / 'pong_1', '--workers=0'
      ),
      pool.submit(
        _convert,
        dopamine_dir[0],
        root / 'stores' / 'named',
        '--workers=0',
        '--game=Breakout',
      ),
    ]
    for future in converted:
      future.result()
  return root, replay_logs


def test_dopamine_run_its_replay_logs_and_its_game_directory(data):
  root, replay_logs = data
  run = root / 'Pong' / '1'
  found = layout.detect(run)
  assert found.kind is layout.Kind.DOPAMINE_RUN
  assert found.data_dir == str(replay_logs) and found.game == 'Pong'
  assert found.trainable and found.require_trainable() is found
  found = layout.detect(f'{replay_logs}/')
  assert found.kind is layout.Kind.DOPAMINE
  assert found.data_dir == str(replay_logs) and found.game == 'Pong'
  game = layout.detect(root / 'Pong')
  assert game.kind is layout.Kind.GAME and game.game == 'Pong'
  assert game.runs == (('1', str(replay_logs)),)
  with pytest.raises(CheckpointError, match=r'game directory .*\(1\): name'):
    game.require_trainable()
  assert layout.find_runs(root / 'Pong') == {'1': str(replay_logs)}
  assert layout.run_name(replay_logs) == '1' and layout.run_name(run) == '1'


def test_a_folder_of_checkpoints_not_below_a_game(dopamine_dir):
  found = layout.detect(dopamine_dir[0])
  assert found.kind is layout.Kind.DOPAMINE
  assert found.data_dir == str(dopamine_dir[0]) and found.game is None


def test_store_written_by_convert(data):
  root, _ = data
  found = layout.detect(root / 'stores' / 'pong_1')
  assert found.kind is layout.Kind.STORE and found.trainable
  assert found.data_dir == str(root / 'stores' / 'pong_1')
  # The manifests record the game: from the source's path, or --game.
  assert found.game == 'Pong'
  assert layout.detect(root / 'stores' / 'named').game == 'Breakout'
  with open(root / 'stores' / 'named' / 'checkpoint_0' / 'manifest.json') as f:
    assert json.load(f)['game'] == 'Breakout'
  # The run went in whole: one checkpoint_N/ per Dopamine checkpoint.
  names = os.listdir(root / 'stores' / 'pong_1')
  assert sorted(n for n in names if n.startswith('checkpoint_')) == [
    'checkpoint_0',
    'checkpoint_1',
    'checkpoint_3',
    'checkpoint_7',
  ]


def _load_gzip(path):
  with gzip.open(path) as stream:
    return np.load(stream, allow_pickle=False)


def test_largest_action_of_a_store_is_that_of_its_dopamine_files(data):
  root, replay_logs = data
  expected = -1
  for suffix in (0, 1, 3, 7):
    add_count = int(_load_gzip(replay_logs / f'add_count_ckpt.{suffix}.gz'))
    actions = _load_gzip(replay_logs / f'$store$_action_ckpt.{suffix}.gz')
    expected = max(expected, int(actions[:add_count].max()))
  store = root / 'stores' / 'pong_1'
  largest, where = data_game.largest_action(layout.detect(store))
  assert largest == expected
  assert where.startswith(str(store / 'checkpoint_'))


def test_half_written_store_names_what_is_missing(data, tmp_path):
  root, _ = data
  store = tmp_path / 'store'
  (store / 'checkpoint_3').mkdir(parents=True)
  source = root / 'stores' / 'pong_1' / 'checkpoint_3'
  for name in os.listdir(source):
    if name != 'manifest.json':
      os.link(source / name, store / 'checkpoint_3' / name)
  (store / '.checkpoint_7.partial-123').mkdir()
  found = layout.detect(store)
  assert found.kind is layout.Kind.PARTIAL
  assert found.partial_of is layout.Kind.STORE and not found.trainable
  with pytest.raises(CheckpointError) as raised:
    found.require_trainable()
  assert str(raised.value) == (
    f'{store}: a compact store with no complete checkpoint: missing '
    'checkpoint_3/manifest.json; half-written .checkpoint_7.partial-123 '
    '(rerun the `fixed-replay convert` that wrote it)'
  )


def test_half_written_dopamine_run_names_the_missing_files(
  dopamine_dir, tmp_path
):
  directory = dopamine_dir[0]
  kept = [n for n in os.listdir(directory) if '_ckpt.0.gz' in n]
  skip = set(os.listdir(directory)) - set(kept) | {'add_count_ckpt.0.gz'}
  replay_logs = _link_run(directory, tmp_path / 'Pong' / '2', skip=skip)
  found = layout.detect(tmp_path / 'Pong' / '2')
  assert found.kind is layout.Kind.PARTIAL
  assert found.partial_of is layout.Kind.DOPAMINE
  assert found.data_dir == str(replay_logs)
  assert found.problem == (
    'Dopamine replay checkpoints, none complete: checkpoint 0 lacks '
    'add_count_ckpt.0.gz'
  )


def test_rl_unplugged_shards(rlu_dir):
  directory, _ = rlu_dir
  found = layout.detect(directory)
  assert found.kind is layout.Kind.RLU and not found.trainable
  assert found.game == 'Breakout'
  assert [run for run, _ in found.runs] == ['1', '2']
  command = (
    f'fixed-replay convert --run=1 {directory} '
    f'{directory.parent / "Breakout_run_1_store"}'
  )
  assert layout.convert_command(found) == command
  with pytest.raises(CheckpointError) as raised:
    found.require_trainable()
  assert str(raised.value) == (
    f'{directory}: RL Unplugged shards (run_<r>-NNNNN-of-MMMMM): convert it '
    f'first, then train on the store: {command}'
  )


def test_empty_unknown_and_missing(tmp_path):
  empty = layout.detect(tmp_path)
  assert empty.kind is layout.Kind.EMPTY
  assert empty.problem.startswith('empty directory: expected one of ')
  (tmp_path / 'replay_logs').mkdir()
  assert layout.detect(tmp_path).kind is layout.Kind.EMPTY
  (tmp_path / 'notes.txt').write_text('mine')
  unknown = layout.detect(tmp_path)
  assert unknown.kind is layout.Kind.UNKNOWN
  assert unknown.problem.startswith(
    f'no known layout (found notes.txt, replay_logs); {ACCEPTED}; '
  )
  for kind in layout.ACCEPTED:
    assert kind.value in unknown.problem
  missing = layout.detect(tmp_path / 'absent')
  assert missing.kind is layout.Kind.MISSING
  assert missing.problem == 'no such directory'
  assert layout.detect(tmp_path / 'notes.txt').problem.startswith(
    'a file, not a directory: expected one of '
  )


# ------------------------------------------------ `train`'s one-line errors


def _train(cwd, *flags):
  """`fixed-replay train FLAGS` in a fresh process; (code, stderr)."""
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join([ROOT, env.get('PYTHONPATH', '')])
  result = subprocess.run(
    [sys.executable, '-m', 'fixed_replay.cli', 'train', *flags],
    cwd=cwd,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  return result.returncode, result.stderr


def _one_line(stderr):
  """The one error line; asserts there is no traceback or gin call stack."""
  assert 'Traceback' not in stderr, stderr[-3000:]
  assert 'In call to configurable' not in stderr, stderr[-3000:]
  lines = [x for x in stderr.splitlines() if x.startswith('fixed-replay ')]
  assert len(lines) == 1, stderr[-3000:]
  return lines[0]


def test_train_refuses_mistakes_in_one_line(
  data, dopamine_dir, rlu_dir, tmp_path
):
  root, _ = data
  # Pong's data (actions 0 to 5) where the path says Breakout (4 actions).
  other = _link_run(dopamine_dir[0], tmp_path / 'Breakout' / '1')
  dqn_gin = os.path.join(ROOT, 'configs', 'dqn.gin')
  (tmp_path / 'empty').mkdir()
  (tmp_path / 'odd').mkdir()
  (tmp_path / 'odd' / 'notes.txt').write_text('mine')
  base = f'--base_dir={tmp_path / "run"}'
  run = f'--replay_dir={root / "Pong" / "1"}'
  shards = rlu_dir[0]
  cases = {
    'shards': ([base, f'--replay_dir={shards}'], 'fixed-replay convert '),
    'empty': ([base, f'--replay_dir={tmp_path / "empty"}'], 'empty'),
    'unknown': ([base, f'--replay_dir={tmp_path / "odd"}'], 'no known'),
    'agent': ([base, run, '--agent_name=dqnn'], 'unknown agent_name'),
    'gin': ([base, run, '--gin_files=configs/nope.gin'], 'gin file'),
    'actions': (
      [
        f'--base_dir={tmp_path / "actions_run"}',
        f'--replay_dir={other.parent}',
        f'--gin_files={dqn_gin}',
      ],
      'actions reach 5',
    ),
  }
  with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    results = {
      name: pool.submit(_train, tmp_path, *flags)
      for name, (flags, _) in cases.items()
    }
    results = {name: future.result() for name, future in results.items()}
  for name, (code, stderr) in results.items():
    assert code == 1, (name, stderr[-3000:])
    assert cases[name][1] in _one_line(stderr), (name, stderr[-3000:])
  found = layout.detect(shards)
  assert _one_line(results['shards'][1]) == (
    f'fixed-replay train: {found.error()}'
  )
  assert layout.convert_command(found) in results['shards'][1]
  assert _one_line(results['empty'][1]) == (
    f'fixed-replay train: {tmp_path / "empty"}: empty directory: expected '
    f'one of {layout.accepted_layouts()}'
  )
  assert _one_line(results['unknown'][1]) == (
    f'fixed-replay train: {tmp_path / "odd"}: no known layout (found '
    f'notes.txt); accepted: {layout.accepted_layouts()}'
  )
  assert _one_line(results['agent'][1]) == (
    "fixed-replay train: unknown agent_name 'dqnn': choose one of c51, dqn, "
    'jax_cql, jax_dqn, jax_quantile, jax_quantile_cql, jax_rem, '
    'multi_head_dqn, multi_network_dqn, quantile, rem, or give your own '
    "agent class as 'package.module:Class'"
  )
  packaged = os.path.join(gin_files.PACKAGED_CONFIGS, 'nope.gin')
  assert _one_line(results['gin'][1]) == (
    f'fixed-replay train: gin file configs/nope.gin not found (looked for '
    f'{tmp_path / "configs" / "nope.gin"} and {packaged}, the configs '
    'installed with fixed_replay; relative paths are relative to the '
    f'working directory, {tmp_path})'
  )
  _, stderr = results['actions']
  # dqn.gin binds Pong; the data's path says Breakout, which is played.
  assert (
    "Evaluating in Breakout, the data's game (" + str(other) + '), not in '
    'Pong, which the gin files bind: to play Pong, pass --gin_bindings='
    '"atari_lib.create_atari_environment.game_name = \'Pong\'"'
  ) in stderr
  line = _one_line(stderr)
  assert line.startswith(
    f'fixed-replay train: {other.parent}: its actions reach 5 ('
  )
  assert 'but Breakout has 4 actions (0 to 3)' in line
  # Nothing was trained, and the data is as it was.
  assert not (tmp_path / 'run').exists()
