"""The three meanings of "x% of the data", against Dopamine's own buffer.

The episodes of a checkpoint are found here by walking its rows in the
order they were written (from the writer's cursor in a full file), which is
the definition; the transitions at every kept row must equal Dopamine's
`sample_transition_batch(indices=...)` of the whole file.
"""

import numpy as np
import pytest

from fixed_replay.replay.compact_replay_buffer import CompactReplayBuffer
from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer
from fixed_replay.sources.dopamine import checkpoints
from fixed_replay.sources.dopamine import subsample

SUFFIXES = (0, 1, 3, 7)


def _fixed(directory, **kwargs):
  kwargs.setdefault('prefetch', False)
  kwargs.setdefault('num_buffers_to_load', len(SUFFIXES))
  return FixedReplayBuffer(str(directory), **kwargs)


def _compact(store, **kwargs):
  return CompactReplayBuffer(str(store), sampling_threads=0, **kwargs)


def _episodes_in_writing_order(oracle, episode_ends):
  """Lists of file rows, one per episode, oldest episode first."""
  capacity = len(oracle._store['terminal'])
  full = oracle.add_count >= capacity
  cursor = oracle.cursor()
  first = cursor if full else 0
  written = capacity if full else cursor
  episodes, current = [], []
  for k in range(written):
    row = (first + k) % capacity
    current.append(row)
    if oracle._store['terminal'][row] or row in episode_ends:
      episodes.append(current)
      current = []
  if current:
    episodes.append(current)
  return episodes


def _first_episodes_rows(oracle, episode_ends, valid, fraction):
  """Valid rows of the oldest int(fraction * n) episodes, by definition."""
  valid = set(valid.tolist())
  episodes = [
    sorted(set(e) & valid)
    for e in _episodes_in_writing_order(oracle, episode_ends)
  ]
  episodes = [e for e in episodes if e]
  kept = episodes[: int(fraction * len(episodes))]
  return np.array(sorted(r for e in kept for r in e)), len(episodes)


def _episode_ends(directory, suffix):
  found = checkpoints.find_checkpoints(str(directory))[suffix]
  window = checkpoints.read_terminal_window(found)
  ends = window.episode_end_indices
  return set() if ends is None else set(ends.tolist())


def _assert_rows_equal_dopamine(buffer, suffix, rows, oracle):
  names = [e.name for e in oracle.get_transition_elements(len(rows))]
  ours = buffer.sample_transition_batch(indices=rows, suffixes=suffix)
  expected = oracle.sample_transition_batch(len(rows), indices=rows)
  for name, a, b in zip(names, ours, expected, strict=False):
    np.testing.assert_array_equal(a, b, err_msg=f'{name} of {suffix}')


@pytest.mark.parametrize('fraction', [0.5, 0.2])
def test_first_episodes_are_the_oldest_and_exact(
  dopamine_dir, store, oracles, fraction
):
  directory, _, _ = dopamine_dir
  whole = _fixed(directory)
  ours = _fixed(
    directory, subsample='first_episodes', subsample_fraction=fraction
  )
  compact = _compact(
    store, subsample='first_episodes', subsample_fraction=fraction
  )
  for suffix in SUFFIXES:
    expected, num_episodes = _first_episodes_rows(
      oracles(suffix),
      _episode_ends(directory, suffix),
      whole.shard(suffix).valid_rows,
      fraction,
    )
    assert num_episodes >= 2, suffix
    np.testing.assert_array_equal(ours.shard(suffix).valid_rows, expected)
    np.testing.assert_array_equal(compact.shard(suffix).valid_rows, expected)
    _assert_rows_equal_dopamine(ours, suffix, expected, oracles(suffix))
    _assert_rows_equal_dopamine(compact, suffix, expected, oracles(suffix))
  # Only the rows the kept episodes need were read where none wrap around
  # the file (checkpoint 0 is not full: its oldest rows come first).
  assert ours.shard(0).window.num_rows < whole.shard(0).window.num_rows
  # Drawn minibatches come from kept rows only.
  suffixes, rows = ours.sample_index_batch(2000)
  for suffix in SUFFIXES:
    assert set(rows[suffixes == suffix]) <= set(ours.shard(suffix).valid_rows)


def test_random_episodes_keep_whole_episodes_and_are_exact(
  dopamine_dir, store, oracles
):
  directory, _, _ = dopamine_dir
  whole = _fixed(directory)
  options = dict(subsample='random_episodes', subsample_fraction=0.3, seed=5)
  ours = _fixed(directory, **options)
  again = _fixed(directory, **options)
  compact = _compact(store, **options)
  other_seed = _fixed(directory, **dict(options, seed=6))
  differs = False
  for suffix in SUFFIXES:
    valid = whole.shard(suffix).valid_rows
    kept = ours.shard(suffix).valid_rows
    episodes = [
      sorted(set(e) & set(valid.tolist()))
      for e in _episodes_in_writing_order(
        oracles(suffix), _episode_ends(directory, suffix)
      )
    ]
    episodes = [e for e in episodes if e]
    whole_kept = [e for e in episodes if set(e) <= set(kept.tolist())]
    # Whole episodes only, int(0.3 * episodes) of them, nothing else.
    assert len(whole_kept) == int(0.3 * len(episodes))
    assert sorted(r for e in whole_kept for r in e) == kept.tolist()
    # The same episodes whenever the checkpoint is loaded with this seed,
    # by either buffer.
    np.testing.assert_array_equal(again.shard(suffix).valid_rows, kept)
    np.testing.assert_array_equal(compact.shard(suffix).valid_rows, kept)
    differs |= not np.array_equal(other_seed.shard(suffix).valid_rows, kept)
    _assert_rows_equal_dopamine(ours, suffix, kept, oracles(suffix))
    _assert_rows_equal_dopamine(compact, suffix, kept, oracles(suffix))
  assert differs


def test_first_rows_is_the_cql_window(dopamine_dir, store):
  directory, capacity, _ = dopamine_dir
  ours = _fixed(directory, subsample='first_rows', subsample_fraction=0.25)
  same = _fixed(directory, replay_capacity=capacity // 4)
  compact = _compact(store, subsample='first_rows', subsample_fraction=0.25)
  for suffix in SUFFIXES:
    assert ours.shard(suffix).window.num_rows == 250
    np.testing.assert_array_equal(
      ours.shard(suffix).valid_rows, same.shard(suffix).valid_rows
    )
    np.testing.assert_array_equal(
      compact.shard(suffix).valid_rows, same.shard(suffix).valid_rows
    )


def test_bad_arguments_are_refused(dopamine_dir):
  directory, _, _ = dopamine_dir
  with pytest.raises(ValueError, match='choose one of'):
    _fixed(directory, subsample='last_rows', subsample_fraction=0.1)
  with pytest.raises(ValueError, match=r'in \(0, 1\]'):
    _fixed(directory, subsample='first_rows', subsample_fraction=1.5)
  with pytest.raises(ValueError, match='needs a subsample method'):
    _fixed(directory, subsample_fraction=0.1)
  with pytest.raises(ValueError, match='none would be kept'):
    _fixed(directory, subsample='first_episodes', subsample_fraction=0.01)


def test_episode_rng_depends_on_seed_and_suffix_only():
  a = subsample.episode_rng(None, 3).integers(1 << 30, size=4)
  b = subsample.episode_rng(0, 3).integers(1 << 30, size=4)
  c = subsample.episode_rng(0, 4).integers(1 << 30, size=4)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(b, c)
