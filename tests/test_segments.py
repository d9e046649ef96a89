"""SegmentSampler against Dopamine: every step of every segment is its row's.

The oracle is Dopamine's own buffer loaded from each checkpoint's files: a
step's stack, action, reward and terminal are its
`sample_transition_batch(indices=[row])`, and its return-to-go and timestep
are recomputed here by walking the raw arrays row by row.
"""

import numpy as np
import pytest

from fixed_replay import segments

# The `dopamine_dir`, `store`, `any_store` and `oracles` fixtures come from
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
    ('units_v2_store', {}),
    ('blocks_store', {}),
  ],
)
def test_every_step_is_dopamines(request, name, options, oracles):
  """On files and stores of each format: ends, wraps, cuts and padding."""
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
