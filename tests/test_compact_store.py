"""The compact store's format: what convert writes and how it is read."""

import os
import re
import shutil
import subprocess
import sys

import dopamine_data
import numpy as np
import pytest
from replay_oracle import as_dict
from replay_oracle import assert_equals_oracle

from fixed_replay.convert import compact_output
from fixed_replay.convert import legacy_store
from fixed_replay.errors import CheckpointError
from fixed_replay.io import npy_stream
from fixed_replay.replay.compact_replay_buffer import CompactReplayBuffer
from fixed_replay.sources.dopamine import checkpoints
from fixed_replay.sources.dopamine import validity
from fixed_replay.store import checkpoint_tables
from fixed_replay.store import compact_store
from fixed_replay.store import manifest as manifest_lib


def _copy_checkpoint(store, suffix, tmp_path):
  """A copy of one checkpoint, and of its run's dictionary (version 4)."""
  target = tmp_path / 'store' / manifest_lib.checkpoint_dirname(suffix)
  shutil.copytree(store / manifest_lib.checkpoint_dirname(suffix), target)
  dictionary = store / manifest_lib.RUN_DICTIONARY_FILE
  if dictionary.exists():
    shutil.copy(dictionary, target.parent / manifest_lib.RUN_DICTIONARY_FILE)
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
  assert observation['codec'] == 'zstd' and observation['block_rows'] == 1
  assert observation['layout'] == 'units'
  assert observation['num_blocks'] == capacity
  assert observation['row_shape'] == [84, 84]
  # Format version 6: the units and one file of tables, the per-row ones
  # narrow, and the dictionary the run's, beside the checkpoints.
  assert set(manifest['files']) == {'observation.units', 'tables'}
  assert set(manifest['tables']['layout']) == {
    'unit_crc32',
    'unit_sizes',
    'unit_anchors',
    'action',
    'reward',
    'terminal',
    'invalid_range',
    'episode_end_indices',
    'valid_mask',
  }
  directory = store / 'checkpoint_7'
  tables = checkpoint_tables.CheckpointTables(directory, manifest)
  # Each table starts a page of its own.
  for entry in manifest['tables']['layout'].values():
    assert entry['offset'] % checkpoint_tables.ALIGN == 0
  # The writers' actions (0-17) take a byte a row, and read back as
  # Dopamine's int32; their rewards have fractions, and stay float32.
  assert tables['action'].dtype == np.uint8
  assert tables['reward'].dtype == np.float32
  assert manifest['arrays']['action']['dtype'] == np.dtype(np.int32).str
  assert manifest['arrays']['reward']['dtype'] == np.dtype(np.float32).str
  sizes = tables['unit_sizes'].astype(np.int64)
  offsets = np.concatenate([[0], np.cumsum(sizes)])
  assert observation['anchor_units'] == manifest_lib.ANCHOR_UNITS
  np.testing.assert_array_equal(
    tables['unit_anchors'],
    offsets[: len(sizes) : manifest_lib.ANCHOR_UNITS],
  )
  assert offsets[-1] == os.path.getsize(directory / 'observation.units')
  assert observation['run_dictionary'] == manifest_lib.file_entry(
    store / manifest_lib.RUN_DICTIONARY_FILE
  )
  # The 2 header bytes every unit was written without (as hex).
  assert 0 <= observation['unit_header'] < 1 << 16
  for name, entry in manifest['files'].items():
    path = store / 'checkpoint_7' / name
    assert os.path.getsize(path) == entry['bytes'], name
  # Every file of the source is accounted for.
  assert set(manifest['source']['files']) == {
    os.path.basename(p)
    for p in checkpoints.find_checkpoints(source)[7].all_paths()
  }


