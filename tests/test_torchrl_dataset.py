"""FixedReplayDataset: a real TorchRL TensorDictReplayBuffer of exact data."""

import json

import numpy as np
import pytest
from replay_oracle import assert_equals_oracle

torchrl = pytest.importorskip('torchrl')

from tensordict import TensorDict  # noqa: E402
import torch  # noqa: E402
from torchrl.data import TensorDictReplayBuffer  # noqa: E402

from fixed_replay import batches  # noqa: E402
from fixed_replay.errors import CheckpointError  # noqa: E402
from fixed_replay.torchrl import FixedReplayDataset  # noqa: E402

CARTPOLE = dict(
  observation_shape=(4, 1), stack_size=1, observation_dtype=np.float64
)


def _as_dopamine(td):
  """A sample under Dopamine's element names (what the oracle returns)."""
  return {
    'state': td['observation'].numpy(),
    'action': td['action'].numpy(),
    'reward': td['next', 'reward'].numpy()[:, 0],
    'next_state': td['next', 'observation'].numpy(),
    'terminal': td['next', 'terminated'].numpy()[:, 0],
    'indices': td['indices'].numpy(),
    'suffix': td['suffix'].numpy(),
  }


@pytest.mark.parametrize('layout', ['dopamine', 'store'])
def test_samples_are_dopamines_transitions(
  layout, dopamine_dir, store, oracles
):
  directory, capacity, _ = dopamine_dir
  data_dir = str(directory if layout == 'dopamine' else store)
  dataset = FixedReplayDataset(
    data_dir, batch_size=64, replay_capacity=capacity, update_horizon=3, seed=4
  )
  assert isinstance(dataset, TensorDictReplayBuffer)
  td = dataset.sample()
  assert isinstance(td, TensorDict) and td.batch_size == torch.Size([64])
  assert td['observation'].shape == (64, 84, 84, 4)
  assert td['observation'].dtype == torch.uint8
  assert td['action'].dtype == torch.int64
  assert td['next', 'reward'].shape == (64, 1)
  assert td['next', 'done'].dtype == torch.bool
  np.testing.assert_array_equal(td['next', 'done'], td['next', 'terminated'])
  # TorchRL's own `index` is the (checkpoint, row) pair the sampler drew.
  np.testing.assert_array_equal(td['index'][:, 0], td['suffix'].long())
  np.testing.assert_array_equal(td['index'][:, 1], td['indices'].long())
  got = _as_dopamine(td)
  assert len(np.unique(got['suffix'])) > 1
  # The oracle's dtypes: the action is int64 here (TorchRL's index dtype)
  # and the terminal a bool, with Dopamine's values.
  reference = batches.open_buffer(
    data_dir, dict(replay_capacity=capacity, update_horizon=3)
  )
  try:
    expected = batches.named(
      reference,
      reference.sample_transition_batch(
        indices=got['indices'], suffixes=got['suffix']
      ),
    )
  finally:
    reference.close()
  got['action'] = got['action'].astype(expected['action'].dtype)
  got['terminal'] = got['terminal'].astype(expected['terminal'].dtype)
  for name, array in got.items():
    np.testing.assert_array_equal(array, expected[name], err_msg=name)
  assert_equals_oracle(
    got, lambda s: oracles(s, update_horizon=3), names=list(got)
  )
  dataset.close()


def test_sampling_is_seeded_and_uniform_over_the_valid_rows(cartpole_dir):
  def draws(seed, count):
    dataset = FixedReplayDataset(
      cartpole_dir, batch_size=256, seed=seed, **CARTPOLE
    )
    pairs = [
      td['index'].numpy() for _, td in zip(range(count), dataset, strict=False)
    ]
    assert len(dataset) == dataset.buffer.num_valid_transitions
    dataset.close()
    return np.concatenate(pairs)

  first = draws(3, 40)
  np.testing.assert_array_equal(first, draws(3, 40))
  assert not np.array_equal(first, draws(4, 40))
  # The buffer's own draw, seeded alike: the same (checkpoint, row) pairs.
  buffer = batches.open_buffer(cartpole_dir, dict(CARTPOLE, seed=3))
  valid = buffer.num_valid_transitions
  own = [np.stack(buffer.sample_index_batch(256), -1) for _ in range(40)]
  np.testing.assert_array_equal(first, np.concatenate(own))
  for suffix, row in np.unique(first, axis=0)[::50]:
    assert buffer.is_valid_transition(int(row), int(suffix))
  buffer.close()
  # Uniform: 10,240 draws over the valid rows, each drawn ~N/valid times.
  _, counts = np.unique(first, axis=0, return_counts=True)
  mean = len(first) / valid
  assert len(counts) > 0.9 * valid
  assert counts.max() < mean + 6 * np.sqrt(mean), (counts.max(), mean)


def test_channels_first_and_a_reference_to_the_buffers_batch(store):
  arguments = dict(replay_capacity=1000, batch_size=8, seed=2)
  last = FixedReplayDataset(str(store), **arguments)
  first = FixedReplayDataset(str(store), channels_first=True, **arguments)
  a, b = last.sample(), first.sample()
  assert b['observation'].shape == (8, 4, 84, 84)
  np.testing.assert_array_equal(
    b['next', 'observation'].numpy(),
    np.moveaxis(a['next', 'observation'].numpy(), -1, 1),
  )
  last.close()
  first.close()


def test_the_dataset_is_read_only_and_errors_name_the_data(store, tmp_path):
  dataset = FixedReplayDataset(str(store), replay_capacity=1000, batch_size=4)
  td = dataset.sample()
  for write in (dataset.extend, dataset.add):
    with pytest.raises(RuntimeError, match='read-only') as raised:
      write(td if write == dataset.extend else td[0])
    assert str(store) in str(raised.value)
  with pytest.raises(ValueError, match='valid'):
    dataset.storage.get(torch.tensor([[int(td['suffix'][0]), -5]]))
  dataset.close()
  with pytest.raises(CheckpointError) as raised:
    FixedReplayDataset(str(tmp_path))
  assert str(tmp_path) in str(raised.value)


def test_dumps_and_loads_resume_the_stream(dopamine_dir, tmp_path):
  """ReplayBuffer.dumps after 3 samples; a new dataset loads it and samples
  what the uninterrupted one samples next (rotating sets, with a reload)."""
  arguments = dict(
    batch_size=8, seed=2, num_buffers_to_load=2, replay_capacity=1000
  )
  data_dir = str(dopamine_dir[0])

  def run(dataset, steps):
    drawn = []
    for step in range(steps):
      if step == 4:
        dataset.buffer.reload_buffer()
      drawn.append(dataset.sample()['indices'].numpy())
    return drawn

  uninterrupted = FixedReplayDataset(data_dir, **arguments)
  expected = run(uninterrupted, 7)
  first = FixedReplayDataset(data_dir, **arguments)
  run(first, 3)
  first.dumps(tmp_path / 'replay')
  assert (
    first.state_dict()['_storage']['stream']
    == (
      json.loads((tmp_path / 'replay' / 'storage' / 'stream.json').read_text())[
        'stream'
      ]
    )
  )
  resumed = FixedReplayDataset(data_dir, **arguments)
  resumed.loads(tmp_path / 'replay')
  got = [resumed.sample()['indices'].numpy()]
  resumed.buffer.reload_buffer()
  got += [resumed.sample()['indices'].numpy() for _ in range(3)]
  np.testing.assert_array_equal(np.stack(got), np.stack(expected[3:]))
  for dataset in (uninterrupted, first, resumed):
    dataset.close()
