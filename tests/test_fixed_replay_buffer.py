"""FixedReplayBuffer against Dopamine's own full-buffer sampling."""

import hashlib
import logging
import os

import dopamine_data
import numpy as np
import pytest

from fixed_replay.dataset import checkpoints
from fixed_replay.errors import CheckpointError
from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer


def _buffer(directory, **kwargs):
  kwargs.setdefault('num_buffers_to_load', 4)
  kwargs.setdefault('prefetch', False)
  kwargs.setdefault('seed', 0)
  return FixedReplayBuffer(
    str(directory), kwargs.pop('replay_suffix', None), **kwargs
  )


def _as_dict(buffer, batch):
  names = [e.name for e in buffer.get_transition_elements(len(batch[0]))]
  return dict(zip(names, batch, strict=True))


def _assert_equals_oracle(batch, oracles):
  """Each transition equals Dopamine's for the same checkpoint and file row."""
  for suffix in np.unique(batch['suffix']):
    members = batch['suffix'] == suffix
    oracle = oracles[int(suffix)]
    expected = oracle.sample_transition_batch(
      int(members.sum()), indices=batch['indices'][members]
    )
    names = [e.name for e in oracle.get_transition_elements(int(members.sum()))]
    for name, array in zip(names, expected, strict=True):
      assert batch[name].dtype == array.dtype, name
      np.testing.assert_array_equal(
        batch[name][members], array, err_msg=f'{name} of checkpoint {suffix}'
      )


@pytest.mark.parametrize(
  'replay_capacity, start, update_horizon',
  [
    (1_000_000, 0, 1),  # Whole files, circular as in Dopamine.
    (1_000_000, 0, 3),
    (250, 0, 1),  # Window at the start of each file.
    (300, 400, 3),  # In the middle, across some cursors.
    (200, 800, 5),  # At the end of each file.
    (2000, 650, 2),  # Larger than what is left: clipped to the end.
  ],
)
def test_transitions_equal_dopamine(
  dopamine_dir, replay_capacity, start, update_horizon
):
  directory, capacity, writers = dopamine_dir
  oracles = {
    s: dopamine_data.load_oracle(
      directory, s, capacity, update_horizon=update_horizon, gamma=0.9
    )
    for s in writers
  }
  buffer = _buffer(
    directory,
    replay_capacity=replay_capacity,
    replay_transitions_start_index=start,
    update_horizon=update_horizon,
    gamma=0.9,
  )
  window_end = min(start + replay_capacity, capacity)
  seen = 0
  for _ in range(8):
    batch = _as_dict(buffer, buffer.sample_transition_batch(512))
    _assert_equals_oracle(batch, oracles)
    for suffix in np.unique(batch['suffix']):
      rows = batch['indices'][batch['suffix'] == suffix]
      assert all(
        oracles[int(suffix)].is_valid_transition(int(i))
        for i in np.unique(rows)
      )
      if replay_capacity < capacity:
        # Neither the stack nor the n-step future leaves the window.
        assert rows.min() - 3 >= start
        assert rows.max() + update_horizon < window_end
    seen += len(batch['indices'])
  assert seen == 8 * 512


def test_every_valid_row_matches_dopamine(dopamine_dir):
  """All valid rows of a whole file, not just a sample."""
  directory, capacity, writers = dopamine_dir
  buffer = _buffer(directory, update_horizon=3, gamma=0.99)
  for suffix in writers:
    oracle = dopamine_data.load_oracle(
      directory, suffix, capacity, update_horizon=3
    )
    rows = np.array(
      [i for i in range(capacity) if oracle.is_valid_transition(i)]
    )
    # The file's invalid_range was written for horizon 1; rows whose 3-step
    # future crosses the cursor are left out by us (Dopamine would stitch).
    stitched = set(((oracle.cursor() - 3 + np.arange(2)) % capacity).tolist())
    ours = buffer.shard(suffix).valid_rows
    assert set(rows.tolist()) - set(ours.tolist()) <= stitched
    batch = _as_dict(
      buffer,
      buffer.sample_transition_batch(len(ours), indices=ours, suffixes=suffix),
    )
    _assert_equals_oracle(batch, {suffix: oracle})


def test_minibatches_mix_checkpoints_uniformly(dopamine_dir):
  directory, _, writers = dopamine_dir
  buffer = _buffer(directory)
  counts = {s: buffer.shard(s).num_valid for s in writers}
  suffixes = np.concatenate(
    [
      _as_dict(buffer, buffer.sample_transition_batch(256))['suffix']
      for _ in range(40)
    ]
  )
  share = {s: np.mean(suffixes == s) for s in writers}
  expected = {s: c / sum(counts.values()) for s, c in counts.items()}
  for s in writers:
    assert abs(share[s] - expected[s]) < 0.02, (share, expected)
  one_batch = _as_dict(buffer, buffer.sample_transition_batch(64))['suffix']
  assert len(np.unique(one_batch)) > 1


