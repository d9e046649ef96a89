"""RL Unplugged shards converted: sampled exactly as Dopamine after `add`.

The oracle of each checkpoint is a Dopamine OutOfGraphReplayBuffer that
`add`ed the checkpoint's episodes in episode_idx order (rlu_data.oracle).
Every valid row of every converted checkpoint must be valid there too (and
the other way round) and give the same transition, for both outputs: the
compact store read by CompactReplayBuffer, and Dopamine's files read by
Dopamine's own `load` and by FixedReplayBuffer.
"""

import os

import numpy as np
import pytest
import rlu_data

from fixed_replay.convert import convert
from fixed_replay.convert import dopamine_output
from fixed_replay.convert import rlu_convert
from fixed_replay.convert.convert_options import ConvertOptions
from fixed_replay.replay.compact_replay_buffer import CompactReplayBuffer
from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer
from fixed_replay.sources.dopamine import checkpoints
from fixed_replay.store import compact_store
from fixed_replay.store import manifest as manifest_lib

CHECKPOINTS = (0, 1, 2)


@pytest.fixture(scope='module')
def stores(rlu_dir, tmp_path_factory):
  """{(run, format): store directory}, converted in this process."""
  directory, _ = rlu_dir
  converted = {}
  for run in (1, 2):
    for output_format in ('compact', 'dopamine'):
      store = tmp_path_factory.mktemp(f'run{run}_{output_format}')
      result = rlu_convert.convert_rlu(
        directory,
        store,
        run=run,
        options=ConvertOptions(output_format=output_format),
        # Once in worker processes (sources travel pickled), else here.
        workers=2 if (run, output_format) == (1, 'compact') else 0,
      )
      assert result.converted == list(CHECKPOINTS), result
      converted[run, output_format] = (store, result)
  return converted


def _names(buffer, size):
  return [e.name for e in buffer.get_transition_elements(size)]


def _assert_same_transitions(ours, oracle, rows):
  """Each element of our batch equals the oracle's at the same rows."""
  expected = oracle.sample_transition_batch(len(rows), indices=rows)
  for name, want in zip(_names(oracle, len(rows)), expected, strict=True):
    got = ours[name]
    assert got.dtype == want.dtype, name
    np.testing.assert_array_equal(got, want, err_msg=name)


def _batch_dict(buffer, batch):
  return dict(zip(_names(buffer, len(batch[0])), batch, strict=False))


@pytest.mark.parametrize('run', [1, 2])
@pytest.mark.parametrize('update_horizon', [1, 3])
def test_compact_store_samples_what_dopamine_samples(
  rlu_dir, stores, run, update_horizon
):
  _, episodes = rlu_dir
  store, _ = stores[run, 'compact']
  buffer = CompactReplayBuffer(
    str(store),
    None,
    update_horizon=update_horizon,
    gamma=0.9,
    seed=0,
    prefetch=False,
  )
  try:
    for checkpoint in CHECKPOINTS:
      played = episodes[run, checkpoint]
      oracle = rlu_data.oracle(played, update_horizon=update_horizon, gamma=0.9)
      rows = rlu_data.rows_of(played)
      dopamine_valid = rlu_data.valid_rows(oracle, rows + 1)
      ours = buffer.shard(checkpoint).valid_rows
      assert ours.tolist() == dopamine_valid, checkpoint
      batch = buffer.sample_transition_batch(
        len(ours), indices=ours, suffixes=checkpoint
      )
      _assert_same_transitions(_batch_dict(buffer, batch), oracle, ours)
  finally:
    buffer.close()


@pytest.mark.parametrize('run', [1, 2])
def test_dopamine_files_load_in_dopamine_and_fixed_replay(rlu_dir, stores, run):
  _, episodes = rlu_dir
  store, _ = stores[run, 'dopamine']
  for checkpoint in CHECKPOINTS:
    played = episodes[run, checkpoint]
    oracle = rlu_data.oracle(played)
    rows = rlu_data.rows_of(played)
    # Dopamine's own load, into a buffer of the file's rows.
    loaded = rlu_data.make_buffer(rows + 1)
    loaded.load(str(store), checkpoint)
    valid = rlu_data.valid_rows(oracle, rows + 1)
    assert rlu_data.valid_rows(loaded, rows + 1) == valid
    batch = loaded.sample_transition_batch(len(valid), indices=valid)
    _assert_same_transitions(_batch_dict(loaded, batch), oracle, valid)
    assert loaded.episode_end_indices == oracle.episode_end_indices

  buffer = FixedReplayBuffer(
    str(store),
    None,
    num_buffers_to_load=len(CHECKPOINTS),
    prefetch=False,
    seed=0,
  )
  try:
    for checkpoint in CHECKPOINTS:
      played = episodes[run, checkpoint]
      oracle = rlu_data.oracle(played)
      valid = rlu_data.valid_rows(oracle, rlu_data.rows_of(played) + 1)
      batch = _batch_dict(
        buffer,
        buffer.sample_transition_batch(
          len(valid), indices=valid, suffixes=checkpoint
        ),
      )
      _assert_same_transitions(batch, oracle, valid)
  finally:
    buffer.close()


