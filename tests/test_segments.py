"""SegmentSampler against Dopamine: every step of every segment is its row's.

The oracle is Dopamine's own buffer loaded from each checkpoint's files: a
step's stack, action, reward and terminal are its
`sample_transition_batch(indices=[row])`, and its return-to-go and timestep
are recomputed here by walking the raw arrays row by row.
"""

import numpy as np
import pytest

from fixed_replay import segments

# The `dopamine_dir`, `store` and `oracles` fixtures come from
# conftest.py.


def _ends(oracle):
  """Rows that end an episode: terminal, or cut (episode_end_indices)."""
  ends = set(np.flatnonzero(oracle._store['terminal']).tolist())
  return ends | {int(i) for i in oracle.episode_end_indices}


def _age(oracle, row):
  """The place of `row` in writing order (0: the oldest row held)."""
  if oracle.is_full():
    return (row - oracle.cursor()) % oracle._replay_capacity
  return row


def _walk(oracle, row, step):
  """The rows from `row` on (step 1) or back (step -1), in writing order.

  Stops at the writer's oldest or newest row.
  """
  capacity = oracle._replay_capacity
  count = capacity if oracle.is_full() else oracle.cursor()
  oldest = oracle.cursor() if oracle.is_full() else 0
  age = _age(oracle, row)
  while 0 <= age < count:
    yield (oldest + age) % capacity
    age += step


def expected_return_to_go(oracle, row):
  """The rewards from `row` to its episode's end, summed one by one."""
  ends, total = _ends(oracle), 0.0
  for r in _walk(oracle, row, 1):
    total += float(oracle._store['reward'][r])
    if r in ends:
      return total
  raise AssertionError(f'row {row} is in an episode that never ends')


def first_step(oracle, row):
  """(first valid row of row's episode, whether the episode began in the
  data): walks back to the previous episode's end."""
  ends, first, begun = _ends(oracle), row, False
  for r in list(_walk(oracle, row, -1))[1:]:
    if r in ends:
      begun = True
      break
    if oracle.is_valid_transition(r):
      first = r
  else:
    begun = not oracle.is_full()
  return first, begun


def assert_segments_are_dopamines(batch, oracle_of, keep_cut=False):
  """Each unpadded step equals Dopamine's transition for its row."""
  size, length = batch['mask'].shape
  for b in range(size):
    suffix = int(batch['suffix'][b])
    oracle = oracle_of(suffix)
    steps = batch['mask'][b]
    rows = batch['indices'][b][steps]
    state, action, reward, _, _, _, terminal, _ = (
      oracle.sample_transition_batch(len(rows), indices=rows)
    )
    np.testing.assert_array_equal(batch['observation'][b][steps], state)
    np.testing.assert_array_equal(batch['action'][b][steps], action)
    np.testing.assert_array_equal(batch['reward'][b][steps], reward)
    np.testing.assert_array_equal(batch['terminal'][b][steps], terminal)
    assert all(oracle.is_valid_transition(int(r)) for r in rows)
    assert not any(int(r) in _ends(oracle) for r in rows[:-1]), 'two episodes'
    # Consecutive rows in writing order.
    walked = list(_walk(oracle, int(rows[0]), 1))[: len(rows)]
    np.testing.assert_array_equal(rows, walked)
    np.testing.assert_allclose(
      batch['return_to_go'][b][steps],
      [expected_return_to_go(oracle, int(r)) for r in rows],
      rtol=1e-6,
    )
    first, begun = first_step(oracle, int(rows[0]))
    assert begun or keep_cut, f'row {rows[0]} of an episode cut at the start'
    distance = _age(oracle, int(rows[0])) - _age(oracle, first)
    np.testing.assert_array_equal(
      batch['timestep'][b][steps], distance + np.arange(len(rows))
    )
    padded = ~batch['mask'][b]
    assert (batch['indices'][b][padded] == -1).all()
    assert not batch['observation'][b][padded].any()
    assert not batch['return_to_go'][b][padded].any()


def _source(request, name):
  if name == 'files':
    return str(request.getfixturevalue('dopamine_dir')[0])
  return str(request.getfixturevalue(name))


PAD = {'pad_short': True, 'uniform_over': 'episodes'}
CUT = {'keep_cut_episodes': True}