def test_one_checkpoint_per_minibatch_option(dopamine_dir):
  buffer = _buffer(dopamine_dir[0], mix_checkpoints=False)
  drawn = set()
  for _ in range(20):
    suffixes = _as_dict(buffer, buffer.sample_transition_batch(32))['suffix']
    assert len(np.unique(suffixes)) == 1
    drawn.add(int(suffixes[0]))
  assert len(drawn) > 1


def test_same_seed_same_batches(dopamine_dir):
  first = _buffer(dopamine_dir[0], seed=3).sample_transition_batch(32)
  second = _buffer(dopamine_dir[0], seed=3).sample_transition_batch(32)
  third = _buffer(dopamine_dir[0], seed=4).sample_transition_batch(32)
  for a, b in zip(first, second, strict=True):
    np.testing.assert_array_equal(a, b)
  assert not np.array_equal(first[-2], third[-2])


def test_suffix_zero_is_a_checkpoint(dopamine_dir):
  buffer = _buffer(dopamine_dir[0], replay_suffix=0)
  assert buffer.loaded_suffixes == [0]
  batch = _as_dict(buffer, buffer.sample_transition_batch(16))
  assert set(batch['suffix']) == {0}
  buffer.reload_buffer()  # A fixed suffix stays loaded.
  assert buffer.loaded_suffixes == [0]


def test_capacity_beyond_file_uses_whole_file_and_says_so(dopamine_dir, caplog):
  with caplog.at_level(logging.INFO):
    buffer = _buffer(
      dopamine_dir[0], replay_capacity=5000, replay_transitions_start_index=100
    )
  assert caplog.text.count('reaches past the 1000 rows') == 1
  assert all(
    buffer.shard(s).window.num_rows == 900 for s in buffer.loaded_suffixes
  )


def test_bad_configurations_are_clear_errors(dopamine_dir, tmp_path):
  directory = dopamine_dir[0]
  with pytest.raises(ValueError, match='replay_transitions_start_index=1000'):
    _buffer(directory, replay_transitions_start_index=1000)
  with pytest.raises(ValueError, match='replay_suffix=2: no complete'):
    _buffer(directory, replay_suffix=2)
  with pytest.raises(CheckpointError, match='does not exist'):
    _buffer(tmp_path / 'missing')
  with pytest.raises(ValueError, match='select none'):
    _buffer(directory, replay_file_start_index=9)


def test_more_buffers_than_checkpoints_uses_all_and_warns_once(
  dopamine_dir, caplog
):
  # A partial download under a config asking for more (the *_1pct.gin load
  # 50, batch_rl's runner reloads with num_buffers=5).
  directory, _, writers = dopamine_dir
  buffer = _buffer(directory, num_buffers_to_load=50)
  assert buffer.loaded_suffixes == sorted(writers)
  buffer.reload_buffer(num_buffers=5)
  buffer.reload_data()
  assert buffer.loaded_suffixes == sorted(writers)
  assert caplog.text.count('num_buffers_to_load=50 but') == 1
  assert 'has 4 usable checkpoint(s) [0, 1, 3, 7]: using all of them' in (
    caplog.text
  )
  assert 'num_buffers_to_load=5 but' not in caplog.text  # Once per buffer.


def test_memory_budget_refuses_before_allocating(dopamine_dir):
  directory = dopamine_dir[0]
  # Each 1000-row window: 1000 * (7056 + 4 + 4 + 1 + 8) bytes.
  per_checkpoint = 1000 * (84 * 84 + 4 + 4 + 1 + 8)
  with pytest.raises(MemoryError, match=r'needs 28.29 MB but only 20.00 MB'):
    _buffer(directory, memory_budget=20_000_000)
  buffer = _buffer(
    directory,
    num_buffers_to_load=2,
    memory_budget=4 * per_checkpoint,
    prefetch=True,
  )
  assert not buffer.rolling  # 2 held + 2 prefetched fit.
  buffer.close()


def test_prefetch_swaps_in_new_sets(dopamine_dir):
  directory, _, writers = dopamine_dir
  buffer = _buffer(directory, num_buffers_to_load=2, prefetch=True, seed=1)
  seen = [tuple(buffer.loaded_suffixes)]
  for _ in range(6):
    buffer.reload_buffer()
    loaded = buffer.loaded_suffixes
    assert len(set(loaded)) == 2 and set(loaded) <= set(writers)
    seen.append(tuple(loaded))
    buffer.sample_transition_batch(32)
  assert len(set(seen)) > 1
  buffer.close()


def test_rolling_replacement_when_double_buffering_does_not_fit(dopamine_dir):
  directory, capacity, writers = dopamine_dir
  per_checkpoint = capacity * (84 * 84 + 4 + 4 + 1 + 8)
  buffer = _buffer(
    directory,
    num_buffers_to_load=2,
    prefetch=True,
    seed=2,
    memory_budget=3 * per_checkpoint,
  )
  rolled = [buffer.rolling]
  for _ in range(12):
    buffer.reload_buffer()
    rolled.append(buffer.rolling)
    assert len(buffer.loaded_suffixes) == 2
    assert buffer.nbytes <= 3 * per_checkpoint
    buffer.sample_transition_batch(32)
  # A set sharing a checkpoint with the loaded one double-buffers within the
  # budget; a set of two new ones must be rolled in one at a time.
  assert any(rolled)
  buffer.close()


