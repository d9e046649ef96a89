"""The compact store's format: what convert writes and how it is read."""

import os
import shutil

import numpy as np
import pytest

from fixed_replay.dataset import checkpoints
from fixed_replay.dataset import validity
from fixed_replay.errors import CheckpointError
from fixed_replay.io import npy_stream
from fixed_replay.store import compact_store
from fixed_replay.store import manifest as manifest_lib


def _copy_checkpoint(store, suffix, tmp_path):
  target = tmp_path / 'store' / manifest_lib.checkpoint_dirname(suffix)
  shutil.copytree(store / manifest_lib.checkpoint_dirname(suffix), target)
  return target


def test_store_describes_itself(dopamine_dir, store):
  source, capacity, writers = dopamine_dir
  assert sorted(manifest_lib.find_stored_checkpoints(store)) == sorted(writers)
  manifest = manifest_lib.read_manifest(store / 'checkpoint_7')
  assert manifest['format'] == manifest_lib.FORMAT
  assert manifest['version'] == manifest_lib.VERSION
  assert manifest['suffix'] == 7 and manifest['num_rows'] == capacity
  assert manifest['add_count'] == writers[7].add_count
  observation = manifest['observation']
  assert observation['codec'] == 'zstd' and observation['block_rows'] == 16
  assert observation['num_blocks'] == -(-capacity // 16)
  assert observation['row_shape'] == [84, 84]
  for name, entry in manifest['files'].items():
    path = store / 'checkpoint_7' / name
    assert os.path.getsize(path) == entry['bytes'], name
  # Every file of the source is accounted for.
  assert set(manifest['source']['files']) == {
    os.path.basename(p)
    for p in checkpoints.find_checkpoints(source)[7].all_paths()
  }


@pytest.mark.parametrize('suffix', [0, 3, 7])
def test_arrays_equal_the_source(dopamine_dir, store, suffix):
  source = checkpoints.find_checkpoints(dopamine_dir[0])[suffix]
  window = checkpoints.read_checkpoint(source)
  stored = compact_store.StoredCheckpoint(
    store / manifest_lib.checkpoint_dirname(suffix)
  )
  frames = stored.frames
  np.testing.assert_array_equal(
    frames.read_rows(0, frames.num_rows), window.store['observation']
  )
  # A range across blocks, ending in the short last block (1000 = 62*16 + 8).
  np.testing.assert_array_equal(
    frames.read_rows(985, 15), window.store['observation'][985:]
  )
  for name in ('action', 'reward', 'terminal'):
    np.testing.assert_array_equal(stored.arrays[name], window.store[name])
    assert stored.arrays[name].dtype == window.store[name].dtype
  np.testing.assert_array_equal(stored.invalid_range, window.invalid_range)
  if window.episode_end_indices is None:
    assert stored.episode_end_indices is None
  else:
    np.testing.assert_array_equal(
      stored.episode_end_indices, window.episode_end_indices
    )
  expected = validity.valid_rows(
    window.store['terminal'],
    0,
    window.num_file_rows,
    window.add_count,
    window.invalid_range,
    window.episode_end_indices,
    4,
    1,
  )
  np.testing.assert_array_equal(stored.valid_rows_table(4, 1), expected)
  assert stored.valid_rows_table(4, 3) is None  # Not precomputed.
  stored.close()


def test_full_verification_decodes_every_block(dopamine_dir, store):
  source = checkpoints.find_checkpoints(dopamine_dir[0])[1]
  frames = npy_stream.read_rows(source.store_paths['observation'])
  verified = compact_store.verify_checkpoint(
    store / 'checkpoint_1', decode=True
  )
  assert verified.frames_crc32 == manifest_lib.crc32(frames)
  assert verified.manifest['suffix'] == 1


def test_damaged_block_names_checkpoint_and_rows(store, tmp_path):
  directory = _copy_checkpoint(store, 3, tmp_path)
  stored = compact_store.StoredCheckpoint(directory)
  offsets = stored.frames.offsets
  block = 20
  with open(directory / manifest_lib.BLOCKS_FILE, 'r+b') as stream:
    position = int(offsets[block] + offsets[block + 1]) // 2
    stream.seek(position)
    byte = stream.read(1)
    stream.seek(position)
    stream.write(bytes([byte[0] ^ 0xFF]))
  scratch = np.empty((16, 84, 84), np.uint8)
  stored.frames.read_block(block - 1, scratch)  # Its neighbours still read.
  with pytest.raises(
    CheckpointError, match=r'checkpoint 3: block 20 \(rows 320-335\)'
  ) as raised:
    stored.frames.read_rows(330, 2)
  assert raised.value.path.endswith(manifest_lib.BLOCKS_FILE)
  with pytest.raises(CheckpointError, match='observation.blocks: damaged'):
    compact_store.verify_checkpoint(directory)
  stored.close()


def test_truncated_blocks_file_is_a_clear_error(store, tmp_path):
  directory = _copy_checkpoint(store, 0, tmp_path)
  path = directory / manifest_lib.BLOCKS_FILE
  os.truncate(path, os.path.getsize(path) - 10)
  stored = compact_store.StoredCheckpoint(directory)
  with pytest.raises(CheckpointError, match=r'rows 992-999.*file ends'):
    stored.frames.read_rows(995, 1)
  stored.close()


def test_damaged_small_array_refused_on_opening(store, tmp_path):
  directory = _copy_checkpoint(store, 1, tmp_path)
  with open(directory / 'terminal.npy', 'r+b') as stream:
    stream.seek(-1, os.SEEK_END)
    stream.write(b'\x07')
  with pytest.raises(CheckpointError, match=r'terminal\.npy: damaged'):
    compact_store.StoredCheckpoint(directory)


def test_other_format_versions_are_refused(store, tmp_path):
  directory = _copy_checkpoint(store, 1, tmp_path)
  manifest = manifest_lib.read_manifest(directory)
  manifest['version'] = manifest_lib.VERSION + 1
  manifest_lib.write_manifest(directory, manifest)
  with pytest.raises(CheckpointError, match='format version'):
    compact_store.StoredCheckpoint(directory)


def test_gzip_directory_is_not_a_store(dopamine_dir, tmp_path):
  with pytest.raises(CheckpointError, match='convert them first'):
    manifest_lib.find_stored_checkpoints(dopamine_dir[0])
  with pytest.raises(CheckpointError, match='does not exist'):
    manifest_lib.find_stored_checkpoints(tmp_path / 'nothing')


def test_valid_rows_pack_round_trip():
  rows = np.array([0, 3, 8, 9, 15, 16, 999])
  packed = compact_store.pack_valid_rows(rows, 1000)
  assert packed.nbytes == 125
  np.testing.assert_array_equal(
    compact_store.unpack_valid_rows(packed, 1000), rows
  )
