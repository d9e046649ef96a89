"""Fixtures of the buffer tests, loaded with `pytest_plugins`.

`store`: conftest's Dopamine-written checkpoints converted to a compact
store; `oracles`: Dopamine's own buffers loaded from the gzip files.
"""

import dopamine_data
import pytest

from fixed_replay.store import convert


@pytest.fixture(scope='module')
def store(dopamine_dir, tmp_path_factory):
  """The Dopamine-written checkpoints of conftest, converted once."""
  directory = tmp_path_factory.mktemp('compact')
  convert.convert(dopamine_dir[0], directory, workers=0)
  return directory


@pytest.fixture(scope='module')
def oracles(dopamine_dir):
  """oracles(suffix, n, gamma): Dopamine's buffer loaded from the gzip file."""
  directory, capacity, _ = dopamine_dir
  loaded = {}

  def get(suffix, update_horizon=1, gamma=0.99):
    key = (suffix, update_horizon, gamma)
    if key not in loaded:
      loaded[key] = dopamine_data.load_oracle(
        directory, suffix, capacity, update_horizon=update_horizon, gamma=gamma
      )
    return loaded[key]

  return get