def test_dataset_is_read_only(dopamine_dir, tmp_path):
  directory = dopamine_dir[0]

  def digest():
    return {
      name: hashlib.sha256(
        open(os.path.join(directory, name), 'rb').read()
      ).hexdigest()
      for name in sorted(os.listdir(directory))
    }

  before = digest()
  buffer = _buffer(directory)
  buffer.save(str(directory), 0)
  buffer.save(str(tmp_path), 0)
  buffer.load(str(directory), 0)
  with pytest.raises(NotImplementedError, match='read-only'):
    buffer.add(np.zeros((84, 84), np.uint8), 0, 0.0, False)
  assert digest() == before
  assert os.listdir(tmp_path) == []


def test_invalid_indices_are_refused(dopamine_dir):
  buffer = _buffer(dopamine_dir[0], replay_suffix=0)
  with pytest.raises(ValueError, match=r'Rows \[1\] of checkpoint 0'):
    buffer.sample_transition_batch(2, indices=[1, 500])
  with pytest.raises(ValueError, match='say which'):
    _buffer(dopamine_dir[0]).sample_transition_batch(1, indices=[500])


def test_jax_sample_api(dopamine_dir):
  buffer = _buffer(dopamine_dir[0], batch_size=8)
  element, metadata = buffer.sample(with_sample_metadata=True)
  assert element.state.shape == (8, 84, 84, 4)
  assert element.next_state.shape == (8, 84, 84, 4)
  assert element.is_terminal.dtype == bool and element.reward.shape == (8,)
  assert metadata.keys.shape == (8,)
  assert buffer.sample(size=3).action.shape == (3,)


def test_extra_storage_types_are_returned(tmp_path):
  from dopamine.tf.replay_memory import circular_replay_buffer

  extra = [circular_replay_buffer.ReplayElement('logits', (3,), np.float32)]
  writer = dopamine_data.make_buffer(300, extra_storage_types=extra)
  frames, _ = dopamine_data.pong_frames(280)
  rng = np.random.default_rng(0)
  for i in range(280):
    writer.add(
      frames[i], 1, 0.5, i % 50 == 49, rng.random(3).astype(np.float32)
    )
  writer.save(str(tmp_path), 0)
  buffer = _buffer(tmp_path, replay_suffix=0, extra_storage_types=extra)
  batch = _as_dict(buffer, buffer.sample_transition_batch(64))
  oracle = dopamine_data.load_oracle(
    tmp_path, 0, 300, extra_storage_types=extra
  )
  _assert_equals_oracle(batch, {0: oracle})
  assert 'logits' in batch


def test_checkpoint_files_found_once(dopamine_dir):
  assert len(checkpoints.find_checkpoints(dopamine_dir[0])) == 4


def test_reload_without_prefetch_keeps_shared_checkpoints(dopamine_dir):
  """Holding every checkpoint, a reload must not read anything again."""
  buffer = _buffer(dopamine_dir[0], num_buffers_to_load=4, prefetch=True)
  shards = {s: buffer.shard(s) for s in buffer.loaded_suffixes}
  buffer.reload_buffer()
  assert {s: buffer.shard(s) for s in buffer.loaded_suffixes} == shards
  partial = _buffer(dopamine_dir[0], num_buffers_to_load=3, seed=5)
  before = {s: partial.shard(s) for s in partial.loaded_suffixes}
  partial.reload_buffer()
  for shard in map(partial.shard, partial.loaded_suffixes):
    if shard.suffix in before:
      assert shard is before[shard.suffix]


def test_dopamine_labs_jax_fixed_replay_buffer_runs_on_ours(dopamine_dir):
  # Dopamine's own class (dopamine/labs/offline_rl/fixed_replay.py, which
  # imports batch_rl's module, i.e. ours), built with its positional order:
  # data_dir, observation_shape, stack_size, replay_capacity, batch_size,
  # replay_suffix, replay_file_start_index, replay_file_end_index,
  # replay_transitions_start_index, num_buffers_to_load.
  from dopamine.labs.offline_rl import fixed_replay as labs

  directory, capacity, _ = dopamine_dir
  buffer = labs.JaxFixedReplayBuffer(
    str(directory), (84, 84), 4, 300, 16, None, 0, None, 400, 2
  )
  try:
    assert isinstance(buffer, FixedReplayBuffer)
    assert buffer.replay_capacity == 300
    assert len(buffer.loaded_suffixes) == 2
    for suffix in buffer.loaded_suffixes:
      window = buffer.shard(suffix).window
      assert (window.start, window.num_rows) == (400, 300)
    element, metadata = buffer.sample(with_sample_metadata=True)
    assert element.state.shape == (16, 84, 84, 4)
    batch = _as_dict(buffer, buffer.sample_transition_batch(64))
    oracles = {
      s: dopamine_data.load_oracle(directory, s, capacity)
      for s in buffer.loaded_suffixes
    }
    _assert_equals_oracle(batch, oracles)
    buffer.reload_data()  # Dopamine's reload: its num_buffers_to_load.
    assert len(buffer.loaded_suffixes) == 2
  finally:
    buffer.close()
