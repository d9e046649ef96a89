"""`fixed-replay inspect` against checkpoints written by Dopamine itself."""

import gzip
import io
import json
import os
import pickle
import shutil
import subprocess
import sys

import dopamine_data
import numpy as np
import pytest

from fixed_replay import progress
from fixed_replay.cli import tables
from fixed_replay.sources import summaries
from fixed_replay.sources.dopamine import inspection

OBSERVATION_SHAPE = (84, 84)
CAPACITY = 300
# suffix: add_count when saved (padding rows included).
ADD_COUNTS = {0: 200, 1: CAPACITY, 5: 1000}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fill(buffer, target_add_count, seed, terminal_prob=0.04, cut_prob=0.02):
  """Adds random transitions until add_count is exactly target_add_count.

  Returns:
    List of finished episodes as (first add index, end add index, return):
    the first index is the first zero padding row Dopamine inserts.
  """
  rng = np.random.default_rng(seed)
  stack_size = buffer._stack_size
  episodes, start, total = [], None, 0.0
  while buffer.add_count < target_add_count:
    if start is None:
      start, total = int(buffer.add_count), 0.0
    # No episode may end where the next one's padding would overshoot.
    may_end = buffer.add_count < target_add_count - stack_size - 1
    terminal = may_end and rng.random() < terminal_prob
    cut = may_end and not terminal and rng.random() < cut_prob
    reward = np.float32(rng.normal())
    observation = rng.integers(0, 4, OBSERVATION_SHAPE, dtype=np.uint8)
    buffer.add(
      observation, int(rng.integers(6)), reward, terminal, episode_end=cut
    )
    total += float(reward)
    if terminal or cut:
      episodes.append((start, int(buffer.add_count) - 1, total))
      start = None
  assert buffer.add_count == target_add_count
  return episodes


def _write(directory, suffix, add_count, stack_size=4, update_horizon=1):
  buffer = dopamine_data.make_buffer(
    CAPACITY,
    stack_size=stack_size,
    update_horizon=update_horizon,
    observation_shape=OBSERVATION_SHAPE,
  )
  episodes = _fill(buffer, add_count, seed=suffix)
  buffer.save(str(directory), suffix)
  return buffer, episodes


def _expected_returns(episodes, add_count):
  """Returns of the episodes whose start is known and whose end is kept."""
  oldest = add_count - CAPACITY  # Add index of the oldest row still held.
  return [
    total
    for start, end, total in episodes
    if end >= oldest and start >= oldest and (start == 0 or start > oldest)
  ]


@pytest.fixture(scope='module')
def written(tmp_path_factory):
  """Not full, exactly full and wrapped checkpoints, with their writers."""
  directory = tmp_path_factory.mktemp('inspect')
  writers = {s: _write(directory, s, n) for s, n in ADD_COUNTS.items()}
  return directory, writers


@pytest.fixture
def copy(written, tmp_path):
  """A private copy of the written directory, free to damage."""
  destination = tmp_path / 'replay'
  shutil.copytree(written[0], destination)
  return destination


def _path(directory, name, suffix):
  return str(directory / f'{name}_ckpt.{suffix}.gz')


def _cli(*args):
  return subprocess.run(
    [sys.executable, '-m', 'fixed_replay.cli', 'inspect', *map(str, args)],
    capture_output=True,
    text=True,
    cwd=REPO,
    timeout=60,
    check=False,
  )


def _assert_matches_writer(summary, buffer, episodes, stack_size=4, horizon=1):
  valid = sum(buffer.is_valid_transition(i) for i in range(CAPACITY))
  expected = _expected_returns(episodes, int(buffer.add_count))
  assert summary.status == summaries.OK, summary.problems
  assert summary.rows == CAPACITY
  assert summary.add_count == int(buffer.add_count)
  assert summary.cursor == buffer.cursor()
  assert summary.is_full == buffer.is_full()
  assert summary.num_valid == valid
  assert summary.episodes.count == len(expected) > 0
  np.testing.assert_allclose(
    [
      summary.episodes.min_return,
      summary.episodes.mean_return,
      summary.episodes.max_return,
    ],
    [min(expected), np.mean(expected), max(expected)],
    rtol=1e-6,
  )


@pytest.mark.parametrize('verify', [False, True])
def test_summary_matches_dopamine(written, verify):
  directory, writers = written
  summary = inspection.summarize_directory(directory, verify=verify)
  assert summary.ok and not summary.all_problems
  assert [s.suffix for s in summary.checkpoints] == sorted(ADD_COUNTS)
  for checkpoint in summary.checkpoints:
    assert checkpoint.verified == verify
    _assert_matches_writer(checkpoint, *writers[checkpoint.suffix])
  assert summary.total('rows') == CAPACITY * len(ADD_COUNTS)
  assert summary.episodes.count == sum(
    s.episodes.count for s in summary.checkpoints
  )


