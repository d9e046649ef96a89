"""Every field RL Unplugged records: the game's reward and the episode ids.

Shards of real MsPacman play (each dot is 10 points, clipped to 1), written
with TensorFlow, converted into Dopamine's files and into a compact store.
The oracle is Dopamine's own `OutOfGraphReplayBuffer` with
`extra_storage_types`, that `add`ed the same episodes with their game
rewards and episode ids; Dopamine's `load` of our files, both buffers, and
`inspect` and `report` in fresh processes must agree with it.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import rlu_data

from fixed_replay.convert import rlu_convert
from fixed_replay.convert.convert_options import ConvertOptions
from fixed_replay.errors import CheckpointError
from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer

CHECKPOINTS = (0, 1)
EXTRAS = [rlu_data.UNCLIPPED_REWARD, rlu_data.EPISODE_IDX]


@pytest.fixture(scope='module')
def converted(tmp_path_factory):
  """(shards, {format: directory}, {checkpoint: episodes}), MsPacman."""
  directory = tmp_path_factory.mktemp('rlu_fields') / 'MsPacman'
  directory.mkdir()
  played = rlu_data.play(4, max_steps=120, seed=0, game='MsPacman')
  episodes = {}
  for number, checkpoint in enumerate(CHECKPOINTS):
    labelled = [
      rlu_data.relabel(
        played[2 * checkpoint + i], checkpoint, 2 * checkpoint + i
      )
      for i in range(2)
    ]
    episodes[checkpoint] = labelled
    rlu_data.write_shard(
      rlu_data.shard_path(directory, 1, number, len(CHECKPOINTS)), labelled
    )
  outputs = {}
  for output_format in ('dopamine', 'compact'):
    outputs[output_format] = tmp_path_factory.mktemp(output_format)
    result = rlu_convert.convert_rlu(
      directory,
      outputs[output_format],
      options=ConvertOptions(output_format=output_format),
      workers=0,
    )
    assert result.converted == list(CHECKPOINTS)
  return directory, outputs, episodes


def _names(buffer, size):
  return [e.name for e in buffer.get_transition_elements(size)]


def _assert_same(batch, oracle, rows):
  """Every element of the oracle's batch at `rows`, extras included."""
  expected = oracle.sample_transition_batch(len(rows), indices=rows)
  for name, want in zip(_names(oracle, len(rows)), expected, strict=True):
    assert batch[name].dtype == want.dtype, name
    np.testing.assert_array_equal(batch[name], want, err_msg=name)


def _valid(oracle, episodes):
  return rlu_data.valid_rows(oracle, rlu_data.rows_of(episodes) + 1)


def test_dopamine_loads_the_extra_elements(converted):
  """Dopamine's own load of `--format=dopamine` files, extras declared."""
  _, outputs, episodes = converted
  for checkpoint in CHECKPOINTS:
    played = episodes[checkpoint]
    oracle = rlu_data.oracle(played, extras=EXTRAS)
    loaded = rlu_data.make_buffer(rlu_data.rows_of(played) + 1, extras=EXTRAS)
    loaded.load(str(outputs['dopamine']), checkpoint)
    valid = _valid(oracle, played)
    batch = loaded.sample_transition_batch(len(valid), indices=valid)
    batch = dict(zip(_names(loaded, len(valid)), batch, strict=True))
    _assert_same(batch, oracle, valid)
    # The game score is not the clipped reward (a dot is 10 points).
    assert set(np.unique(batch['unclipped_reward'])) == {0.0, 10.0}
    assert (batch['unclipped_reward'] != batch['reward']).any()
    assert {e.episode_idx for e in played} <= set(batch['episode_idx'])
    # Padding rows hold zeros, as Dopamine's `add` writes them.
    stored = loaded._store['episode_idx'][: rlu_data.rows_of(played) + 1]
    assert stored[:3].tolist() == [0, 0, 0] and stored[-1] == 0
    assert stored[126] == played[1].episode_idx != 0


@pytest.mark.parametrize('output_format', ['dopamine', 'compact'])
def test_buffers_return_it_when_asked(converted, output_format):
  """FixedReplayBuffer on either output, asked in Dopamine's way."""
  _, outputs, episodes = converted
  asked = [rlu_data.UNCLIPPED_REWARD]
  kwargs = dict(prefetch=False, seed=0, sampling_threads=0)
  if output_format == 'dopamine':
    kwargs['num_buffers_to_load'] = len(CHECKPOINTS)
  data_dir = str(outputs[output_format])
  buffer = FixedReplayBuffer(data_dir, extra_storage_types=asked, **kwargs)
  plain = FixedReplayBuffer(data_dir, **kwargs)
  try:
    assert 'unclipped_reward' in _names(buffer, 1)
    assert 'unclipped_reward' not in _names(plain, 1)
    # Only an agent that asks holds it: 4 bytes a row of Dopamine's files
    # (a store maps it from its file, and counts it in the 4 ready batches
    # of 32 that its budget reserves).
    rows = sum(rlu_data.rows_of(episodes[c]) + 1 for c in CHECKPOINTS)
    if output_format == 'compact':
      rows = 4 * 32
    assert buffer.nbytes - plain.nbytes == 4 * rows
    for checkpoint in CHECKPOINTS:
      played = episodes[checkpoint]
      oracle = rlu_data.oracle(played, extras=asked)
      valid = _valid(oracle, played)
      batch = buffer.sample_transition_batch(
        len(valid), indices=valid, suffixes=checkpoint
      )
      _assert_same(
        dict(zip(_names(buffer, len(valid)), batch, strict=False)),
        oracle,
        valid,
      )
    sampled = dict(
      zip(_names(buffer, 64), buffer.sample_transition_batch(64), strict=True)
    )
    for checkpoint in CHECKPOINTS:
      members = sampled['suffix'] == checkpoint
      oracle = rlu_data.oracle(episodes[checkpoint], extras=asked)
      _assert_same(
        {name: array[members] for name, array in sampled.items()},
        oracle,
        sampled['indices'][members],
      )
  finally:
    buffer.close()
    plain.close()


