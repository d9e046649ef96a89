"""Fuzz of RL Unplugged shards: damage is named, or changes nothing.

test_fuzz.py's rule for Dopamine checkpoints and compact stores, applied to
real RL Unplugged shards (GZIP TFRecords of tf.train.Example episodes,
written by TensorFlow, rlu_data.py): a single-bit flip or a truncation at a
random (seeded) offset of a shard, then every tool that reads shards
(convert --source=rlu, inspect, inspect --verify) must raise a
CheckpointError naming the shard, or return exactly what it returns for the
undamaged copy; never other data, another exception or a hang.
"""

import shutil

from dopamine_data import file_digests
import numpy as np
import pytest
import rlu_data
from test_fuzz import SEED
from test_fuzz import TRIALS
from test_fuzz import _check
from test_fuzz import _damage
from test_fuzz import summary_or_error

from fixed_replay.convert import rlu_convert
from fixed_replay.convert import rlu_source
from fixed_replay.sources.rlu import rlu_inspection

# Shard -> (checkpoint_idx, episode_idx) of its records, as published.
LAYOUT = [[(0, 0), (0, 1)], [(1, 2), (1, 3)]]
DAMAGES_PER_TRIAL = 4


def _write_shards(directory):
  played = rlu_data.play(4, max_steps=40, seed=SEED % 1000)
  for number, records in enumerate(LAYOUT):
    rlu_data.write_shard(
      rlu_data.shard_path(directory, 1, number, len(LAYOUT)),
      [rlu_data.relabel(played[e], c, e) for c, e in records],
    )


def _inspect(directory, verify):
  location, parts = rlu_convert.discover(str(directory), 'rlu', run=1)
  summary = rlu_inspection.summarize_run(
    'rlu',
    location,
    parts,
    lambda part: rlu_source.open_part('rlu', location, part),
    verify=verify,
  )
  return summary_or_error(summary, summary.problems, directory, 'location')


def _convert(directory, store):
  rlu_convert.convert_rlu(directory, store, kind='rlu', run=1, workers=0)
  return file_digests(store)


def _tools(directory, scratch):
  return {
    'convert --source=rlu': lambda: _convert(directory, scratch / 'store'),
    'inspect': lambda: _inspect(directory, verify=False),
    'inspect --verify': lambda: _inspect(directory, verify=True),
  }


@pytest.fixture(scope='module')
def undamaged(tmp_path_factory):
  """The shards and what every tool returns for them."""
  base = tmp_path_factory.mktemp('fuzz_rlu')
  source = base / 'Breakout'
  source.mkdir()
  _write_shards(source)
  baselines = {
    name: function()
    for name, function in _tools(source, base / 'baseline').items()
  }
  return source, baselines


def test_damaged_shards_are_named_or_harmless(undamaged, tmp_path):
  source, baselines = undamaged
  rng = np.random.default_rng(SEED)
  seen = []
  for trial in range(TRIALS):
    for _ in range(DAMAGES_PER_TRIAL):
      copy = tmp_path / f'source_{trial}_{len(seen)}'
      shutil.copytree(source, copy)
      number = int(rng.integers(len(LAYOUT)))
      damaged = copy / rlu_data.shard_path('', 1, number, len(LAYOUT))
      what = _damage(damaged, rng)
      seen += _check(
        _tools(copy, tmp_path / f'scratch_{len(seen)}'),
        baselines,
        damaged,
        what,
      )
  assert seen.count('error') > len(seen) // 2, seen
