"""CompactReplayBuffer against Dopamine's own full-buffer sampling."""

import os
import shutil

import dopamine_data
import gin
import numpy as np
import pytest
import tensorflow as tf

from fixed_replay.dataset import validity
from fixed_replay.errors import CheckpointError
from fixed_replay.replay.compact_replay_buffer import CompactReplayBuffer
from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer
from fixed_replay.replay.wrapped_fixed_replay_buffer import (
  WrappedFixedReplayBuffer,
)
from fixed_replay.store import compact_store
from fixed_replay.store import convert


def _buffer(store, **kwargs):
  kwargs.setdefault('seed', 0)
  kwargs.setdefault('prefetch', False)
  return CompactReplayBuffer(
    str(store), kwargs.pop('replay_suffix', None), **kwargs
  )


def _as_dict(buffer, batch):
  names = [e.name for e in buffer.get_transition_elements(len(batch[0]))]
  return dict(zip(names, batch, strict=True))


def _assert_equals_oracle(batch, oracle_of):
  """Each transition equals Dopamine's for its checkpoint and file row."""
  for suffix in np.unique(batch['suffix']):
    members = batch['suffix'] == suffix
    oracle = oracle_of(int(suffix))
    expected = oracle.sample_transition_batch(
      int(members.sum()), indices=batch['indices'][members]
    )
    names = [e.name for e in oracle.get_transition_elements(int(members.sum()))]
    for name, array in zip(names, expected, strict=True):
      assert batch[name].dtype == array.dtype, name
      np.testing.assert_array_equal(
        batch[name][members], array, err_msg=f'{name} of checkpoint {suffix}'
      )


@pytest.mark.parametrize('update_horizon', [1, 3])
def test_every_valid_row_equals_dopamine(
  dopamine_dir, store, oracles, update_horizon
):
  """All valid rows of all four whole files (incl. circular wrap-around)."""
  _, _, writers = dopamine_dir
  buffer = _buffer(store, update_horizon=update_horizon, gamma=0.9)
  for suffix in writers:
    oracle = oracles(suffix, update_horizon, 0.9)
    ours = buffer.shard(suffix).valid_rows
    dopamine_valid = [
      i
      for i in range(len(oracle._store['terminal']))
      if oracle.is_valid_transition(i)
    ]
    # Rows whose n-step future crosses the cursor are left out by us (the
    # file's invalid_range was written for horizon 1; Dopamine would stitch).
    stitched = set(
      (
        (oracle.cursor() - update_horizon + np.arange(update_horizon)) % 1000
      ).tolist()
    )
    assert set(ours.tolist()) <= set(dopamine_valid)
    assert set(dopamine_valid) - set(ours.tolist()) <= stitched
    batch = _as_dict(
      buffer,
      buffer.sample_transition_batch(indices=ours, suffixes=suffix),
    )
    _assert_equals_oracle(batch, lambda s, n=update_horizon: oracles(s, n, 0.9))


@pytest.mark.parametrize(
  'replay_capacity, start, update_horizon, file_start, file_end',
  [
    (250, 0, 1, 0, None),  # The first K rows of each checkpoint (1%/10%).
    (300, 400, 3, 1, 3),  # Rows in the middle; checkpoints 1 and 3 only.
    (2000, 650, 2, 2, None),  # Clipped to the end of the file.
  ],
)
def test_subsets_equal_dopamine(
  dopamine_dir,
  store,
  oracles,
  replay_capacity,
  start,
  update_horizon,
  file_start,
  file_end,
):
  directory, capacity, writers = dopamine_dir
  selected = sorted(writers)[file_start:file_end]
  options = dict(
    replay_capacity=replay_capacity,
    replay_transitions_start_index=start,
    update_horizon=update_horizon,
    replay_file_start_index=file_start,
    replay_file_end_index=file_end,
  )
  buffer = _buffer(store, **options)
  assert buffer.loaded_suffixes == selected
  # Same valid rows as FixedReplayBuffer's windows of the gzip files.
  reference = FixedReplayBuffer(
    str(directory),
    num_buffers_to_load=len(selected),
    prefetch=False,
    **options,
  )
  for suffix in selected:
    np.testing.assert_array_equal(
      buffer.shard(suffix).valid_rows,
      reference.shard(suffix).valid_rows,
    )
  end = min(start + replay_capacity, capacity)
  for _ in range(4):
    batch = _as_dict(buffer, buffer.sample_transition_batch(500))
    assert set(batch['suffix']) <= set(selected)
    assert batch['indices'].min() >= start + 3
    assert batch['indices'].max() < end - update_horizon
    _assert_equals_oracle(batch, lambda s, n=update_horizon: oracles(s, n))