@pytest.mark.parametrize(
  'name, options',
  [
    ('files', {}),
    ('files', PAD),
    ('files', CUT),
    ('store', {}),
    ('store', PAD),
    ('store', CUT),
  ],
)
def test_every_step_is_dopamines(request, name, options, oracles):
  """On files and stores: ends, wraps, cuts and padding."""
  keep_cut = options.get('keep_cut_episodes', False)
  sampler = segments.SegmentSampler(
    _source(request, name),
    segment_length=16,
    batch_size=64,
    seed=0,
    replay_capacity=1000,
    num_buffers_to_load=4,
    **options,
  )
  try:
    seen = dict.fromkeys(['ends', 'wraps', 'cursor', 'cut', 'padded'], 0)
    for _ in range(5):
      batch = sampler.sample()
      assert batch['observation'].shape == (64, 16, 84, 84, 4)
      assert batch['suffix'].dtype == np.int32
      assert_segments_are_dopamines(batch, oracles, keep_cut)
      for b in range(64):
        oracle = oracles(int(batch['suffix'][b]))
        rows = batch['indices'][b][batch['mask'][b]]
        seen['ends'] += int(rows[-1]) in _ends(oracle)
        seen['wraps'] += bool((np.diff(rows) < 0).any())
        ages = [_age(oracle, int(r)) for r in rows]
        seen['cursor'] += oracle.is_full() and (
          min(ages) < 20 or max(ages) >= oracle._replay_capacity - 20
        )
        seen['cut'] += not first_step(oracle, int(rows[0]))[1]
        seen['padded'] += not batch['mask'][b].all()
    assert seen['ends'] and seen['wraps'] and seen['cursor'], seen
    assert bool(seen['cut']) == keep_cut, seen
    assert bool(seen['padded']) == options.get('pad_short', False), seen
  finally:
    sampler.close()


def _digest(batch):
  return {name: np.asarray(array).tobytes() for name, array in batch.items()}


def test_a_seed_reproduces_the_stream(store):
  first, second = (
    segments.SegmentSampler(store, segment_length=40, batch_size=8, seed=3)
    for _ in range(2)
  )
  try:
    batches = [first.sample() for _ in range(3)]
    assert [_digest(b) for b in batches] == [
      _digest(second.sample()) for _ in range(3)
    ]
    assert _digest(batches[0]) != _digest(batches[1])
  finally:
    first.close()
    second.close()


def test_a_batch_still_held_is_never_overwritten(store):
  sampler = segments.SegmentSampler(store, segment_length=8, batch_size=4)
  try:
    held = sampler.sample()
    kept = _digest(held)
    for _ in range(5):
      sampler.sample()
    assert _digest(held) == kept
    view = held['observation'][0]
    del held
    for _ in range(5):
      sampler.sample()
    assert view.base is not None and view.shape == (8, 84, 84, 4)
  finally:
    sampler.close()


@pytest.mark.parametrize(
  'arguments, message',
  [
    ({'segment_length': 400}, 'no segment of 400 steps'),
    ({'update_horizon': 3}, 'update_horizon must be 1'),
    ({'uniform_over': 'rows'}, 'uniform_over'),
    ({'batch_size': 0}, 'must be >= 1'),
  ],
)
def test_arguments_it_cannot_serve_are_named(store, arguments, message):
  with pytest.raises(ValueError, match=message):
    segments.SegmentSampler(store, **arguments)


@pytest.fixture(scope='module')
def game_score_sources(tmp_path_factory):
  """Files and a store of a checkpoint Dopamine saved with `unclipped_reward`
  (the game's reward, which conversions of RL Unplugged keep), and the
  Dopamine buffer that wrote them."""
  from dopamine.tf.replay_memory import circular_replay_buffer
  import dopamine_data

  from fixed_replay.convert import convert

  extra = circular_replay_buffer.ReplayElement(
    'unclipped_reward', (), np.float32
  )
  writer = dopamine_data.make_buffer(300, extra_storage_types=[extra])
  frames, rewards = dopamine_data.pong_frames(280)
  for i in range(280):
    game_reward = np.float32(rewards[i] * 10 + i % 3)
    terminal = i % 50 == 49
    writer.add(
      frames[i], 1, float(np.clip(game_reward, -1, 1)), terminal, game_reward
    )
  parent = tmp_path_factory.mktemp('game_scores')
  (parent / 'gzip').mkdir()
  writer.save(str(parent / 'gzip'), 0)
  convert.convert(parent / 'gzip', parent / 'store', workers=0)
  return {'files': str(parent / 'gzip'), 'store': str(parent / 'store')}, writer


