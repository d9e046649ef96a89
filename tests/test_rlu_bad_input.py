"""Damaged RL Unplugged input: a CheckpointError naming shard and episode.

Each case writes a small run of three shards (checkpoints 0, 1, 2) of real
Breakout play whose shard 1 is damaged in its second record, converts it and
expects an error naming the shard and the episode, nothing half-written in
the store, checkpoint 0 complete and intact, and, once shard 1 is replaced
by a good one, a rerun that completes the store exactly as a clean run does.
"""

import gzip
import os

import cv2
from dopamine_data import content_digests
import numpy as np
import pytest
import rlu_data
import tensorflow as tf

from fixed_replay.convert import rlu_convert
from fixed_replay.convert.convert_options import ConvertOptions
from fixed_replay.errors import CheckpointError
from fixed_replay.store import compact_store

_STEPS = 24  # Frames per episode here: the damage matters, not the length.


@pytest.fixture(scope='module')
def episodes():
  """Five short real episodes: two for checkpoint 0, two for 1, one for 2."""
  played = rlu_data.play(5, max_steps=200, seed=1)
  layout = [(0, 0), (0, 1), (1, 2), (1, 3), (2, 4)]
  result = []
  for (checkpoint, index), episode in zip(layout, played, strict=True):
    episode = rlu_data.relabel(episode, checkpoint, index)
    episode.frames = episode.frames[:_STEPS]
    episode.actions = episode.actions[:_STEPS]
    episode.rewards = episode.rewards[:_STEPS]
    episode.game_rewards = episode.game_rewards[:_STEPS]
    result.append(episode)
  return result


def _write_run(directory, episodes, shard_1_records):
  directory.mkdir(exist_ok=True)
  shards = [episodes[:2], shard_1_records, episodes[4:]]
  for number, records in enumerate(shards):
    rlu_data.write_shard(rlu_data.shard_path(directory, 1, number, 3), records)
  return rlu_data.shard_path(directory, 1, 1, 3)


def _ints(values):
  return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def _floats(values):
  return tf.train.Feature(float_list=tf.train.FloatList(value=values))


def _frames(frames):
  return tf.train.Feature(bytes_list=tf.train.BytesList(value=frames))


def _pngs(episode):
  return [rlu_data.encode_png(f) for f in episode.frames]


def _bad_records(case, episodes):
  """Shard 1's records with damage of kind `case` in its second record."""
  good, victim = episodes[2], episodes[3]
  damaged = {
    'missing key': lambda: rlu_data.example_bytes(victim, discounts=None),
    'unequal lengths': lambda: rlu_data.example_bytes(
      victim, actions=_ints(victim.actions[:-1].tolist())
    ),
    'undecodable png': lambda: rlu_data.example_bytes(
      victim,
      observations=_frames(
        _pngs(victim)[:5] + [b'\x89PNG...'] + _pngs(victim)[6:]
      ),
    ),
    'wrong-size png': lambda: rlu_data.example_bytes(
      victim,
      observations=_frames(
        _pngs(victim)[:7]
        + [rlu_data.encode_png(np.zeros((80, 84), np.uint8))]
        + _pngs(victim)[8:]
      ),
    ),
    'colour png': lambda: rlu_data.example_bytes(
      victim,
      observations=_frames(
        [cv2.imencode('.png', np.zeros((84, 84, 3), np.uint8))[1].tobytes()]
        + _pngs(victim)[1:]
      ),
    ),
    'checkpoint_idx 50': lambda: rlu_data.example_bytes(
      victim, checkpoint_idx=_ints([50])
    ),
    'duplicate episode_idx': lambda: rlu_data.example_bytes(
      victim, episode_idx=_ints([good.episode_idx])
    ),
    'early terminal': lambda: rlu_data.example_bytes(
      victim, discounts=_floats([1.0] * 3 + [0.0] + [1.0] * (_STEPS - 4))
    ),
    'episode_idx past int32': lambda: rlu_data.example_bytes(
      victim, episode_idx=_ints([2**31])
    ),
    'unclipped_rewards short': lambda: rlu_data.example_bytes(
      victim, unclipped_rewards=_floats([0.0] * (_STEPS - 1))
    ),
  }
  return [rlu_data.example_bytes(good), damaged[case]()]


_EXPECTED = {
  'missing key': r'record 1 \(episode 3\) has no key\(s\) discounts',
  'unequal lengths': r'episode 3 of checkpoint 1 \(record 1\): per-step lists',
  'undecodable png': r'episode 3 of checkpoint 1 \(record 1\): step 5: the '
  'PNG observation does not decode',
  'wrong-size png': r'episode 3 of checkpoint 1 \(record 1\): step 7: '
  r'observation is uint8 \(80, 84\)',
  'colour png': r'episode 3 of checkpoint 1 \(record 1\): step 0: '
  r'observation is uint8 \(84, 84, 3\)',
  'checkpoint_idx 50': r'episode 3 \(record 1\): checkpoint_idx 50 is outside',
  'duplicate episode_idx': r'episode 2 of checkpoint 1 \(record 1\) '
  r'duplicates episode_idx 2 of record 0',
  'early terminal': r'episode 3 of checkpoint 1 \(record 1\): step 3 of 24 '
  'ends the episode',
  'episode_idx past int32': r'record 1: episode_idx 2147483648 is outside '
  'int32',
  'unclipped_rewards short': r'episode 3 of checkpoint 1 \(record 1\): '
  r'per-step lists of unequal length .*unclipped_rewards',
}