def test_prefetched_minibatches_mix_checkpoints_uniformly(
  dopamine_dir, store, oracles
):
  _, _, writers = dopamine_dir
  buffer = _buffer(store, prefetch=True, num_workers=2, batch_size=64)
  counts = {s: buffer.shard(s).num_valid for s in writers}
  batches = [
    _as_dict(buffer, buffer.sample_transition_batch()) for _ in range(60)
  ]
  for batch in batches[:3]:
    assert len(np.unique(batch['suffix'])) > 1
    _assert_equals_oracle(batch, oracles)
  suffixes = np.concatenate([b['suffix'] for b in batches])
  expected = {s: c / sum(counts.values()) for s, c in counts.items()}
  for s in writers:
    assert abs(np.mean(suffixes == s) - expected[s]) < 0.03
  # The threads draw independent streams: no minibatch comes twice.
  assert len({b['indices'].tobytes() for b in batches}) == len(batches)
  buffer.close()


def test_one_checkpoint_per_minibatch_option(store):
  buffer = _buffer(store, mix_checkpoints=False)
  drawn = set()
  for _ in range(20):
    suffixes = _as_dict(buffer, buffer.sample_transition_batch(32))['suffix']
    assert len(np.unique(suffixes)) == 1
    drawn.add(int(suffixes[0]))
  assert len(drawn) > 1


def test_same_seed_same_batches(store):
  first = _buffer(store, seed=3).sample_transition_batch(32)
  second = _buffer(store, seed=3).sample_transition_batch(32)
  third = _buffer(store, seed=4).sample_transition_batch(32)
  for a, b in zip(first, second, strict=True):
    np.testing.assert_array_equal(a, b)
  assert not np.array_equal(first[7], third[7])


def test_memory_is_bounded_by_the_budget(store):
  # The smallest cache that two threads can share: fewer slots than the
  # store's 4 x 63 blocks, so sampling has to evict.
  buffer = _buffer(store, cache_bytes=1, num_workers=1)
  block_bytes = buffer.cache.arena[0].nbytes
  assert buffer.cache.num_slots < 4 * 63
  assert buffer.cache.nbytes == buffer.cache.num_slots * block_bytes
  for _ in range(20):
    buffer.sample_transition_batch(128)
  assert buffer.cache.misses > buffer.cache.num_slots
  # Beyond the cache: 13 bytes a row, the block index, the ready batches.
  batch_bytes = sum(
    np.dtype(e.type).itemsize * np.prod(e.shape)
    for e in buffer.get_transition_elements()
  )
  assert buffer.nbytes - buffer.cache.nbytes <= (
    4 * 1000 * 13 + 4 * 64 * 12 + (4 + 1) * batch_bytes
  )
  with pytest.raises(MemoryError, match='memory_budget'):
    _buffer(store, memory_budget=1 << 20)


def test_damaged_block_error_names_checkpoint_and_rows(store, tmp_path):
  damaged = tmp_path / 'store'
  shutil.copytree(store, damaged)
  directory = damaged / 'checkpoint_1'
  offsets = np.load(directory / compact_store.OFFSETS_FILE)
  with open(directory / compact_store.BLOCKS_FILE, 'r+b') as stream:
    stream.seek(int(offsets[30]) + 5)
    stream.write(b'\xde\xad\xbe\xef')
  buffer = _buffer(damaged)
  match = r'checkpoint 1: block 30 \(rows 480-495\)'
  with pytest.raises(CheckpointError, match=match):
    buffer.sample_transition_batch(indices=[490], suffixes=1)
  buffer.sample_transition_batch(indices=[520], suffixes=1)  # Others read.
  background = _buffer(
    damaged, replay_suffix=1, prefetch=True, num_workers=1, batch_size=512
  )
  with pytest.raises(CheckpointError, match=match):
    for _ in range(50):  # Some minibatch soon draws a row of block 30.
      background.sample_transition_batch()
  background.close()


def test_invalid_indices_are_refused(store):
  buffer = _buffer(store, replay_suffix=0)
  with pytest.raises(ValueError, match=r'Rows \[1\] of checkpoint 0'):
    buffer.sample_transition_batch(2, indices=[1, 500])
  with pytest.raises(ValueError, match='say which'):
    _buffer(store).sample_transition_batch(1, indices=[500])
  with pytest.raises(ValueError, match=r'\[5\] are not loaded'):
    _buffer(store).sample_transition_batch(1, indices=[500], suffixes=5)


def test_store_must_match_what_the_agent_asks(store, dopamine_dir):
  with pytest.raises(CheckpointError, match=r'shape \(84, 84\), expected'):
    _buffer(store, observation_shape=(42, 42))
  with pytest.raises(CheckpointError, match='convert them first'):
    _buffer(dopamine_dir[0])


