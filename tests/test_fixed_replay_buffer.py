"""What FixedReplayBuffer adds to the contract: sets of checkpoints in RAM.

The transitions themselves are checked against Dopamine in
test_replay_contract.py.
"""

import logging

import dopamine_data
import pytest
from replay_oracle import as_dict
from replay_oracle import assert_equals_oracle

from fixed_replay.errors import CheckpointError
from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer
from fixed_replay.sources.dopamine import checkpoints


def _buffer(directory, **kwargs):
  kwargs.setdefault('num_buffers_to_load', 4)
  kwargs.setdefault('prefetch', False)
  kwargs.setdefault('seed', 0)
  return FixedReplayBuffer(
    str(directory), kwargs.pop('replay_suffix', None), **kwargs
  )


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
  with pytest.raises(CheckpointError, match='missing: no such directory'):
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
    batch = as_dict(buffer, buffer.sample_transition_batch(64))
    oracles = {
      s: dopamine_data.load_oracle(directory, s, capacity)
      for s in buffer.loaded_suffixes
    }
    assert_equals_oracle(batch, oracles.__getitem__)
    buffer.reload_data()  # Dopamine's reload: its num_buffers_to_load.
    assert len(buffer.loaded_suffixes) == 2
  finally:
    buffer.close()
