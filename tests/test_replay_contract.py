"""The contract FixedReplayBuffer keeps over every source, against Dopamine.

Each test runs over every kind of data FixedReplayBuffer reads, decided from
the files: Dopamine's checkpoint files given as their directory
(`replay_logs/`), as the run directory above it, and the same checkpoints
converted into a compact store. For any valid (checkpoint, file row) the
buffer must return exactly the transition Dopamine's `OutOfGraphReplayBuffer`
loaded with the whole file returns. What differs between the sources
(loading in sets, the block cache, the store's checks) is tested in
test_fixed_replay_buffer.py and test_compact_replay_buffer.py.
"""

import hashlib
import os

import dopamine_data
import numpy as np
import pytest
from replay_oracle import as_dict
from replay_oracle import assert_equals_oracle

from fixed_replay.convert import convert
from fixed_replay.replay import frame_sources
from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer

# The `dopamine_dir`, `store` and `oracles` fixtures come from conftest.py.

SOURCES = ['replay_logs', 'run', 'store']


def _make(source, data_dir, **kwargs):
  """FixedReplayBuffer over `data_dir`, sampling in the caller, seeded."""
  kwargs.setdefault('seed', 0)
  kwargs.setdefault('prefetch', False)
  kwargs.setdefault('sampling_threads', 0)
  if source != 'store':  # A store samples every checkpoint when unbound.
    kwargs.setdefault('num_buffers_to_load', 4)
  suffix = kwargs.pop('replay_suffix', None)
  return FixedReplayBuffer(str(data_dir), suffix, **kwargs)


def _run_dir(replay_logs, parent):
  """A run directory whose replay_logs/ links to `replay_logs`' files."""
  logs = parent / 'run' / 'replay_logs'
  if not logs.exists():
    logs.mkdir(parents=True)
    for name in os.listdir(replay_logs):
      os.link(os.path.join(replay_logs, name), logs / name)
  return logs.parent


@pytest.fixture(scope='module')
def sources(dopamine_dir, tmp_path_factory):
  """{source: directory} of conftest's four checkpoints, built lazily."""
  parent = tmp_path_factory.mktemp('sources')
  built = {}

  def get(source, request):
    if source not in built:
      if source == 'store':
        built[source] = request.getfixturevalue('store')
      elif source == 'run':
        built[source] = _run_dir(dopamine_dir[0], parent)
      else:
        built[source] = dopamine_dir[0]
    return built[source]

  return get


@pytest.fixture(params=SOURCES)
def make(request, sources):
  """make(**kwargs): FixedReplayBuffer over one source of the checkpoints."""
  built = []

  def build(**kwargs):
    directory = sources(request.param, request)
    built.append(_make(request.param, directory, **kwargs))
    return built[-1]

  build.source = request.param
  build.directory = lambda: sources(request.param, request)
  yield build
  for buffer in built:
    buffer.close()


@pytest.mark.parametrize(
  'replay_capacity, start, update_horizon, file_start, file_end',
  [
    (1_000_000, 0, 1, 0, None),  # Whole files, circular as in Dopamine.
    (1_000_000, 0, 3, 0, None),
    (250, 0, 1, 0, None),  # The first K rows of each checkpoint (1%/10%).
    (300, 400, 3, 1, 3),  # Rows in the middle; checkpoints 1 and 3 only.
    (200, 800, 5, 0, None),  # At the end of each file.
    (2000, 650, 2, 2, None),  # Larger than what is left: clipped.
  ],
)
def test_transitions_equal_dopamine(
  make,
  dopamine_dir,
  oracles,
  replay_capacity,
  start,
  update_horizon,
  file_start,
  file_end,
):
  if make.source == 'run' and (replay_capacity, start) != (300, 400):
    pytest.skip('a run directory holds the same files as its replay_logs/')
  _, capacity, writers = dopamine_dir
  selected = sorted(writers)[file_start:file_end]
  buffer = make(
    replay_capacity=replay_capacity,
    replay_transitions_start_index=start,
    update_horizon=update_horizon,
    gamma=0.9,
    replay_file_start_index=file_start,
    replay_file_end_index=file_end,
  )
  assert sorted(buffer.loaded_suffixes) == selected
  window_end = min(start + replay_capacity, capacity)
  for _ in range(4):
    batch = as_dict(buffer, buffer.sample_transition_batch(500))
    assert set(batch['suffix']) <= set(selected)
    assert_equals_oracle(batch, lambda s, n=update_horizon: oracles(s, n, 0.9))
    for suffix in np.unique(batch['suffix']):
      oracle = oracles(int(suffix), update_horizon, 0.9)
      rows = np.unique(batch['indices'][batch['suffix'] == suffix])
      assert all(oracle.is_valid_transition(int(i)) for i in rows)
    if replay_capacity < capacity:
      # Neither the stack nor the n-step future leaves the window.
      assert batch['indices'].min() - 3 >= start
      assert batch['indices'].max() + update_horizon < window_end