def test_read_only_and_dopamine_api(store, tmp_path):
  buffer = _buffer(store, batch_size=8)
  element, metadata = buffer.sample(with_sample_metadata=True)
  assert element.state.shape == (8, 84, 84, 4)
  assert element.is_terminal.dtype == bool
  assert metadata.keys.shape == (8,)
  assert buffer.sample(size=3).action.shape == (3,)
  assert buffer.is_valid_transition(500, suffix=1)
  assert not buffer.is_valid_transition(1, suffix=0)
  assert int(buffer.add_count) == 4 * 1000
  buffer.reload_buffer()
  buffer.reload_data()
  assert buffer.loaded_suffixes == [0, 1, 3, 7]
  with pytest.raises(NotImplementedError, match='read-only'):
    buffer.add(np.zeros((84, 84), np.uint8), 0, 0.0, False)
  buffer.save(str(tmp_path), 0)
  assert os.listdir(tmp_path) == []


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
  os.mkdir(tmp_path / 'gzip')
  writer.save(str(tmp_path / 'gzip'), 0)
  convert.convert(tmp_path / 'gzip', tmp_path / 'store', workers=0)
  buffer = _buffer(tmp_path / 'store', extra_storage_types=extra)
  batch = _as_dict(buffer, buffer.sample_transition_batch(64))
  oracle = dopamine_data.load_oracle(
    tmp_path / 'gzip', 0, 300, extra_storage_types=extra
  )
  _assert_equals_oracle(batch, lambda s: oracle)
  assert 'logits' in batch


def test_gin_binding_selects_it_for_tf_agents(dopamine_dir, store, oracles):
  import fixed_replay.replay.compact_replay_buffer  # noqa: F401 - registers it.

  gin.parse_config(
    [
      'WrappedFixedReplayBuffer.memory_class = @CompactReplayBuffer',
      'CompactReplayBuffer.num_workers = 1',
      'CompactReplayBuffer.batch_size = 16',
    ]
  )
  try:
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
      replay = WrappedFixedReplayBuffer(
        data_dir=str(store),
        replay_suffix=None,
        observation_shape=(84, 84),
        stack_size=4,
      )
      assert isinstance(replay.memory, CompactReplayBuffer)
      assert replay.states.shape.as_list() == [16, 84, 84, 4]
      first = session.run(replay.transition)
      second = session.run(replay.transition)
  finally:
    gin.clear_config()
  assert not np.array_equal(first['indices'], second['indices'])
  _assert_equals_oracle(first, oracles)
  replay.memory.close()


def test_valid_rows_of_other_horizons_are_computed(dopamine_dir, store):
  """The table is precomputed for n=1; other horizons match validity.py."""
  buffer = _buffer(store, update_horizon=4, replay_suffix=7)
  stored = compact_store.StoredCheckpoint(store / 'checkpoint_7')
  expected = validity.valid_rows(
    np.asarray(stored.arrays['terminal']),
    0,
    stored.num_rows,
    stored.add_count,
    stored.invalid_range,
    stored.episode_end_indices,
    4,
    4,
  )
  np.testing.assert_array_equal(buffer.shard(7).valid_rows, expected)
  stored.close()


def test_one_gin_binding_selects_it_for_jax_and_tf_agents(store):
  """`replay_buffer_class.memory_class` reaches the JAX agents too."""
  from dopamine.discrete_domains import atari_lib

  from fixed_replay import agents

  agents.agent_class('jax_dqn')
  gin.parse_config(
    [
      'import fixed_replay.replay.compact_replay_buffer',
      'replay_buffer_class.memory_class = @CompactReplayBuffer',
      'CompactReplayBuffer.num_workers = 1',
      'CompactReplayBuffer.batch_size = 8',
    ]
  )
  try:
    environment = atari_lib.create_atari_environment('Pong')
    agent = agents.create_agent(None, environment, 'jax_dqn', str(store))
    try:
      assert isinstance(agent.replay, CompactReplayBuffer)
      for _ in range(2 * agent.update_period):
        agent.train_step()
      assert agent.replay_batches == 2
      assert np.isfinite(float(next(iter(agent.last_losses.values()))))
    finally:
      agent.close()
      agent.replay.close()
    with tf.Graph().as_default():
      replay = WrappedFixedReplayBuffer(
        data_dir=str(store),
        replay_suffix=None,
        observation_shape=(84, 84),
        stack_size=4,
      )
      assert isinstance(replay.memory, CompactReplayBuffer)
      replay.memory.close()
  finally:
    gin.clear_config()