def test_tf_agents_get_it_in_graph(converted):
  """WrappedFixedReplayBuffer, as Dopamine's TF agents sample."""
  import tensorflow as tf

  from fixed_replay.agents.tf.wrapped_fixed_replay_buffer import (
    WrappedFixedReplayBuffer,
  )

  _, outputs, episodes = converted
  asked = [rlu_data.UNCLIPPED_REWARD]
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    replay = WrappedFixedReplayBuffer(
      str(outputs['compact']),
      batch_size=64,
      extra_storage_types=asked,
      prefetch=False,
      seed=0,
    )
    batch = session.run(replay.transition)
    replay.memory.close()
  for checkpoint in CHECKPOINTS:
    members = batch['suffix'] == checkpoint
    _assert_same(
      {name: array[members] for name, array in batch.items()},
      rlu_data.oracle(episodes[checkpoint], extras=asked),
      batch['indices'][members],
    )
  assert batch['unclipped_reward'].dtype == np.float32


@pytest.mark.parametrize('source', ['dopamine', 'store'])
def test_a_field_the_data_lacks_is_refused(dopamine_dir, store, source):
  """Pong checkpoints written by Dopamine have no unclipped_reward."""
  data_dir = dopamine_dir[0] if source == 'dopamine' else store
  expected = (
    '$store$_unclipped_reward_ckpt.0.gz'
    if source == 'dopamine'
    else os.path.join('checkpoint_0', 'manifest.json')
  )
  with pytest.raises(CheckpointError) as raised:
    FixedReplayBuffer(
      str(data_dir),
      extra_storage_types=[rlu_data.UNCLIPPED_REWARD],
      num_buffers_to_load=4,
      prefetch=False,
    )
  assert raised.value.path.endswith(expected)
  assert "no element 'unclipped_reward'" in raised.value.problem
  assert 'RL Unplugged' in raised.value.problem


def test_every_checkpoint_is_checked_before_sampling(
  converted, store, tmp_path
):
  """A store sampled one checkpoint per iteration, one lacking the field."""
  _, outputs, _ = converted
  mixed = tmp_path / 'mixed'
  mixed.mkdir()
  shutil.copytree(outputs['compact'] / 'checkpoint_0', mixed / 'checkpoint_0')
  shutil.copytree(store / 'checkpoint_1', mixed / 'checkpoint_1')
  for seed in range(3):  # Whichever checkpoint the first set draws.
    with pytest.raises(CheckpointError, match='unclipped_reward') as raised:
      FixedReplayBuffer(
        str(mixed),
        extra_storage_types=[rlu_data.UNCLIPPED_REWARD],
        num_buffers_to_load=1,
        seed=seed,
      )
    assert os.path.join('checkpoint_1', 'manifest.json') in raised.value.path


def test_a_store_padded_for_another_stack_is_refused(converted):
  """Episodes were padded with stack_size - 1 zero rows: 3, for a stack of 4."""
  _, outputs, _ = converted
  with pytest.raises(CheckpointError) as raised:
    FixedReplayBuffer(str(outputs['compact']), stack_size=2)
  assert raised.value.path.endswith('checkpoint_0')
  assert 'for stack_size=4, but the buffer has stack_size=2' in (
    raised.value.problem
  )


def _cli(*args):
  completed = subprocess.run(
    [sys.executable, '-m', 'fixed_replay.cli', *map(str, args)],
    capture_output=True,
    text=True,
  )
  assert completed.returncode == 0, completed.stderr[-3000:]
  return completed.stdout


def _game_returns(episodes):
  return [float(np.sum(e.game_rewards)) for e in episodes]


def test_inspect_shows_game_score_returns(converted, store):
  shards, outputs, episodes = converted
  for data in (outputs['dopamine'], outputs['compact']):
    table = _cli('inspect', data)
    assert 'game score min / mean / max' in table
    summary = json.loads(_cli('inspect', data, '--json'))
    for entry in summary['checkpoints']:
      game = _game_returns(episodes[entry['suffix']])
      clipped = [float(np.sum(e.rewards)) for e in episodes[entry['suffix']]]
      assert entry['game_episodes']['mean_return'] == pytest.approx(
        np.mean(game)
      )
      assert entry['episodes']['mean_return'] == pytest.approx(np.mean(clipped))
      assert entry['game_episodes']['max_return'] == max(game)
  run = json.loads(_cli('inspect', shards, '--json'))
  for entry in run['checkpoints']:
    game = _game_returns(episodes[entry['checkpoint']])
    assert entry['game_returns']['mean_return'] == pytest.approx(np.mean(game))
  assert 'game score min / mean / max' in _cli('inspect', shards)
  lacking = _cli('inspect', store)
  assert 'game score: not recorded (no unclipped_reward' in lacking
  assert 'game score min' not in lacking


def test_report_states_the_data_game_score(converted, store):
  _, outputs, episodes = converted
  text = _cli('report', f'--data={outputs["compact"]}', f'--data={store}')
  assert '| mean game score | mean clipped return |' in text
  for checkpoint in CHECKPOINTS:
    game = np.mean(_game_returns(episodes[checkpoint]))
    clipped = np.mean([np.sum(e.rewards) for e in episodes[checkpoint]])
    assert (
      f'| {outputs["compact"]} | {checkpoint} | 2 | {game:.1f} | '
      f'{clipped:.1f} |'
    ) in text
  assert f'| {store} | - | - | not recorded (no unclipped_reward) |' in text
