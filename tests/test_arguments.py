"""Arguments are checked at construction, naming the argument and its range."""

import re

import numpy as np
import pytest

from fixed_replay import arguments as arguments_lib
from fixed_replay.replay.compact_replay_buffer import CompactReplayBuffer
from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer

# (argument, bad value, words of the message)
BUFFER_CASES = [
  ('batch_size', 0, 'batch_size must be an integer >= 1, got 0'),
  ('batch_size', -3, 'batch_size must be an integer >= 1, got -3'),
  ('stack_size', 0, 'stack_size must be an integer >= 1'),
  ('update_horizon', -1, 'update_horizon must be an integer >= 1'),
  ('replay_capacity', 0, 'replay_capacity must be an integer >= 1'),
  ('num_buffers_to_load', 0, 'num_buffers_to_load must be an integer >= 1'),
  ('batch_size', 32.0, 'batch_size must be an integer >= 1, got 32.0 (float)'),
  (
    'replay_suffix',
    '3',
    "replay_suffix must be an integer >= 0 or None, got '3'",
  ),
  ('replay_suffix', True, 'replay_suffix must be an integer >= 0 or None'),
  ('replay_suffix', -1, 'replay_suffix must be an integer >= 0 or None'),
  ('memory_budget', 0, 'memory_budget must be an integer >= 1 or None'),
  (
    'replay_transitions_start_index',
    -5,
    'replay_transitions_start_index must be an integer >= 0',
  ),
  ('gamma', 1.5, 'gamma must be a number in [0, 1]'),
]


@pytest.mark.parametrize('name, value, words', BUFFER_CASES)
def test_fixed_replay_buffer_checks_its_arguments(tmp_path, name, value, words):
  # The directory is never looked at: the check comes first.
  with pytest.raises(ValueError, match=re.escape(words)):
    FixedReplayBuffer(str(tmp_path / 'nowhere'), **{name: value})


@pytest.mark.parametrize(
  'name, value, words',
  BUFFER_CASES[:5]
  + [
    ('ready_batches', 0, 'ready_batches must be an integer >= 1'),
    (
      'sampling_threads',
      -1,
      'sampling_threads must be an integer >= 0 or None',
    ),
  ],
)
def test_compact_replay_buffer_checks_its_arguments(
  tmp_path, name, value, words
):
  with pytest.raises(ValueError, match=re.escape(words)):
    CompactReplayBuffer(str(tmp_path / 'nowhere'), **{name: value})


@pytest.mark.parametrize(
  'name, value, words',
  [
    ('training_steps', -5, 'training_steps must be an integer >= 0, got -5'),
    ('num_iterations', 0, 'num_iterations must be an integer >= 1'),
    ('evaluation_steps', -1, 'evaluation_steps must be an integer >= 0'),
    ('max_steps_per_episode', 0, 'max_steps_per_episode must be an integer'),
    ('log_every_n', 0, 'log_every_n must be an integer >= 1'),
  ],
)
def test_runner_checks_its_step_counts(tmp_path, name, value, words):
  from fixed_replay.training.run_experiment import FixedReplayRunner

  with pytest.raises(ValueError, match=re.escape(words)):
    FixedReplayRunner(str(tmp_path), None, **{name: value})


def test_valid_values_pass():
  arguments_lib.check_arguments(
    dict(
      batch_size=np.int64(32),
      replay_suffix=np.int32(0),
      num_buffers_to_load=None,
      replay_file_end_index=-1,  # A slice bound, as in Dopamine.
      gamma=0.99,
      training_steps=0,
      unrelated=object(),
    )
  )
