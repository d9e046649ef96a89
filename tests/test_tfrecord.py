"""io/tfrecord.py against TensorFlow's own TFRecord reader and Example class.

The shards are written by TensorFlow (`tf.io.TFRecordWriter`, GZIP), and
TensorFlow reads them back as the oracle: the same records, byte for byte,
the same Examples, and the same verdict on every damaged copy.
"""

import gzip
import os
import subprocess
import sys

import numpy as np
import pytest
import rlu_data

from fixed_replay.errors import CheckpointError
from fixed_replay.io import tfrecord

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tensorflow_records(path):
  """Records as TensorFlow reads them, or None if it finds damage."""
  import tensorflow as tf

  try:
    return list(
      tf.compat.v1.io.tf_record_iterator(
        str(path), tf.io.TFRecordOptions('GZIP')
      )
    )
  except tf.errors.OpError:
    return None


def _our_records(path):
  """Records as io/tfrecord reads them, or None if it finds damage."""
  try:
    return [record for _, record in tfrecord.read_records(str(path))]
  except CheckpointError as error:
    assert str(path) in str(error)
    return None


@pytest.fixture(scope='module')
def played():
  return rlu_data.play(3, max_steps=40, seed=5)


@pytest.fixture(scope='module')
def shard(played, tmp_path_factory):
  """A real shard of three Breakout episodes, and an empty record."""
  path = tmp_path_factory.mktemp('tfrecord') / 'run_1-00000-of-00001'
  records = [rlu_data.example_bytes(e) for e in played] + [b'']
  return rlu_data.write_shard(path, records)


def test_records_and_examples_are_tensorflows(shard):
  from tensorflow.core.example import example_pb2

  theirs = _tensorflow_records(shard)
  ours = list(tfrecord.read_records(str(shard)))
  assert [record for _, record in ours] == theirs
  assert len(theirs) == 4 and theirs[-1] == b''
  # Offsets: each record is its 12-byte header, the data and a 4-byte CRC.
  lengths = [len(record) + 16 for record in theirs]
  assert [offset for offset, _ in ours] == np.cumsum(
    [0] + lengths[:-1]
  ).tolist()
  for data in theirs[:-1]:
    expected = example_pb2.Example.FromString(data)
    parsed = tfrecord.Example.FromString(data)
    assert parsed.SerializeToString(deterministic=True) == (
      expected.SerializeToString(deterministic=True)
    )
    features, expected_features = (
      parsed.features.feature,
      expected.features.feature,
    )
    assert sorted(features) == sorted(expected_features)
    for key, feature in features.items():
      kind = expected_features[key].WhichOneof('kind')
      assert feature.WhichOneof('kind') == kind
      assert list(getattr(feature, kind).value) == list(
        getattr(expected_features[key], kind).value
      )


def test_every_damaged_copy_gets_tensorflows_verdict(shard, tmp_path):
  """A flipped byte anywhere in the records: damage exactly when TF says so.

  The damage is made inside the uncompressed stream (then compressed again),
  where only the records' own CRCs can find it: in each record's length, its
  CRC, the data and the data's CRC, and across record boundaries.
  """
  raw = gzip.decompress(shard.read_bytes())
  offsets = [offset for offset, _ in tfrecord.read_records(str(shard))]
  positions = set()
  for offset in offsets:
    positions.update(offset + np.arange(0, 20))  # Header, CRC, data start.
  positions.update(np.linspace(0, len(raw) - 1, 40, dtype=int).tolist())
  positions.update(range(len(raw) - 20, len(raw)))
  rng = np.random.default_rng(0)
  for position in sorted(p for p in positions if p < len(raw)):
    damaged = bytearray(raw)
    damaged[position] ^= int(rng.integers(1, 256))
    path = tmp_path / f'flip_{position}'
    path.write_bytes(gzip.compress(bytes(damaged)))
    theirs, ours = _tensorflow_records(path), _our_records(path)
    assert (ours is None) == (theirs is None), position
    if ours is not None:
      assert ours == theirs, position
  # Cuts in the last (empty, 16-byte) record. TensorFlow takes one that
  # leaves part of its 12-byte header (a cut of 5 to 15 bytes) as the end of
  # the file; a cut record is damage here wherever the cut falls.
  theirs = _tensorflow_records(shard)
  for cut in (1, 4, 5, 11, 15, 16):
    path = tmp_path / f'cut_{cut}'
    path.write_bytes(gzip.compress(raw[:-cut]))
    if cut == 16:  # The whole record: a valid file of three.
      assert _our_records(path) == _tensorflow_records(path) == theirs[:3]
      continue
    if cut < 5:
      assert _tensorflow_records(path) is None, cut
    with pytest.raises(
      CheckpointError, match=f'truncated record at {offsets[-1]}'
    ):
      list(tfrecord.read_records(str(path)))


def test_a_record_claiming_too_many_bytes_is_refused(tmp_path):
  header = (tfrecord.MAX_RECORD_BYTES + 1).to_bytes(8, 'little')
  crc = tfrecord.masked_crc32c(header).to_bytes(4, 'little')
  path = tmp_path / 'huge'
  path.write_bytes(gzip.compress(header + crc + b'x' * 100))
  with pytest.raises(CheckpointError, match=r'record at 0 claims \d+ bytes'):
    list(tfrecord.read_records(str(path)))


def test_reading_a_shard_does_not_import_tensorflow(played, tmp_path):
  """`inspect`, `convert` and `download` read local shards without TF."""
  shard = rlu_data.write_shard(tmp_path / 'run_1-00000-of-00001', played)
  code = (
    'import sys\n'
    'from fixed_replay.sources.rlu import rlu_shards\n'
    f'episodes = list(rlu_shards.iter_episodes({str(shard)!r}))\n'
    'assert "tensorflow" not in sys.modules, "TensorFlow was imported"\n'
    'print(len(episodes), sum(len(e.actions) for e in episodes))\n'
  )
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join([ROOT, env.get('PYTHONPATH', '')])
  result = subprocess.run(
    [sys.executable, '-c', code],
    capture_output=True,
    text=True,
    env=env,
    timeout=120,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  from fixed_replay.sources.rlu import rlu_shards

  episodes = list(rlu_shards.iter_episodes(str(shard)))
  steps = sum(len(e.actions) for e in episodes)
  assert result.stdout.split() == [str(len(episodes)), str(steps)]
