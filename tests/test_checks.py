"""One set of consistency checks: the reader, convert and inspect agree.

Each damage below is a well-formed gzip file whose content contradicts the
rest of its checkpoint. The reader (and so FixedReplayBuffer) raises the
first problem, convert refuses before converting anything and lists every
problem, inspect collects them; each names the file.
"""

import gzip
import os
import pickle
import re
import shutil
import tracemalloc

import numpy as np
import pytest

from fixed_replay.convert import convert
from fixed_replay.errors import CheckpointError
from fixed_replay.errors import CheckpointProblems
from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer
from fixed_replay.sources import summaries
from fixed_replay.sources.dopamine import checkpoints
from fixed_replay.sources.dopamine import checks
from fixed_replay.sources.dopamine import inspection


def _npy(array):
  def write(path):
    with gzip.open(path, 'wb') as stream:
      np.save(stream, np.asarray(array))

  return write


def _pickled(value):
  def write(path):
    with gzip.open(path, 'wb') as stream:
      pickle.dump(value, stream)

  return write


def _zeros(num_bytes):
  """A gzip of num_bytes zeros (about num_bytes / 1000 on disk)."""

  def write(path):
    chunk = bytes(1 << 20)
    with gzip.open(path, 'wb') as stream:
      for _ in range(num_bytes // len(chunk)):
        stream.write(chunk)

  return write


def _without_trailer(path):
  data = open(path, 'rb').read()
  os.remove(path)
  with open(path, 'wb') as stream:
    stream.write(data[:-8])


# name: (file, suffix, damage, words of the problem). The fixture's
# checkpoints have 1000 rows; suffix 7 has episode_end_indices.
DAMAGES = {
  'negative_add_count': ('add_count', 0, _npy(-5), 'negative add_count -5'),
  'add_count_not_0d': ('add_count', 1, _npy([5]), 'expected a 0-d integer'),
  'invalid_range_outside': (
    'invalid_range',
    1,
    _npy([998, 999, 1000, 1, 2]),
    'not all in [0, 1000)',
  ),
  'invalid_range_not_at_cursor': (
    'invalid_range',
    3,
    _npy([10, 11, 12, 13, 14]),
    'around the cursor 999',
  ),
  'episode_end_outside': (
    'episode_end_indices',
    7,
    _pickled({5, 1000}),
    'outside [0, 1000)',
  ),
  'episode_end_huge': (
    'episode_end_indices',
    7,
    _pickled({10**100}),
    'outside [0, 1000)',
  ),
  'episode_end_dict': (
    'episode_end_indices',
    7,
    _pickled({1: 2}),
    'not a pickled set of ints (a dict)',
  ),
  'episode_end_floats': (
    'episode_end_indices',
    7,
    _pickled({1.5}),
    'holds float',
  ),
  'episode_end_zip_bomb': (
    'episode_end_indices',
    7,
    _zeros(400 << 20),
    'inflates to more than',
  ),
  'add_count_without_trailer': (
    'add_count',
    3,
    _without_trailer,
    'truncated gzip data',
  ),
  'action_shorter': (
    '$store$_action',
    0,
    _npy(np.zeros(999, np.int32)),
    'differ in length',
  ),
}


@pytest.fixture
def copy(dopamine_dir, tmp_path):
  """Hard links to the fixture's files; damage replaces, never writes."""
  directory = tmp_path / 'copy'
  directory.mkdir()
  for name in os.listdir(dopamine_dir[0]):
    os.link(dopamine_dir[0] / name, directory / name)
  return directory


def _damage(copy, name):
  file_name, suffix, function, words = DAMAGES[name]
  path = str(copy / f'{file_name}_ckpt.{suffix}.gz')
  if function is not _without_trailer:
    os.remove(path)
  function(path)
  return path, suffix, words


@pytest.mark.parametrize('damage', sorted(DAMAGES))
def test_every_tool_names_the_inconsistent_file(copy, tmp_path, damage):
  path, suffix, words = _damage(copy, damage)
  expected = re.escape(f'{path}: ') + '.*' + re.escape(words)
  files = checkpoints.find_checkpoints(copy)[suffix]
  with pytest.raises(CheckpointError, match=expected):
    checkpoints.read_checkpoint(files)
  with pytest.raises(CheckpointError, match=expected):
    FixedReplayBuffer(str(copy), suffix, prefetch=False)
  store = tmp_path / 'store'
  with pytest.raises(CheckpointError, match=expected):
    convert.convert(copy, store, workers=0)
  assert not store.exists()  # Refused before anything was written.
  summary = inspection.summarize_directory(copy)
  assert [p.path for p in summary.all_problems] == [path]
  assert words in summary.all_problems[0].problem


def test_zip_bomb_is_refused_in_bounded_memory(copy):
  path, _, _ = _damage(copy, 'episode_end_zip_bomb')
  assert os.path.getsize(path) < 1 << 20
  tracemalloc.start()
  try:
    with pytest.raises(CheckpointError, match='inflates to more than'):
      checks.read_episode_end_indices(path, 1000)
    _, peak = tracemalloc.get_traced_memory()
  finally:
    tracemalloc.stop()
  assert peak < 32 << 20, peak


def test_convert_lists_every_problem_before_converting(copy, tmp_path):
  paths = [
    _damage(copy, name)[0]
    for name in (
      'negative_add_count',
      'invalid_range_outside',
      'episode_end_dict',
    )
  ]
  store = tmp_path / 'store'
  with pytest.raises(CheckpointProblems) as raised:
    convert.convert(copy, store, workers=0)
  assert sorted(e.path for e in raised.value.errors) == sorted(paths)
  for path in paths:
    assert path in str(raised.value)
  assert not store.exists()


@pytest.mark.parametrize(
  'observation, words',
  [
    (np.zeros((1000, 80, 80), np.uint8), 'shape (80, 80) uint8'),
    (np.zeros((1000, 84, 84), np.float32), 'shape (84, 84) float32'),
  ],
)
def test_checkpoints_of_other_frames_are_flagged(
  copy, tmp_path, observation, words
):
  path = str(copy / '$store$_observation_ckpt.1.gz')
  os.remove(path)
  _npy(observation)(path)
  summary = inspection.summarize_directory(copy, verify=True)
  assert [p.path for p in summary.all_problems] == [path]
  problem = summary.all_problems[0].problem
  assert words in problem and 'checkpoints [0, 3, 7]' in problem
  assert [s.status for s in summary.checkpoints] == [
    summaries.OK,
    summaries.DAMAGED,
    summaries.OK,
    summaries.OK,
  ]
  with pytest.raises(CheckpointError, match=re.escape(path)):
    convert.convert(copy, tmp_path / 'store', workers=0)


def test_an_asked_for_incomplete_checkpoint_names_its_missing_files(copy):
  os.remove(copy / '$store$_reward_ckpt.1.gz')
  os.remove(copy / 'invalid_range_ckpt.1.gz')
  with pytest.raises(
    CheckpointError,
    match=r'checkpoint 1 is incomplete: missing \$store\$_reward_ckpt\.1\.gz, '
    r'invalid_range_ckpt\.1\.gz',
  ):
    FixedReplayBuffer(str(copy), 1, prefetch=False)
  # Not asked for: skipped with a warning, as before.
  buffer = FixedReplayBuffer(str(copy), 3, prefetch=False)
  assert buffer.loaded_suffixes == [3]
  shutil.rmtree(copy)
