"""Discovery and window reads against Dopamine-written checkpoints."""

import gzip
import shutil

import numpy as np
import pytest

from fixed_replay.errors import CheckpointError
from fixed_replay.sources.dopamine import checkpoints


def test_finds_all_complete_suffixes_with_or_without_slash(dopamine_dir):
  directory, _, writers = dopamine_dir
  for path in (str(directory), str(directory) + '/'):
    assert checkpoints.checkpoint_suffixes(path) == sorted(writers)


def test_window_reads_equal_dopamine_load(dopamine_dir):
  directory, capacity, writers = dopamine_dir
  rng = np.random.default_rng(0)
  found = checkpoints.find_checkpoints(directory)
  for suffix, writer in writers.items():
    cursor = int(writer.cursor())
    windows = [
      (0, capacity),
      (capacity - 1, 1),
      (capacity - 37, 37),
      (min(max(cursor - 20, 0), capacity - 40), 40),
    ]  # Crosses the writer's cursor.
    windows += [
      (int(s), int(rng.integers(1, capacity - s + 1)))
      for s in rng.integers(0, capacity, 4)
    ]
    for start, count in windows:
      window = checkpoints.read_checkpoint(
        found[suffix],
        start,
        count,
        observation_shape=(84, 84),
        observation_dtype=np.uint8,
      )
      assert window.num_rows == count and window.start == start
      for name, array in writer._store.items():
        np.testing.assert_array_equal(
          window.store[name], array[start : start + count]
        )
      assert window.add_count == int(writer.add_count)
      assert window.cursor == cursor
      assert window.is_full == bool(writer.is_full())
      np.testing.assert_array_equal(window.invalid_range, writer.invalid_range)
      np.testing.assert_array_equal(
        window.episode_end_indices, sorted(writer.episode_end_indices)
      )


def test_extra_storage_elements_are_read(tmp_path):
  from dopamine.tf.replay_memory import circular_replay_buffer
  import dopamine_data

  extra = [circular_replay_buffer.ReplayElement('logits', (3,), np.float32)]
  buffer = dopamine_data.make_buffer(50, extra_storage_types=extra)
  rng = np.random.default_rng(0)
  frames, _ = dopamine_data.pong_frames(40)
  for i in range(40):
    buffer.add(frames[i], 1, 0.5, False, rng.random(3).astype(np.float32))
  buffer.save(str(tmp_path), 0)
  window = checkpoints.read_checkpoint(
    checkpoints.find_checkpoints(tmp_path)[0], 5, 30
  )
  np.testing.assert_array_equal(
    window.store['logits'], buffer._store['logits'][5:35]
  )


def test_incomplete_suffix_is_skipped_with_warning(
  dopamine_dir, tmp_path, caplog
):
  directory, _, _ = dopamine_dir
  copy = tmp_path / 'copy'
  shutil.copytree(directory, copy)
  (copy / '$store$_reward_ckpt.1.gz').unlink()
  (copy / 'notes.txt').write_text('unrelated')
  (copy / 'checkpoint').write_text('unrelated')
  with caplog.at_level('WARNING'):
    found = checkpoints.find_checkpoints(copy)
  assert sorted(found) == [0, 3, 7]
  assert '$store$_reward_ckpt.1.gz' in caplog.text
  complete, incomplete = checkpoints.scan_checkpoints(copy)
  assert incomplete == {1: ['$store$_reward_ckpt.1.gz']}
  assert sorted(complete) == [0, 3, 7]


def test_missing_or_empty_directory_is_an_error(tmp_path):
  with pytest.raises(CheckpointError, match='does not exist'):
    checkpoints.find_checkpoints(tmp_path / 'nope')
  (tmp_path / 'readme.txt').write_text('x')
  with pytest.raises(CheckpointError, match='no complete replay checkpoint'):
    checkpoints.find_checkpoints(tmp_path)


def _damaged_copy(dopamine_dir, tmp_path, name, new_array):
  directory, _, _ = dopamine_dir
  copy = tmp_path / 'damaged'
  shutil.copytree(directory, copy)
  with gzip.open(copy / name, 'wb') as f:
    np.save(f, new_array)
  return checkpoints.find_checkpoints(copy)


def test_arrays_of_different_lengths(dopamine_dir, tmp_path):
  found = _damaged_copy(
    dopamine_dir, tmp_path, '$store$_action_ckpt.1.gz', np.zeros(999, np.int32)
  )
  with pytest.raises(
    CheckpointError, match=r'action_ckpt.1.gz: 999 rows.*differ in length'
  ):
    checkpoints.read_checkpoint(found[1])


def test_wrong_observation_shape_or_dtype(dopamine_dir):
  found = checkpoints.find_checkpoints(dopamine_dir[0])
  with pytest.raises(CheckpointError, match='observation_ckpt.0.gz: rows have'):
    checkpoints.read_checkpoint(found[0], observation_shape=(96, 96))
  with pytest.raises(CheckpointError, match='observation_ckpt.0.gz: dtype'):
    checkpoints.read_checkpoint(found[0], observation_dtype=np.float32)
  with pytest.raises(CheckpointError, match=r'rows \[1010, 1030\)'):
    checkpoints.read_checkpoint(found[0], 1010, 20)


def test_window_past_the_end_is_clipped_like_the_buffer(dopamine_dir):
  """count=50_000 on a smaller checkpoint reads to its end, as the buffers
  clip a replay_capacity larger than the file."""
  found = checkpoints.find_checkpoints(dopamine_dir[0])
  whole = checkpoints.read_checkpoint(found[0])
  window = checkpoints.read_checkpoint(found[0], 990, 50_000)
  assert window.start == 990 and window.num_rows == whole.num_rows - 990
  for name, array in whole.store.items():
    np.testing.assert_array_equal(window.store[name], array[990:])
  assert window.add_count == whole.add_count
  assert checkpoints.read_checkpoint(found[0], 0, 50_000).num_rows == (
    whole.num_rows
  )
  terminal = checkpoints.read_terminal_window(found[0], 990, 50_000)
  assert list(terminal.store) == ['terminal']
  np.testing.assert_array_equal(
    terminal.store['terminal'], whole.store['terminal'][990:]
  )
  with pytest.raises(CheckpointError, match='rows'):
    checkpoints.read_terminal_window(found[0], whole.num_rows + 1, 5)


def test_bad_add_count(dopamine_dir, tmp_path):
  found = _damaged_copy(
    dopamine_dir, tmp_path, 'add_count_ckpt.0.gz', np.zeros(3)
  )
  with pytest.raises(CheckpointError, match='add_count_ckpt.0.gz: expected a'):
    checkpoints.read_checkpoint(found[0])


def test_episode_end_indices_refuses_other_pickles(dopamine_dir, tmp_path):
  directory, _, _ = dopamine_dir
  copy = tmp_path / 'pickle'
  shutil.copytree(directory, copy)
  import pickle

  with gzip.open(copy / 'episode_end_indices_ckpt.0.gz', 'wb') as f:
    pickle.dump(shutil.rmtree, f)  # Must never be called.
  with pytest.raises(CheckpointError, match='not a pickled set of ints'):
    checkpoints.read_checkpoint(checkpoints.find_checkpoints(copy)[0])