def _file_damage(case, path):
  """Damages shard 1's file itself (after its first record)."""
  data = open(path, 'rb').read()
  if case == 'truncated':
    data = data[: len(data) * 2 // 3]
  elif case == 'gzip trailer cut':
    data = data[:-4]
  elif case == 'bit flip':
    data = bytearray(data)
    data[len(data) * 2 // 3] ^= 0x20
  elif case == 'record crc':
    raw = bytearray(gzip.decompress(data))
    raw[-100] ^= 0x01  # Inside the last record's data.
    data = gzip.compress(bytes(raw))
  with open(path, 'wb') as stream:
    stream.write(bytes(data))


_TRUNCATED = (
  r'damaged GZIP TFRecord \(truncated gzip data: the file ends after \d+ '
  r'uncompressed bytes\), after 1 good record\(s\), the last episode 2 of '
  r'checkpoint 1'
)
_FILE_EXPECTED = {
  'truncated': _TRUNCATED,
  # TensorFlow's reader accepted this file; the gzip reader does not.
  'gzip trailer cut': _TRUNCATED,
  'bit flip': r'damaged GZIP TFRecord \(.*(incorrect|invalid|corrupt)',
  'record crc': r'damaged GZIP TFRecord \(corrupted record at \d+\), after 1 '
  r'good record\(s\), the last episode 2',
}


@pytest.fixture(scope='module')
def clean_store(episodes, tmp_path_factory):
  """The store of the undamaged run (the reference for reruns)."""
  directory = tmp_path_factory.mktemp('clean') / 'Breakout'
  _write_run(directory, episodes, episodes[2:4])
  store = tmp_path_factory.mktemp('clean_store')
  rlu_convert.convert_rlu(directory, store, workers=0)
  return directory, store


def _check_failure(directory, store, shard, pattern, clean_store, episodes):
  with pytest.raises(CheckpointError, match=pattern) as caught:
    rlu_convert.convert_rlu(directory, store, workers=0)
  assert str(shard) in str(caught.value)
  leftovers = [n for n in os.listdir(store) if 'partial' in n]
  assert not leftovers
  assert not (store / 'checkpoint_1').exists()
  # Damage in the first frames of a shard stops the conversion before any
  # checkpoint (they train the run's dictionary); later damage, after.
  for name in os.listdir(store):
    if name.startswith('checkpoint_'):
      compact_store.verify_checkpoint(store / name, decode=True)
  # Shard 1 replaced by a good copy: the rerun completes the same store.
  rlu_data.write_shard(shard, episodes[2:4])
  rlu_convert.convert_rlu(directory, store, workers=0)
  # The same rows and frames. Not always the same bytes: the first try
  # indexed shard 0, so the rerun's first round, on which the run's
  # dictionary trains, holds other checkpoints than a clean conversion's.
  assert content_digests(store) == content_digests(clean_store[1])


@pytest.mark.parametrize('case', sorted(_EXPECTED))
def test_bad_record(case, episodes, clean_store, tmp_path):
  directory = tmp_path / 'Breakout'
  shard = _write_run(directory, episodes, _bad_records(case, episodes))
  store = tmp_path / 'store'
  _check_failure(
    directory, store, shard, _EXPECTED[case], clean_store, episodes
  )


@pytest.mark.parametrize('case', sorted(_FILE_EXPECTED))
def test_damaged_file(case, episodes, clean_store, tmp_path):
  directory = tmp_path / 'Breakout'
  shard = _write_run(directory, episodes, episodes[2:4])
  _file_damage(case, shard)
  store = tmp_path / 'store'
  _check_failure(
    directory, store, shard, _FILE_EXPECTED[case], clean_store, episodes
  )


def test_damage_leaves_no_dopamine_files(episodes, tmp_path):
  directory = tmp_path / 'Breakout'
  shard = _write_run(directory, episodes, episodes[2:4])
  _file_damage('truncated', shard)
  store = tmp_path / 'store'
  options = ConvertOptions(output_format='dopamine')
  with pytest.raises(CheckpointError, match='run_1-00001-of-00003'):
    rlu_convert.convert_rlu(directory, store, options=options, workers=0)
  names = sorted(os.listdir(store))
  assert not [n for n in names if '_ckpt.1.gz' in n or 'partial' in n]
  # Dopamine's seven files and the two extra elements.
  assert len([n for n in names if n.endswith('_ckpt.0.gz')]) == 9


def test_duplicate_across_shards_is_refused(episodes, tmp_path):
  directory = tmp_path / 'Breakout'
  twin = rlu_data.relabel(episodes[4], 2, episodes[0].episode_idx)
  _write_run(directory, episodes, episodes[2:4])
  rlu_data.write_shard(rlu_data.shard_path(directory, 1, 2, 3), [twin])
  with pytest.raises(
    CheckpointError, match=r'duplicates episode_idx 0 of record 0 of run_1-0'
  ):
    rlu_convert.convert_rlu(directory, tmp_path / 'store', workers=0)