# 10: an n-step sum of 8 or more terms, which numpy adds pairwise.
@pytest.mark.parametrize('update_horizon', [1, 3, 10])
def test_every_valid_row_equals_dopamine(
  make, dopamine_dir, oracles, update_horizon
):
  """All valid rows of all four whole files (incl. circular wrap-around)."""
  _, capacity, writers = dopamine_dir
  buffer = make(update_horizon=update_horizon, gamma=0.9)
  for suffix in writers:
    oracle = oracles(suffix, update_horizon, 0.9)
    ours = buffer.shard(suffix).valid_rows
    dopamine_valid = [
      i for i in range(capacity) if oracle.is_valid_transition(i)
    ]
    # Rows whose n-step future crosses the cursor are left out by us (the
    # file's invalid_range was written for horizon 1; Dopamine would stitch).
    stitched = set(
      (
        (oracle.cursor() - update_horizon + np.arange(update_horizon))
        % capacity
      ).tolist()
    )
    assert set(ours.tolist()) <= set(dopamine_valid)
    assert set(dopamine_valid) - set(ours.tolist()) <= stitched
    batch = as_dict(
      buffer,
      buffer.sample_transition_batch(indices=ours, suffixes=suffix),
    )
    assert_equals_oracle(batch, lambda s, n=update_horizon: oracles(s, n, 0.9))


def test_minibatches_mix_checkpoints_uniformly(make, dopamine_dir):
  _, _, writers = dopamine_dir
  buffer = make()
  counts = {s: buffer.shard(s).num_valid for s in writers}
  suffixes = np.concatenate(
    [
      as_dict(buffer, buffer.sample_transition_batch(256))['suffix']
      for _ in range(40)
    ]
  )
  expected = {s: c / sum(counts.values()) for s, c in counts.items()}
  for s in writers:
    assert abs(np.mean(suffixes == s) - expected[s]) < 0.02
  one_batch = as_dict(buffer, buffer.sample_transition_batch(64))['suffix']
  assert len(np.unique(one_batch)) > 1


def test_one_checkpoint_per_minibatch_option(make):
  buffer = make(mix_checkpoints=False)
  drawn = set()
  for _ in range(20):
    suffixes = as_dict(buffer, buffer.sample_transition_batch(32))['suffix']
    assert len(np.unique(suffixes)) == 1
    drawn.add(int(suffixes[0]))
  assert len(drawn) > 1


@pytest.mark.parametrize('threads', [0, 1])
def test_same_seed_same_batches(make, threads):
  """Seeded streams repeat, sampled in the caller or by one thread."""

  def stream(seed):
    buffer = make(seed=seed, sampling_threads=threads)
    return [buffer.sample_transition_batch(32) for _ in range(3)]

  first, second, third = stream(3), stream(3), stream(4)
  for batch_a, batch_b in zip(first, second, strict=True):
    for a, b in zip(batch_a, batch_b, strict=True):
      np.testing.assert_array_equal(a, b)
  assert not np.array_equal(first[0][7], third[0][7])


def test_invalid_indices_are_refused(make):
  with pytest.raises(ValueError, match=r'Rows \[1\] of checkpoint 0'):
    make(replay_suffix=0).sample_transition_batch(2, indices=[1, 500])
  buffer = make()
  with pytest.raises(ValueError, match='say which'):
    buffer.sample_transition_batch(1, indices=[500])
  with pytest.raises(ValueError, match=r'\[5\] are not loaded'):
    buffer.sample_transition_batch(1, indices=[500], suffixes=5)


def test_suffix_zero_is_a_checkpoint(make):
  buffer = make(replay_suffix=0)
  assert buffer.loaded_suffixes == [0]
  assert set(as_dict(buffer, buffer.sample_transition_batch(16))['suffix']) == {
    0
  }
  buffer.reload_buffer()  # A fixed suffix stays loaded.
  buffer.reload_data()
  assert buffer.loaded_suffixes == [0]