def test_old_layout_describes_itself(blocks_store, dopamine_dir):
  capacity = dopamine_dir[1]
  manifest = manifest_lib.read_manifest(
    blocks_store / 'checkpoint_7', manifest_lib.LEGACY_VERSIONS
  )
  assert manifest['version'] == 1
  observation = manifest['observation']
  assert observation['file'] == 'observation.blocks'
  assert observation['block_rows'] == 16
  assert observation['num_blocks'] == -(-capacity // 16)


@pytest.mark.parametrize('suffix', [0, 3, 7])
def test_arrays_equal_the_source(dopamine_dir, store, suffix):
  source = checkpoints.find_checkpoints(dopamine_dir[0])[suffix]
  window = checkpoints.read_checkpoint(source)
  stored = compact_store.StoredCheckpoint(
    store / manifest_lib.checkpoint_dirname(suffix)
  )
  # Rows Dopamine's writer never filled hold np.empty's leftovers, which
  # may differ between processes. (A conversion checks every byte of them
  # against its source.)
  filled = min(stored.add_count, stored.num_rows)
  frames = stored.frames
  everything = frames.read_rows(0, frames.num_rows)
  np.testing.assert_array_equal(
    everything[:filled], window.store['observation'][:filled]
  )
  # A range across blocks, ending in the short last block (1000 = 62*16 + 8).
  np.testing.assert_array_equal(frames.read_rows(985, 15), everything[985:])
  for name in ('action', 'reward', 'terminal'):
    array = stored.arrays[name]
    np.testing.assert_array_equal(array[:filled], window.store[name][:filled])
    assert array.dtype == window.store[name].dtype
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


def _flip_byte(path, position):
  with open(path, 'r+b') as stream:
    stream.seek(position)
    byte = stream.read(1)
    stream.seek(position)
    stream.write(bytes([byte[0] ^ 0xFF]))


def test_damaged_block_of_an_old_store_names_checkpoint_and_rows(
  blocks_store, tmp_path
):
  directory = _copy_checkpoint(blocks_store, 3, tmp_path)
  stored = legacy_store.LegacyCheckpoint(directory)
  offsets = np.load(directory / legacy_store.OFFSETS_FILE)
  block = 20
  _flip_byte(
    directory / 'observation.blocks',
    int(offsets[block] + offsets[block + 1]) // 2,
  )
  stored.frames.read_rows(319, 1)  # Its neighbours still read.
  with pytest.raises(
    CheckpointError, match=r'checkpoint 3: unit 20 \(rows 320-335\)'
  ) as raised:
    stored.frames.read_rows(330, 2)
  assert raised.value.path.endswith('observation.blocks')
  stored.close()


def test_damaged_unit_names_checkpoint_unit_and_rows(store, tmp_path):
  directory = _copy_checkpoint(store, 3, tmp_path)
  stored = compact_store.StoredCheckpoint(directory)
  unit = 330
  starts, ends = stored.frames.unit_spans([unit])
  _flip_byte(directory / manifest_lib.UNITS_FILE, int(starts[0] + ends[0]) // 2)
  np.testing.assert_array_equal(  # Its neighbours still read.
    stored.frames.read_frames([329, 331]).shape, (2, 84, 84)
  )
  with pytest.raises(
    CheckpointError, match=r'checkpoint 3: unit 330 \(rows 330-330\).*CRC'
  ) as raised:
    stored.frames.read_rows(328, 4)
  assert raised.value.path.endswith(manifest_lib.UNITS_FILE)
  with pytest.raises(CheckpointError, match='observation.units: damaged'):
    compact_store.verify_checkpoint(directory)
  stored.close()


def test_a_damaged_or_missing_run_dictionary_is_refused(store, tmp_path):
  """Checked when a checkpoint first maps it, even unverified."""
  directory = _copy_checkpoint(store, 7, tmp_path)
  path = directory.parent / manifest_lib.RUN_DICTIONARY_FILE
  _flip_byte(path, os.path.getsize(path) // 2)
  with pytest.raises(
    CheckpointError, match=rf'but {directory} was compressed against'
  ) as raised:
    compact_store.StoredCheckpoint(directory)
  assert raised.value.path == str(path)
  with pytest.raises(CheckpointError, match='was compressed against'):
    compact_store.verify_checkpoint(directory)
  os.remove(path)
  with pytest.raises(
    CheckpointError, match=f"missing: {directory} decodes against its run's"
  ):
    compact_store.StoredCheckpoint(directory)


@pytest.mark.parametrize('table', ['unit_sizes', 'unit_anchors', 'unit_crc32'])
def test_a_damaged_index_is_refused_before_decoding(store, tmp_path, table):
  directory = _copy_checkpoint(store, 7, tmp_path)
  manifest = manifest_lib.read_manifest(directory)
  path = directory / checkpoint_tables.FILE
  _flip_byte(path, manifest['tables']['layout'][table]['offset'] + 3)
  # Even unverified opening checks them: nothing decodes with a bad one.
  with pytest.raises(
    CheckpointError,
    match=rf'tables: checkpoint 7: block \d+ .*table {table}\) ' 'is damaged',
  ):
    compact_store.StoredCheckpoint(directory)


def test_truncated_frames_file_is_a_clear_error(store, blocks_store, tmp_path):
  directory = _copy_checkpoint(store, 0, tmp_path)
  path = directory / 'observation.units'
  os.truncate(path, os.path.getsize(path) - 10)
  stored = compact_store.StoredCheckpoint(directory)
  with pytest.raises(CheckpointError, match=r'rows 999-999.*file ends'):
    stored.frames.read_rows(999, 1)
  stored.close()
  directory = _copy_checkpoint(blocks_store, 0, tmp_path / 'old')
  path = directory / 'observation.blocks'
  os.truncate(path, os.path.getsize(path) - 10)
  with pytest.raises(CheckpointError, match='index does not span') as raised:
    legacy_store.LegacyCheckpoint(directory)
  assert raised.value.path == str(path)


@pytest.mark.parametrize('table', ['terminal', 'valid_mask'])
def test_damaged_small_array_refused_on_opening(store, tmp_path, table):
  """A store's tables are mapped, with no other check than their blocks'."""
  directory = _copy_checkpoint(store, 1, tmp_path)
  manifest = manifest_lib.read_manifest(directory)
  entry = manifest['tables']['layout'][table]
  _flip_byte(directory / checkpoint_tables.FILE, entry['offset'] + 1)
  with pytest.raises(CheckpointError, match=rf'table {table}\) is damaged'):
    compact_store.StoredCheckpoint(directory)


def test_a_truncated_tables_file_is_refused(store, tmp_path):
  directory = _copy_checkpoint(store, 1, tmp_path)
  path = directory / checkpoint_tables.FILE
  os.truncate(path, os.path.getsize(path) - checkpoint_tables.BLOCK_BYTES)
  with pytest.raises(CheckpointError, match='bytes, manifest says') as raised:
    compact_store.StoredCheckpoint(directory)
  assert raised.value.path == str(path)


def test_a_rerun_into_a_store_of_an_older_version_is_refused(
  dopamine_dir, store, tmp_path
):
  """Only the newest version is written: no store mixes versions by rerun."""
  from fixed_replay.convert import convert

  old = tmp_path / 'store'
  shutil.copytree(store, old)
  directory = old / manifest_lib.checkpoint_dirname(3)
  manifest = manifest_lib.read_manifest(directory)
  manifest['version'] = 2
  manifest_lib.write_manifest(directory, manifest)
  with pytest.raises(
    CheckpointError,
    match=r'checkpoint_3/manifest.json: format version 2, written by an '
    r'earlier fixed_replay, is no longer sampled: `fixed-replay convert ',
  ):
    convert.convert(dopamine_dir[0], old, workers=0)


@pytest.mark.parametrize('header', [None, '0060', 1.5, -1, 1 << 16])
def test_a_damaged_unit_header_is_named(store, tmp_path, header):
  directory = _copy_checkpoint(store, 1, tmp_path)
  manifest = manifest_lib.read_manifest(directory)
  manifest['observation']['unit_header'] = header
  manifest_lib.write_manifest(directory, manifest)
  with pytest.raises(
    CheckpointError, match=r'manifest\.json: damaged manifest: .*unit_header'
  ):
    compact_store.StoredCheckpoint(directory)


def test_newer_format_version_is_refused_as_newer(store, tmp_path):
  directory = _copy_checkpoint(store, 1, tmp_path)
  manifest = manifest_lib.read_manifest(directory)
  manifest['version'] = manifest_lib.VERSION + 1
  manifest_lib.write_manifest(directory, manifest)
  with pytest.raises(
    CheckpointError,
    match=rf'format version {manifest_lib.VERSION + 1} is newer than this '
    rf'fixed_replay reads \(versions 1-{manifest_lib.VERSION}\): upgrade',
  ):
    compact_store.StoredCheckpoint(directory)
  manifest['version'] = 0
  manifest_lib.write_manifest(directory, manifest)
  with pytest.raises(CheckpointError, match='format version 0'):
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


def _cli(*args):
  return subprocess.run(
    [sys.executable, '-m', 'fixed_replay.cli', *map(str, args)],
    capture_output=True,
    text=True,
  )


def test_inspect_names_the_format_version_and_settings(store):
  manifest = manifest_lib.read_manifest(store / 'checkpoint_0')
  spec = manifest['observation']
  completed = _cli('inspect', store)
  assert completed.returncode == 0, completed.stderr[-2000:]
  # The version and the settings the frames were written with.
  entry = spec['run_dictionary']  # The run's dictionary, named.
  assert (
    f"compact store format version {manifest['version']} ({spec['codec']} "
    f"frame units of {spec['block_rows']}, clevel {spec['clevel']}, the "
    f"run's dictionary of {entry['bytes']:,} bytes, CRC-32 "
    f"{entry['crc32']:#010x});"
  ) in completed.stdout


@pytest.mark.parametrize(
  ('old_store', 'old_version'),
  [
    ('blocks_store', 1),
    ('units_v2_store', 2),
    ('packed_v3_store', 3),
    ('run_dictionary_v4_store', 4),
    ('plain_v5_store', 5),
  ],
)
def test_an_old_store_is_refused_with_the_command_that_upgrades_it(
  request, old_store, old_version, dopamine_dir, oracles, tmp_path
):
  """A buffer and `inspect` name `fixed-replay convert OLD NEW`; run, it
  rewrites the store without its source, into the same transitions."""
  old_store = request.getfixturevalue(old_store)
  upgrade = (
    rf'format version {old_version}, written by an earlier fixed_replay, is '
    rf'no longer sampled: `fixed-replay convert {old_store} NEW_STORE` '
    rf'rewrites the store in version {manifest_lib.VERSION}'
  )
  with pytest.raises(CheckpointError, match=re.escape(upgrade)):
    CompactReplayBuffer(str(old_store), seed=0, prefetch=False)
  completed = _cli('inspect', old_store)
  assert completed.returncode != 0
  assert completed.stdout.count('old format') == len(dopamine_dir[2])
  assert upgrade in ' '.join(completed.stderr.split())
  rewritten = tmp_path / 'rewritten'
  completed = _cli('convert', old_store, rewritten, '--workers=0')
  assert completed.returncode == 0, completed.stderr[-3000:]
  for suffix in dopamine_dir[2]:
    name = manifest_lib.checkpoint_dirname(suffix)
    old = manifest_lib.read_manifest(
      old_store / name, manifest_lib.LEGACY_VERSIONS
    )
    new = manifest_lib.read_manifest(rewritten / name)
    assert (old['version'], new['version']) == (
      old_version,
      manifest_lib.VERSION,
    )
    units = [
      (store / name / manifest['observation']['file']).read_bytes()
      for store, manifest in ((old_store, old), (rewritten, new))
    ]
    # From version 4 on, the run's dictionary is kept, and the units are
    # the same bytes (version 5's copied: test_version_5_units_are_kept).
    assert (units[0] == units[1]) == (old_version >= 4)
    if old_version == 2:  # The same units; smaller tables and dictionary.
      assert compact_output.store_bytes(rewritten / name) < (
        compact_output.store_bytes(old_store / name)
      )
    # Same data, described by the same original source files.
    assert new['source'] == old['source']
    assert (
      new['observation']['frames_crc32'] == (old['observation']['frames_crc32'])
    )
  buffer = CompactReplayBuffer(str(rewritten), seed=0, prefetch=False)
  try:
    assert_equals_oracle(
      as_dict(buffer, buffer.sample_transition_batch(256)), oracles
    )
  finally:
    buffer.close()


def test_inspect_verify_flags_the_checkpoint_whose_frames_differ(mixed_store):
  """Three Pong checkpoints and a CartPole one: the odd one is named."""
  from fixed_replay.store import store_inspection

  mixed = mixed_store
  summary = store_inspection.summarize_data(str(mixed), verify=True)
  flagged = {s.suffix: s.problems for s in summary.checkpoints if s.problems}
  assert list(flagged) == [1], flagged
  (problem,) = flagged[1]
  assert problem.path == 'checkpoint_1'
  assert 'rows of shape (4, 1) float64' in problem.problem
  assert '(84, 84) uint8' in problem.problem


@pytest.mark.parametrize(
  ('values', 'dtype'),
  [
    (np.array([0, 17, 255], np.int32), np.uint8),  # Atari's actions.
    (np.array([-1, 127], np.int32), np.int8),
    (np.array([0, 300], np.int64), np.uint16),
    (np.array([0, 65535], np.uint16), np.uint16),  # Not int8's -1.
    (np.array([0, 200], np.uint32), np.uint8),
    (np.array([[0.0, 1.0], [200.0, 4.0]], np.float32), np.uint8),
    (np.array([-0.0, 1.0], np.float32), np.float32),  # -0.0's own bits.
    (np.array([0.5, np.nan], np.float32), np.float32),
    (np.array([2**40], np.int64), np.int64),
    (np.array([True, False]), np.bool_),
  ],
)
def test_arrays_are_stored_as_narrow_as_their_bytes_allow(values, dtype):
  narrow = compact_output.narrowest(values)
  assert narrow.dtype == dtype
  assert narrow.astype(values.dtype).tobytes() == values.tobytes()


@pytest.mark.parametrize('dtype', [np.uint16, np.uint32, np.int16])
def test_unit_sizes_read_in_any_unsigned_width(store, tmp_path, dtype):
  """The decoder reads sizes of 1, 2 or 4 bytes (the writer picks the
  narrowest); a signed sizes file is refused, naming the anchors' check."""
  directory = _copy_checkpoint(store, 3, tmp_path)
  stored = compact_store.StoredCheckpoint(directory)
  expected = stored.frames.read_rows(0, stored.num_rows)
  stored.close()
  manifest = manifest_lib.read_manifest(directory)
  tables = checkpoint_tables.CheckpointTables(directory, manifest)
  dopamine_data.rewrite_tables(
    directory, unit_sizes=tables['unit_sizes'].astype(dtype)
  )
  del tables
  if np.dtype(dtype).kind != 'u':
    with pytest.raises(CheckpointError, match='checkpoint 3: sizes of int16'):
      compact_store.StoredCheckpoint(directory)
    return
  stored = compact_store.StoredCheckpoint(directory)
  np.testing.assert_array_equal(
    stored.frames.read_rows(0, stored.num_rows), expected
  )
  stored.close()


def test_the_runs_dictionary_learns_only_the_written_rows(
  dopamine_dir, tmp_path
):
  """Checkpoint 0 is not full: its rows past the cursor are what np.empty
  gave Dopamine. Two copies that differ only there train one dictionary."""
  import gzip

  from fixed_replay.convert import convert

  dictionaries = []
  for fill in (None, 255):
    source = tmp_path / f'source_{fill}'
    source.mkdir()
    for path in dopamine_dir[0].glob('*_ckpt.0.gz'):
      shutil.copy(path, source)
    if fill is not None:
      path = source / '$store$_observation_ckpt.0.gz'
      with gzip.open(path) as stream:
        frames = np.load(stream)
      with gzip.open(source / 'add_count_ckpt.0.gz') as stream:
        written = int(np.load(stream))
      assert 0 < written < len(frames)
      frames[written:] = fill
      with gzip.open(path, 'wb') as stream:
        np.save(stream, frames)
    store = tmp_path / f'store_{fill}'
    convert.convert(str(source), str(store), workers=0)
    dictionaries.append((store / manifest_lib.RUN_DICTIONARY_FILE).read_bytes())
  assert dictionaries[0] and dictionaries[0] == dictionaries[1]


@pytest.mark.parametrize(
  ('old_store', 'kept'),
  [('run_dictionary_v4_store', False), ('plain_v5_store', True)],
)
def test_version_5_units_are_kept(request, old_store, kept):
  """An upgrade copies units encoded as the newest version's (version 5)
  rather than decoding and encoding them again: hours a run, not minutes."""
  from fixed_replay.convert import checkpoint_source

  directory = request.getfixturevalue(old_store) / 'checkpoint_3'
  spec = manifest_lib.read_manifest(directory, manifest_lib.ALL_VERSIONS)[
    'observation'
  ]
  source = checkpoint_source.StoredSource(str(directory), 3)
  arguments = (spec['block_rows'], spec['clevel'], spec['run_dictionary'])
  with source.open() as reader:
    assert reader.keep_units(spec['block_rows'] + 1, *arguments[1:]) is None
    found = reader.keep_units(*arguments)
    assert (found is not None) == kept
    if kept:
      units, index, kept_spec, rows = found
      assert units == str(directory / 'observation.units')
      assert kept_spec == spec and rows == 1000
      assert len(index['unit_crc32']) == spec['num_blocks']
      # Its frames were not read: finishing trusts the units' own checks.
      assert reader.finish(rows).add_count > 0
