"""The TFDS-prepared form: prepared by TFDS' own writer, converted like shards.

TFDS' real `rlu_atari_checkpoints_ordered` builder prepares run 1 of the
shared shards (its input prefix pointed at them, as TFDS' own test does):
array_record files, one split per checkpoint, no Beam, no network (TFDS
4.9.10 leaves its GCS access disabled). Converting that directory must give
the checkpoints converting the raw shards gives, byte for byte but for the
manifest's record of the source.
"""

import json
import os
import subprocess
import sys

import pytest

from fixed_replay.convert import rlu_convert
from fixed_replay.sources import layout
from fixed_replay.sources.rlu import rlu_tfds
from fixed_replay.store import manifest as manifest_lib

# Prepares like `tfds build` does, in a process of its own: TFDS' builder
# decides `is_terminal` with `discounts[-1] == 0.0` inside a tf.data map,
# which compares tensors by identity (always False) in a process where
# Dopamine's TF agents disabled TensorFlow 2 behaviour, as tests in this
# worker process may have done.
_PREPARE = """
import sys
import tensorflow_datasets as tfds
from tensorflow_datasets.rl_unplugged.rlu_atari_checkpoints_ordered import (
  rlu_atari_checkpoints_ordered as module,
)
prefix, data_dir = sys.argv[1:3]
builder_class = module.RluAtariCheckpointsOrdered
builder_class._INPUT_FILE_PREFIX = prefix
builder_class._SHARDS = 3
builder = builder_class(
  config='Breakout_run_1', data_dir=data_dir, file_format='array_record'
)
builder.download_and_prepare(
  download_config=tfds.download.DownloadConfig(try_download_gcs=False)
)
"""


@pytest.fixture(scope='module')
def prepared(rlu_dir, tmp_path_factory):
  """TFDS data_dir holding rlu_atari_checkpoints_ordered/Breakout_run_1."""
  directory, _ = rlu_dir
  prefix = tmp_path_factory.mktemp('tfds_input')
  (prefix / 'Breakout').mkdir()
  for name in os.listdir(directory):
    if name.startswith('run_1-'):
      os.link(directory / name, prefix / 'Breakout' / name)
  data_dir = tmp_path_factory.mktemp('tfds')
  result = subprocess.run(
    [sys.executable, '-c', _PREPARE, str(prefix), str(data_dir)],
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  return data_dir


def _without_source(manifest):
  # The manifest's own checksum covers its 'source' entry too.
  return {
    k: v for k, v in manifest.items() if k not in ('source', 'manifest_crc32')
  }


def test_tfds_directory_converts_to_the_shards_rows(
  rlu_dir, prepared, tmp_path
):
  splits = rlu_tfds.find_splits(rlu_tfds.find_dataset_dir(prepared))
  assert [s.name for s in splits] == [f'checkpoint_0{i}' for i in range(3)]
  from_tfds = tmp_path / 'from_tfds'
  completed = subprocess.run(
    [
      sys.executable,
      '-m',
      'fixed_replay.cli',
      'convert',
      str(prepared),
      str(from_tfds),
      '--workers=0',
    ],
    capture_output=True,
    text=True,
  )
  assert completed.returncode == 0, completed.stderr[-3000:]
  assert 'converted 3 checkpoint(s) [0, 1, 2]' in completed.stdout
  assert 'of TFDS' in completed.stdout
  from_shards = tmp_path / 'from_shards'
  rlu_convert.convert_rlu(rlu_dir[0], from_shards, run=1, workers=0)
  for checkpoint in range(3):
    name = manifest_lib.checkpoint_dirname(checkpoint)
    ours, theirs = from_tfds / name, from_shards / name
    assert sorted(os.listdir(ours)) == sorted(os.listdir(theirs))
    layout = manifest_lib.read_manifest(ours)['tables']['layout']
    assert {'unclipped_reward', 'episode_idx'} <= set(layout)
    for file_name in os.listdir(ours):
      if file_name != manifest_lib.MANIFEST:
        assert (ours / file_name).read_bytes() == (
          theirs / file_name
        ).read_bytes(), file_name
    manifest = json.loads((ours / manifest_lib.MANIFEST).read_text())
    assert _without_source(manifest) == _without_source(
      json.loads((theirs / manifest_lib.MANIFEST).read_text())
    )
    assert list(manifest['source']['files']) == [f'checkpoint_0{checkpoint}']


def test_tfds_split_episodes_match_the_shards(rlu_dir, prepared):
  _, episodes = rlu_dir
  location = rlu_tfds.find_dataset_dir(prepared)
  for checkpoint in range(3):
    read = list(rlu_tfds.iter_episodes(location, f'checkpoint_0{checkpoint}'))
    played = episodes[1, checkpoint]
    assert [e.episode_idx for e in read] == [e.episode_idx for e in played]
    for ours, theirs in zip(read, played, strict=True):
      assert ours.terminal == theirs.terminal
      assert ours.actions.tolist() == theirs.actions.tolist()
      assert ours.rewards.tolist() == theirs.rewards.tolist()
      # TFDS' reward is RL Unplugged's unclipped_rewards, kept as such.
      assert ours.unclipped_rewards.tolist() == theirs.game_rewards.tolist()


def test_layout_knows_a_prepared_dataset_and_train_says_convert(prepared):
  found = layout.detect(prepared)
  assert found.kind is layout.Kind.TFDS and not found.trainable
  assert found.game == 'Breakout'  # From the config, Breakout_run_1.
  assert found.data_dir == rlu_tfds.find_dataset_dir(prepared)
  command = layout.convert_command(found)
  assert command == (
    f'fixed-replay convert {prepared} {prepared.parent / prepared.name}_store'
  )
  completed = subprocess.run(
    [
      sys.executable,
      '-m',
      'fixed_replay.cli',
      'train',
      f'--base_dir={prepared.parent / "run"}',
      f'--replay_dir={prepared}',
    ],
    capture_output=True,
    text=True,
    check=False,
  )
  assert completed.returncode == 1
  assert 'Traceback' not in completed.stderr
  lines = [
    x for x in completed.stderr.splitlines() if x.startswith('fixed-replay')
  ]
  assert lines == [
    f'fixed-replay train: {prepared}: a TFDS-prepared '
    'rlu_atari_checkpoints_ordered dataset: convert it first, then train on '
    f'the store: {command}'
  ]