def test_both_outputs_hold_the_same_rows(stores):
  """The compact store and Dopamine's files of a run agree row for row."""
  compact, _ = stores[1, 'compact']
  files, _ = stores[1, 'dopamine']
  found = checkpoints.find_checkpoints(files)
  for checkpoint in CHECKPOINTS:
    stored = compact_store.StoredCheckpoint(
      compact / manifest_lib.checkpoint_dirname(checkpoint)
    )
    window = checkpoints.read_checkpoint(found[checkpoint])
    try:
      frames = stored.frames.read_rows(0, stored.num_rows)
      np.testing.assert_array_equal(frames, window.store['observation'])
      for name, array in stored.arrays.items():
        np.testing.assert_array_equal(array, window.store[name])
      assert stored.add_count == window.add_count
      np.testing.assert_array_equal(stored.invalid_range, window.invalid_range)
      np.testing.assert_array_equal(
        stored.episode_end_indices, window.episode_end_indices
      )
    finally:
      stored.close()


def test_every_route_writes_the_same_store(stores, tmp_path):
  """Shards straight to a store, or through Dopamine's files: one default.

  The same frames get the same settings and (within 1%) the same size.
  """
  straight, _ = stores[1, 'compact']
  files, _ = stores[1, 'dopamine']
  through_files = tmp_path / 'through_files'
  convert.convert(str(files), str(through_files), workers=0)
  for checkpoint in CHECKPOINTS:
    name = manifest_lib.checkpoint_dirname(checkpoint)
    manifests = [
      manifest_lib.read_manifest(store / name)
      for store in (straight, through_files)
    ]
    settings = [
      (m['version'], {k: m['observation'][k] for k in _SETTINGS})
      for m in manifests
    ]
    assert settings[0] == settings[1], checkpoint
    assert manifests[0]['version'] == manifest_lib.VERSION
    sizes = [_store_bytes(store / name) for store in (straight, through_files)]
    assert abs(sizes[0] - sizes[1]) <= 0.01 * sizes[1], (checkpoint, sizes)


_SETTINGS = ('codec', 'clevel', 'block_rows', 'layout')


def _store_bytes(directory):
  return sum(path.stat().st_size for path in directory.iterdir())


def test_published_layout_reads_each_shard_once(stores):
  """Run 1: every checkpoint from its own shard in the first round."""
  store, result = stores[1, 'compact']
  for checkpoint in CHECKPOINTS:
    manifest = manifest_lib.read_manifest(
      store / manifest_lib.checkpoint_dirname(checkpoint)
    )
    assert list(manifest['source']['files']) == [
      f'run_1-{checkpoint:05d}-of-00003'
    ]
  assert result.frames == sum(
    manifest_lib.read_manifest(store / manifest_lib.checkpoint_dirname(c))[
      'num_rows'
    ]
    for c in CHECKPOINTS
  )


def test_checkpoints_spread_over_shards_are_assembled(rlu_dir, stores):
  """Run 2: checkpoints 1 and 2 take episodes from two shards."""
  _, episodes = rlu_dir
  store, _ = stores[2, 'dopamine']
  expected_files = {
    0: ['run_2-00000-of-00003'],
    1: ['run_2-00000-of-00003', 'run_2-00001-of-00003'],
    2: ['run_2-00001-of-00003', 'run_2-00002-of-00003'],
  }
  output = dopamine_output.DopamineOutput()
  for checkpoint, files in expected_files.items():
    source = output.stored_source(str(store), checkpoint)
    assert sorted(source['files']) == files
    played = episodes[2, checkpoint]
    assert source['episodes'] == len(played)
    assert source['first_episode'] == played[0].episode_idx
  # Nothing but the checkpoints' files and our bookkeeping in DST.
  names = sorted(n for n in os.listdir(store) if not n.startswith('.'))
  # Dopamine's seven, plus the two extra elements RL Unplugged records.
  assert len(names) == 9 * len(CHECKPOINTS), names
  for c in CHECKPOINTS:
    assert f'$store$_unclipped_reward_ckpt.{c}.gz' in names
    assert f'$store$_episode_idx_ckpt.{c}.gz' in names


def test_rerun_checks_and_skips(rlu_dir, stores):
  directory, _ = rlu_dir
  for run in (1, 2):
    store, _ = stores[run, 'compact']
    result = rlu_convert.convert_rlu(directory, store, run=run, workers=0)
    assert result.converted == [] and result.skipped == list(CHECKPOINTS)
