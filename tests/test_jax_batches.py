"""ReplayBatches / prefetch_to_device: the buffer's batches, on the device."""

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
