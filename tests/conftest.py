"""Shared fixtures: checkpoints written by Dopamine itself."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import dopamine_data  # noqa: E402


@pytest.fixture(scope='session')
def dopamine_dir(tmp_path_factory):
  """Four Dopamine-written Pong checkpoints and the buffers that wrote them.

  Suffix 0: not full (cursor in the middle); suffix 1: full, cursor inside
  the file; suffix 3: the published layout (full, cursor at the last row);
  suffix 7: full with the cursor inside the file and episode_end_indices
  holding cuts without a terminal.
  """
  directory = tmp_path_factory.mktemp('dopamine')
  capacity = 1000
  writers = {
    0: dopamine_data.write_checkpoint(directory, 0, capacity, 600, seed=0),
    1: dopamine_data.write_checkpoint(directory, 1, capacity, 1400, seed=1),
    3: dopamine_data.write_published_checkpoint(
      directory, 3, capacity, index=1, seed=3
    ),
    7: dopamine_data.write_checkpoint(
      directory,
      7,
      capacity,
      2317,
      seed=2,
      terminal_prob=0.02,
      episode_end_prob=0.01,
    ),
  }
  return directory, capacity, writers