def test_valid_count_for_other_stack_and_horizon(tmp_path):
  buffer, episodes = _write(tmp_path, 2, 777, stack_size=2, update_horizon=3)
  summary = inspection.summarize_directory(
    tmp_path, stack_size=2, update_horizon=3
  )
  _assert_matches_writer(summary.checkpoints[0], buffer, episodes)


def test_episode_returns_follow_chronological_order():
  # Full buffer, cursor 3: chronological rows 3, 4, 5, 0, 1, 2. The episode
  # ending at row 4 started before the oldest row; 5..0 and 1..1 are whole.
  terminal = np.array([1, 1, 0, 0, 1, 0], np.uint8)
  reward = np.array([2, 10, 20, 30, 40, 1], np.float32)
  returns = inspection.episode_returns(terminal, reward, add_count=9)
  np.testing.assert_array_equal(returns, [3, 10])
  # Never overwritten (add_count == rows): row 0 starts the first episode.
  returns = inspection.episode_returns(terminal, reward, add_count=6)
  np.testing.assert_array_equal(returns, [2, 10, 90])
  # An end recorded only in episode_end_indices splits an episode too.
  returns = inspection.episode_returns(terminal, reward, 9, np.array([2]))
  np.testing.assert_array_equal(returns, [3, 10, 20])
  returns = inspection.episode_returns(terminal, reward, 6, np.array([2]))
  np.testing.assert_array_equal(returns, [2, 10, 20, 70])


def test_sizes(written):
  directory, _ = written
  summary = inspection.summarize_directory(directory)
  for checkpoint in summary.checkpoints:
    paths = [
      directory / name
      for name in os.listdir(directory)
      if name.endswith(f'_ckpt.{checkpoint.suffix}.gz')
    ]
    assert len(paths) == 7
    assert checkpoint.disk_bytes == sum(os.path.getsize(p) for p in paths)
    arrays = [
      np.load(gzip.open(p))
      for p in paths
      if not p.name.startswith('episode_end_indices')
    ]
    assert checkpoint.data_bytes == sum(a.nbytes for a in arrays)
    assert checkpoint.data_bytes > CAPACITY * 84 * 84
    assert checkpoint.observation_shape == OBSERVATION_SHAPE
    assert checkpoint.observation_dtype == 'uint8'
  assert progress.format_bytes(512) == '512 B'
  assert progress.format_bytes(49_000) == '49.00 kB'
  assert progress.format_bytes(7_056_000_000) == '7.06 GB'
  assert progress.format_bytes(None) == '-'