def test_dopamine_and_jax_api(make):
  buffer = make(batch_size=8)
  # Whatever holds the frames (ShardFrames, BlockFrames) is a FrameSource.
  assert isinstance(buffer.source, frame_sources.FrameSource)
  element, metadata = buffer.sample(with_sample_metadata=True)
  assert element.state.shape == element.next_state.shape == (8, 84, 84, 4)
  assert element.is_terminal.dtype == bool and element.reward.shape == (8,)
  assert metadata.keys.shape == (8,)
  assert buffer.sample(size=3).action.shape == (3,)
  assert buffer.is_valid_transition(500, suffix=1)
  assert not buffer.is_valid_transition(1, suffix=0)
  assert int(buffer.add_count) == 4 * 1000
  assert buffer.num_valid_transitions == sum(
    buffer.shard(s).num_valid for s in buffer.loaded_suffixes
  )
  suffixes, rows = buffer.sample_index_batch(64)
  for suffix, row in zip(suffixes, rows, strict=True):
    assert buffer.is_valid_transition(row, suffix=suffix)


def test_dataset_is_read_only(make, tmp_path):
  buffer = make()
  directory = make.directory()

  def digest():
    digests = {}
    for parent, _, names in os.walk(directory):
      for name in names:
        path = os.path.join(parent, name)
        with open(path, 'rb') as f:
          digests[path] = hashlib.sha256(f.read()).hexdigest()
    return digests

  before = digest()
  buffer.save(str(directory), 0)
  buffer.save(str(tmp_path), 0)
  buffer.load(str(directory), 0)
  with pytest.raises(NotImplementedError, match='read-only'):
    buffer.add(np.zeros((84, 84), np.uint8), 0, 0.0, False)
  assert digest() == before
  assert os.listdir(tmp_path) == []


@pytest.fixture(scope='module')
def extra_sources(tmp_path_factory):
  """{source: directory} of a checkpoint Dopamine saved with two extras.

  `unclipped_reward` (the game's reward, as a conversion of RL Unplugged
  data keeps it) and a vector element, written by Dopamine's own `add` and
  `save`; and the extras and the oracle (Dopamine's `load` of the files).
  """
  from dopamine.tf.replay_memory import circular_replay_buffer

  element = circular_replay_buffer.ReplayElement
  extras = [
    element('unclipped_reward', (), np.float32),
    element('logits', (3,), np.float32),
  ]
  parent = tmp_path_factory.mktemp('extras')
  writer = dopamine_data.make_buffer(300, extra_storage_types=extras)
  frames, rewards = dopamine_data.pong_frames(280)
  rng = np.random.default_rng(0)
  for i in range(280):
    game_reward = np.float32(rewards[i] * 10 + rng.integers(3))
    writer.add(
      frames[i],
      1,
      float(np.clip(game_reward, -1, 1)),
      i % 50 == 49,
      game_reward,
      rng.random(3).astype(np.float32),
    )
  os.mkdir(parent / 'gzip')
  writer.save(str(parent / 'gzip'), 0)
  convert.convert(parent / 'gzip', parent / 'store', workers=0)
  directories = {
    'replay_logs': parent / 'gzip',
    'run': _run_dir(parent / 'gzip', parent),
    'store': parent / 'store',
  }
  oracle = dopamine_data.load_oracle(
    parent / 'gzip', 0, 300, extra_storage_types=extras
  )
  return directories, extras, oracle


@pytest.mark.parametrize('source', SOURCES)
def test_extra_storage_types_are_returned(source, extra_sources):
  """Each extra element at the transition's own row, as Dopamine reads it."""
  directories, extras, oracle = extra_sources
  buffer = _make(source, directories[source], extra_storage_types=extras)
  try:
    batch = as_dict(buffer, buffer.sample_transition_batch(64))
    assert_equals_oracle(batch, lambda s: oracle)
    valid = buffer.shard(0).valid_rows
    every = as_dict(
      buffer, buffer.sample_transition_batch(indices=valid, suffixes=0)
    )
    assert_equals_oracle(every, lambda s: oracle)
    assert (every['unclipped_reward'] != every['reward']).any()
    assert every['logits'].shape == (len(valid), 3)
  finally:
    buffer.close()
  plain = _make(source, directories[source])
  assert 'unclipped_reward' not in as_dict(
    plain, plain.sample_transition_batch(4)
  )
  plain.close()
