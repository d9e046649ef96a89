"""Compiles the numba kernels once per session, before the tests need them.

numba caches compiled kernels next to their source (`__pycache__/*.nbi`,
`*.nbc`), and a fresh clone has none. Without this, every process that
samples before some process has written the cache compiles the same
kernels: both xdist workers and the fresh processes the first tests start
(training runs, conversions, examples), about 7 CPU-s each. That made a
fresh clone's suite about a minute slower than a rerun.

conftest runs this script in a process of its own while the workers start
and collect. It samples, through the library's buffers, transitions of the
kinds the tests use: Atari frames from Dopamine's files and from a compact
store (format 2 units), and CartPole's float observations. Where the cache
is there already it only loads it (about 1 CPU-s after the imports).

Usage: python tests/warm_kernels.py DIRECTORY  (a scratch directory)
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fixed_replay import heavy_imports  # noqa: E402

heavy_imports.install()

import dopamine_data  # noqa: E402
import numpy as np  # noqa: E402

from fixed_replay.convert import convert  # noqa: E402
from fixed_replay.replay import fixed_replay_buffer  # noqa: E402


def _sample(data_dir, suffix=None, **kwargs):
  buffer = fixed_replay_buffer.FixedReplayBuffer(
    data_dir=str(data_dir), replay_suffix=suffix, prefetch=False, **kwargs
  )
  buffer.sample_transition_batch(32)


def main(directory):
  pong = os.path.join(directory, 'pong')
  os.makedirs(pong)
  dopamine_data.write_checkpoint(pong, 0, 300, 400, seed=0)
  _sample(pong, 0)
  store = os.path.join(directory, 'store')
  convert.convert(pong, store, workers=0)
  _sample(store)
  cartpole = os.path.join(directory, 'cartpole')
  os.makedirs(cartpole)
  dopamine_data.write_cartpole_run(cartpole, 300)
  _sample(
    cartpole,
    observation_shape=dopamine_data.CARTPOLE_SHAPE,
    stack_size=1,
    observation_dtype=np.float64,
  )


if __name__ == '__main__':
  main(sys.argv[1])
