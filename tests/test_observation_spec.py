"""The arguments the data already knows, at every front door.

A CartPole directory works with no shape, dtype or stack argument; what the
data decides equals what a user who spelt it out gets; an argument that
disagrees with the data is one error naming the file, what it holds and what
was asked; a DataLoader left to collate whole minibatches raises.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fixed_replay import batches
from fixed_replay.convert import convert
from fixed_replay.errors import CheckpointError
from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer
from fixed_replay.store import manifest as manifest_lib

CARTPOLE = dict(
  observation_shape=(4, 1), stack_size=1, observation_dtype=np.float64
)


@pytest.fixture(scope='module')
def cartpole_store(cartpole_dir, tmp_path_factory):
  """cartpole_dir converted with no stack argument."""
  directory = tmp_path_factory.mktemp('cartpole_store')
  convert.convert(cartpole_dir, directory, workers=0)
  return str(directory)


def _assert_same_stream(data_dir, **given):
  """A buffer with no shape arguments samples as one given CARTPOLE."""
  arguments = dict(batch_size=8, seed=3, sampling_threads=0)
  found = batches.open_buffer(data_dir, arguments)
  spelt = batches.open_buffer(data_dir, dict(arguments, **given))
  try:
    for _ in range(3):
      left = batches.named(found, found.sample_transition_batch())
      right = batches.named(spelt, spelt.sample_transition_batch())
      assert list(left) == list(right)
      for name in left:
        assert left[name].dtype == right[name].dtype, name
        np.testing.assert_array_equal(left[name], right[name], err_msg=name)
    return left
  finally:
    found.close()
    spelt.close()


def test_cartpole_files_need_no_shape_arguments(cartpole_dir):
  batch = _assert_same_stream(cartpole_dir, **CARTPOLE)
  # One CartPole state per step, not four stacked.
  assert batch['state'].shape == (8, 4, 1, 1)
  assert batch['state'].dtype == np.float64


def test_a_store_gives_its_stack_and_n_step(cartpole_dir, cartpole_store):
  manifest = manifest_lib.read_manifest(
    os.path.join(cartpole_store, manifest_lib.checkpoint_dirname(0))
  )
  assert manifest['valid_rows']['stack_size'] == 1
  batch = _assert_same_stream(cartpole_store, **CARTPOLE, update_horizon=1)
  assert batch['state'].shape == (8, 4, 1, 1)
  # Converted for 3-step returns: a buffer with no update_horizon takes 3.
  nstep = os.path.join(os.path.dirname(cartpole_store), 'nstep_store')
  convert.convert(
    cartpole_dir,
    nstep,
    convert.ConvertOptions(update_horizon=3),
    workers=0,
  )
  buffer = FixedReplayBuffer(nstep, sampling_threads=0)
  try:
    assert buffer._arguments.update_horizon == 3  # noqa: SLF001
    assert buffer._arguments.stack_size == 1  # noqa: SLF001
  finally:
    buffer.close()


def test_atari_frames_default_to_a_stack_of_four(dopamine_dir):
  directory, capacity, _ = dopamine_dir
  buffer = FixedReplayBuffer(
    str(directory), replay_capacity=capacity, sampling_threads=0
  )
  try:
    state = buffer.sample_transition_batch(batch_size=2)[0]
    assert state.shape == (2, 84, 84, 4)
  finally:
    buffer.close()


@pytest.mark.parametrize('layout', ['dopamine', 'store'])
def test_disagreement_is_one_error_naming_the_file(
  layout, cartpole_dir, cartpole_store
):
  data_dir = cartpole_dir if layout == 'dopamine' else cartpole_store
  with pytest.raises(CheckpointError) as raised:
    batches.open_buffer(
      data_dir,
      dict(observation_shape=(84, 84), observation_dtype=np.uint8),
    )
  message = str(raised.value)
  named = 'observation_ckpt.0.gz' if layout == 'dopamine' else 'manifest.json'
  assert named in message
  assert 'observation_shape=(4, 1), observation_dtype=float64' in message
  assert 'observation_shape=(84, 84), observation_dtype=uint8' in message
  # Outside gin, no note of gin's.
  assert 'configurable' not in message


def test_convert_and_inspect_take_the_stack_from_the_data(
  cartpole_dir, cartpole_store
):
  for directory in (cartpole_dir, cartpole_store):
    completed = subprocess.run(
      [
        sys.executable,
        '-m',
        'fixed_replay.cli',
        'inspect',
        directory,
        '--json',
      ],
      capture_output=True,
      text=True,
      timeout=300,
      env=dict(os.environ),
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    summary = json.loads(completed.stdout)
    assert summary['stack_size'] == 1
    buffer = FixedReplayBuffer(directory, sampling_threads=0)
    try:
      # Counted as the buffer samples: one state per row, not four.
      valid = sum(c['num_valid'] for c in summary['checkpoints'])
      assert valid == buffer.num_valid_transitions
    finally:
      buffer.close()


@pytest.mark.parametrize('num_workers', [0, 1])
def test_a_collating_dataloader_raises(num_workers, cartpole_dir):
  torch_data = pytest.importorskip('torch.utils.data')
  from fixed_replay.torch import ReplayDataset

  dataset = ReplayDataset(cartpole_dir, batch_size=8, seed=0)
  try:
    loader = torch_data.DataLoader(dataset, num_workers=num_workers)
    with pytest.raises(TypeError, match='batch_size=None'):
      next(iter(loader))
    # The intended loader still hands out whole minibatches.
    item = next(iter(torch_data.DataLoader(dataset, batch_size=None)))
    assert tuple(item['state'].shape) == (8, 4, 1, 1)
  finally:
    dataset.close()


def test_torchrl_dataset_needs_no_shape_arguments(cartpole_dir, cartpole_store):
  pytest.importorskip('torchrl')
  from fixed_replay.torchrl import FixedReplayDataset

  for data_dir in (cartpole_dir, cartpole_store):
    dataset = FixedReplayDataset(data_dir, batch_size=8, seed=0)
    try:
      td = dataset.sample()
      assert tuple(td['observation'].shape) == (8, 4, 1, 1)
      assert tuple(td['next', 'observation'].shape) == (8, 4, 1, 1)
    finally:
      dataset.close()
