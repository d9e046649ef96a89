"""In-graph sampling for Dopamine's TF agents."""

import dopamine_data
import gin
import numpy as np
import tensorflow as tf

from fixed_replay.agents.tf.wrapped_fixed_replay_buffer import (
  WrappedFixedReplayBuffer,
)


def test_session_runs_sample_exact_transitions(dopamine_dir):
  directory, capacity, writers = dopamine_dir
  gin.parse_config(
    [
      'FixedReplayBuffer.num_buffers_to_load = 2',
      'FixedReplayBuffer.prefetch = False',
    ]
  )
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    replay = WrappedFixedReplayBuffer(
      data_dir=str(directory),
      replay_suffix=None,
      observation_shape=(84, 84),
      stack_size=4,
      batch_size=16,
      update_horizon=2,
      gamma=0.9,
    )
    assert replay.states.shape.as_list() == [16, 84, 84, 4]
    assert set(replay.transition) >= {'state', 'reward', 'terminal', 'suffix'}
    first = session.run(replay.transition)
    second = session.run(replay.transition)
  assert not np.array_equal(first['indices'], second['indices'])
  for suffix in np.unique(first['suffix']):
    members = first['suffix'] == suffix
    oracle = dopamine_data.load_oracle(
      directory, int(suffix), capacity, update_horizon=2, gamma=0.9
    )
    expected = oracle.sample_transition_batch(
      int(members.sum()), indices=first['indices'][members]
    )
    names = [e.name for e in oracle.get_transition_elements()]
    for name, array in zip(names, expected, strict=True):
      np.testing.assert_array_equal(first[name][members], array)
  assert len(replay.memory.loaded_suffixes) == 2  # From the gin binding.
  replay.reload_buffer()
  assert set(replay.memory.loaded_suffixes) <= set(writers)
  gin.clear_config()


def test_gin_bindings_of_the_buffer_reach_tf_agents(dopamine_dir):
  """Bindings on FixedReplayBuffer are not overridden by the wrapper."""
  gin.parse_config(
    [
      'FixedReplayBuffer.num_buffers_to_load = 1',
      'FixedReplayBuffer.replay_capacity = 300',
      'FixedReplayBuffer.batch_size = 8',
      'FixedReplayBuffer.prefetch = False',
    ]
  )
  try:
    with tf.Graph().as_default():
      replay = WrappedFixedReplayBuffer(
        data_dir=str(dopamine_dir[0]),
        replay_suffix=0,
        observation_shape=(84, 84),
        stack_size=4,
      )
    assert replay.memory.replay_capacity == 300
    assert replay.batch_size == 8
    assert replay.states.shape.as_list() == [8, 84, 84, 4]
    assert replay.memory.add_count == 300
  finally:
    gin.clear_config()
