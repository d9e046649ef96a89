"""ReplayBatches / prefetch_to_device: the buffer's batches, on the device."""

import contextlib

import jax
import numpy as np
import pytest
from replay_oracle import assert_equals_oracle

from fixed_replay import batches
from fixed_replay.errors import CheckpointError
from fixed_replay.jax_batches import ReplayBatches
from fixed_replay.jax_batches import prefetch_to_device


@pytest.mark.parametrize('layout', ['dopamine', 'store'])
def test_batches_are_the_buffers_own_on_the_device(
  layout, dopamine_dir, store, oracles
):
  directory, capacity, _ = dopamine_dir
  data_dir = str(directory if layout == 'dopamine' else store)
  arguments = dict(replay_capacity=capacity, batch_size=16, seed=9)
  replay = ReplayBatches(data_dir, num_batches=3, **arguments)
  reference = batches.open_buffer(data_dir, arguments)
  try:
    items = list(replay)
    assert len(items) == 3
    for item in items:
      assert all(isinstance(a, jax.Array) for a in item.values())
      assert item['state'].devices() == {jax.devices()[0]}
      host = {name: np.asarray(array) for name, array in item.items()}
      want = batches.named(reference, reference.sample_transition_batch())
      assert list(host) == list(want)
      for name in want:
        assert host[name].dtype == want[name].dtype, name
        np.testing.assert_array_equal(host[name], want[name], err_msg=name)
      assert_equals_oracle(host, oracles)
  finally:
    replay.close()
    reference.close()


def test_prefetch_places_depth_batches_ahead():
  pulled = []

  def source():
    for i in range(5):
      pulled.append(i)
      yield {'x': np.full(3, i, np.int32)}

  seen = []
  for item in prefetch_to_device(source(), depth=2):
    # When batch i is handed out, batches i+1 and i+2 are already sent.
    seen.append((int(item['x'][0]), len(pulled)))
  assert seen == [(0, 3), (1, 4), (2, 5), (3, 5), (4, 5)]
  with pytest.raises(ValueError, match='depth'):
    next(prefetch_to_device(source(), depth=0))


def test_bad_input_fails_at_construction(tmp_path, store):
  with pytest.raises(CheckpointError):
    ReplayBatches(str(tmp_path))
  with pytest.raises(CheckpointError, match='observation'):
    ReplayBatches(str(store), observation_shape=(4, 1))


def test_the_state_is_plain_numbers_after_the_batch_handed_out(store):
  """Batches wait on the device `depth` ahead; the state is the stream's
  after the last batch handed out, in plain ints, and a new ReplayBatches
  loaded with it gives the uninterrupted stream's next batches."""
  arguments = dict(batch_size=8, seed=1)
  with contextlib.closing(ReplayBatches(str(store), **arguments)) as whole:
    expected = [
      np.asarray(b['indices']) for _, b in zip(range(7), whole, strict=False)
    ]
  with contextlib.closing(
    ReplayBatches(str(store), depth=3, **arguments)
  ) as first:
    for _, _batch in zip(range(4), first, strict=False):
      pass
    state = first.state_dict()
  words = jax.tree_util.tree_leaves(state)
  assert words and all(type(w) is int and 0 <= w < 2**32 for w in words)
  with contextlib.closing(ReplayBatches(str(store), **arguments)) as resumed:
    resumed.load_state_dict(state)
    got = [
      np.asarray(b['indices']) for _, b in zip(range(3), resumed, strict=False)
    ]
  np.testing.assert_array_equal(np.stack(got), np.stack(expected[4:]))


def test_several_sampling_threads_sample_but_have_no_place(store):
  """Batches in no fixed order still flow; only asking for a place fails."""
  with contextlib.closing(
    ReplayBatches(str(store), batch_size=8, seed=0, sampling_threads=2)
  ) as replay:
    assert len(next(iter(replay))['indices']) == 8
    with pytest.raises(ValueError, match='2 sampling threads'):
      replay.buffer.state_dict()