@pytest.mark.parametrize('kind', ['files', 'store'])
def test_return_to_go_from_game_scores(game_score_sources, kind):
  sources, oracle = game_score_sources
  sampler = segments.SegmentSampler(
    sources[kind],
    segment_length=5,
    batch_size=16,
    seed=0,
    return_to_go_from='unclipped_reward',
  )
  try:
    batch = sampler.sample()
  finally:
    sampler.close()
  scores = oracle._store['unclipped_reward']
  for b in range(16):
    for k, row in enumerate(batch['indices'][b]):
      total = 0.0
      for r in _walk(oracle, int(row), 1):
        total += float(scores[r])
        if r in _ends(oracle):
          break
      assert batch['return_to_go'][b, k] == pytest.approx(total)
  np.testing.assert_array_equal(
    batch['unclipped_reward'], scores[batch['indices']]
  )
  assert (np.abs(batch['return_to_go']) > 5).any()  # Not clipped rewards.


def test_reloads_index_the_new_checkpoints(dopamine_dir, oracles):
  sampler = segments.SegmentSampler(
    str(dopamine_dir[0]),
    segment_length=10,
    batch_size=32,
    seed=1,
    num_buffers_to_load=1,
    prefetch=False,
  )
  try:
    seen = set()
    for _ in range(6):
      batch = sampler.sample()
      assert len(set(batch['suffix'].tolist())) == 1
      seen |= set(batch['suffix'].tolist())
      assert_segments_are_dopamines(batch, oracles)
      sampler.reload_buffer()
    assert len(seen) > 1
  finally:
    sampler.close()


def test_dataloader_workers_torchrl_and_jax_serve_the_samplers_segments(
  store,
):
  import jax
  import torch
  from torch.utils import data

  from fixed_replay import jax_batches
  from fixed_replay import torch as fixed_replay_torch
  from fixed_replay import torchrl as fixed_replay_torchrl

  arguments = {'segment_length': 6, 'batch_size': 5, 'seed': 4}
  dataset = fixed_replay_torch.SegmentDataset(
    store, channels_first=True, num_batches=4, **arguments
  )
  try:
    loader = data.DataLoader(dataset, batch_size=None, num_workers=2)
    items = list(loader)
  finally:
    dataset.close()
  assert len(items) == 4
  for worker in range(2):
    expected = segments.SegmentSampler(
      store, **{**arguments, 'seed': dataset.worker_arguments(worker)['seed']}
    )
    # DataLoader takes the workers' batches in turn.
    for item in items[worker::2]:
      batch = expected.sample()
      np.testing.assert_array_equal(
        item['observation'].numpy(), np.moveaxis(batch['observation'], -1, 2)
      )
      for name in ('action', 'return_to_go', 'timestep', 'mask', 'indices'):
        np.testing.assert_array_equal(item[name].numpy(), batch[name])
      assert item['observation'].shape == (5, 6, 4, 84, 84)
      assert item['observation'].dtype == torch.uint8
    expected.close()

  reference = segments.SegmentSampler(store, **arguments)
  batch = reference.sample()
  torchrl_dataset = fixed_replay_torchrl.FixedSegmentDataset(store, **arguments)
  td = torchrl_dataset.sample()
  torchrl_dataset.close()
  assert tuple(td.batch_size) == (5, 6)
  np.testing.assert_array_equal(td['observation'].numpy(), batch['observation'])
  np.testing.assert_array_equal(
    td['return_to_go'].numpy(), batch['return_to_go'][..., None]
  )
  np.testing.assert_array_equal(
    td['next', 'reward'].numpy()[..., 0], batch['reward']
  )
  assert td['collector', 'mask'].all() and td['action'].dtype == torch.int64

  reference.close()
  reference = segments.SegmentSampler(store, **arguments)
  placed = list(jax_batches.prefetch_to_device(reference.batches(2)))
  reference.close()
  again = segments.SegmentSampler(store, **arguments)
  for device_batch in placed:
    assert isinstance(device_batch['observation'], jax.Array)
    batch = again.sample()
    for name, array in batch.items():
      np.testing.assert_array_equal(np.asarray(device_batch[name]), array)
  again.close()