def _truncate(path):
  data = open(path, 'rb').read()
  open(path, 'wb').write(data[: len(data) // 2])


def _flip_middle(path):
  data = bytearray(open(path, 'rb').read())
  middle = len(data) // 2
  data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
  open(path, 'wb').write(bytes(data))


def _gzip(path, payload):
  with gzip.open(path, 'wb') as f:
    f.write(payload)


def _bad_header(path):
  header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (300,, }"
  header = header.ljust(118) + b'\n'
  _gzip(path, b'\x93NUMPY\x01\x00' + len(header).to_bytes(2, 'little') + header)


def _save(array):
  def damage(path):
    buffer = io.BytesIO()
    np.save(buffer, array)
    _gzip(path, buffer.getvalue())

  return damage


def _shorten(path):
  _save(np.load(gzip.open(path))[:-5])(path)


# (file name, suffix, damage, found without --verify, words of the problem)
DAMAGES = {
  'truncated': ('$store$_observation', 0, _truncate, False, 'truncated'),
  'truncated_reward': ('$store$_reward', 5, _truncate, True, 'truncated'),
  'flipped': ('$store$_observation', 5, _flip_middle, False, 'corrupt'),
  'bad_header': ('$store$_reward', 0, _bad_header, True, 'bad .npy header'),
  'shorter': ('$store$_terminal', 5, _shorten, True, '295 rows'),
  'missing': ('$store$_action', 1, os.remove, True, 'missing'),
  'add_count_1d': ('add_count', 0, _save(np.array([5])), True, '0-d integer'),
  'invalid_range_2d': (
    'invalid_range',
    5,
    _save(np.zeros((2, 3), np.int64)),
    True,
    '1-d integer',
  ),
  'episode_ends_not_ints': (
    'episode_end_indices',
    0,
    lambda path: _gzip(path, pickle.dumps({'a', 'b'})),
    True,
    'pickled set of ints',
  ),
}


@pytest.mark.parametrize('damage', sorted(DAMAGES))
def test_damage_is_reported_naming_the_file(copy, damage):
  name, suffix, function, cheap, words = DAMAGES[damage]
  path = _path(copy, name, suffix)
  function(path)
  summary = inspection.summarize_directory(copy, verify=True)
  assert not summary.ok
  assert [p.path for p in summary.all_problems] == [path]
  assert words in summary.all_problems[0].problem
  checkpoint = {s.suffix: s for s in summary.checkpoints}[suffix]
  expected = summaries.INCOMPLETE if damage == 'missing' else summaries.DAMAGED
  assert checkpoint.status == expected
  assert all(
    s.status == summaries.OK for s in summary.checkpoints if s is not checkpoint
  )
  cheap_summary = inspection.summarize_directory(copy)
  assert [p.path for p in cheap_summary.all_problems] == (
    [path] if cheap else []
  )

  result = _cli(copy, '--verify')
  assert result.returncode == 1
  assert path in result.stderr


def test_every_problem_is_collected(copy):
  paths = []
  for damage in (
    'truncated',
    'truncated_reward',
    'flipped',
    'bad_header',
    'shorter',
    'missing',
  ):
    name, suffix, function, _, _ = DAMAGES[damage]
    paths.append(_path(copy, name, suffix))
    function(paths[-1])
  summary = inspection.summarize_directory(copy, verify=True)
  assert sorted(p.path for p in summary.all_problems) == sorted(paths)
  report = tables.format_problems(summary)
  assert all(path in report for path in paths)
  # Suffix 5 lost its terminal and reward data, but the headers and
  # add_count still say what it holds.
  wrapped = summary.checkpoints[-1]
  assert wrapped.add_count == ADD_COUNTS[5] and wrapped.rows == CAPACITY
  assert wrapped.observation_shape == OBSERVATION_SHAPE
  assert wrapped.num_valid is None and wrapped.episodes is None


def test_cli_table_and_json(written):
  directory, writers = written
  result = _cli(directory)
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert str(directory) in lines[0]
  for suffix in ADD_COUNTS:
    line = next(x for x in lines if x.split()[0] == str(suffix))
    assert ' ok ' in line and '84x84 uint8' in line
    assert str(ADD_COUNTS[suffix]) in line.split()
  assert lines[-1].split()[:3] == ['total', '3/3', 'complete']
  summary = inspection.summarize_directory(directory)
  disk, data = summary.total('disk_bytes'), summary.total('data_bytes')
  sizes = f'{progress.format_bytes(disk)} {progress.format_bytes(data)}'
  assert lines[-1].split()[-4:] == sizes.split()
  assert lines[-1].endswith(' MB') and 1e6 < disk < data

  result = _cli(directory, '--json', '--verify')
  assert result.returncode == 0, result.stderr
  data = json.loads(result.stdout)
  assert data['ok'] and data['verified'] and data['problems'] == []
  assert data == json.loads(
    json.dumps(inspection.summarize_directory(directory, verify=True).to_dict())
  )
  for checkpoint in data['checkpoints']:
    buffer, _ = writers[checkpoint['suffix']]
    assert checkpoint['num_valid'] == sum(
      buffer.is_valid_transition(i) for i in range(CAPACITY)
    )
  # Not at a terminal: verification progress goes to the log instead.
  assert 'Verifying file 21/21' in result.stderr


def test_cli_fails_without_a_complete_checkpoint(tmp_path):
  result = _cli(tmp_path)
  assert result.returncode == 1
  assert f'{tmp_path}: empty directory: expected one of' in result.stderr
  result = _cli(tmp_path / 'absent')
  assert result.returncode == 1
  assert str(tmp_path / 'absent') in result.stderr
  result = _cli()
  assert result.returncode != 0
  assert 'expected one replay directory' in result.stderr


def test_progress_bar(written, capsys):
  directory, _ = written
  inspection.summarize_directory(directory, verify=True, progress_bar=True)
  assert 'verifying' in capsys.readouterr().err


def test_cli_does_not_import_tensorflow():
  code = (
    'import sys, fixed_replay.cli.inspect; '
    'print(sorted(m for m in sys.modules '
    "if m.split('.')[0] in ('tensorflow', 'dopamine')))"
  )
  result = subprocess.run(
    [sys.executable, '-c', code],
    capture_output=True,
    text=True,
    cwd=REPO,
    check=True,
  )
  assert result.stdout.strip() == '[]'
