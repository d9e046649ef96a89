"""`fixed-replay download` against a local directory laid out like the bucket.

tf.io.gfile reads a local path as it reads gs://, so --source_root pointing
at <root>/Breakout/run_<r>-NNNNN-of-00003 stands in for
gs://rl_unplugged/atari_episodes_ordered; nothing leaves the machine.
"""

import os
import signal
import subprocess
import sys
import time

from dopamine_data import content_digests
import pytest
import rlu_data

from fixed_replay.convert import download
from fixed_replay.convert import rlu_convert
from fixed_replay.errors import CheckpointError
from fixed_replay.io import tfrecord


@pytest.fixture(scope='module')
def bucket(rlu_dir, tmp_path_factory):
  """<root>/Breakout/ holding both runs' shards (hard links)."""
  directory, _ = rlu_dir
  root = tmp_path_factory.mktemp('bucket')
  (root / 'Breakout').mkdir()
  for name in os.listdir(directory):
    os.link(directory / name, root / 'Breakout' / name)
  return root


def _cli_download(*args):
  return [sys.executable, '-m', 'fixed_replay.cli', 'download', *map(str, args)]


def _download(*args):
  return _cli_download('--game=Breakout', *args)


def _files(directory):
  return {
    name: (directory / name).read_bytes()
    for name in os.listdir(directory)
    if (directory / name).is_file()
  }


def test_interrupted_download_resumes(bucket, tmp_path):
  # Run 1's shards with their records 50 times over (written by TensorFlow,
  # as the others are): copying and verifying one takes long enough for its
  # temporary file to be seen and the process killed while it exists.
  long_bucket = tmp_path / 'bucket'
  (long_bucket / 'Breakout').mkdir(parents=True)
  for name in os.listdir(bucket / 'Breakout'):
    if name.startswith('run_1-'):
      records = [
        r for _, r in tfrecord.read_records(bucket / 'Breakout' / name)
      ]
      rlu_data.write_shard(long_bucket / 'Breakout' / name, records * 50)
  destination = tmp_path / 'rlu'
  target = destination / 'Breakout'
  process = subprocess.Popen(
    _download('--run=1', destination, f'--source_root={long_bucket}'),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  deadline = time.time() + 120
  temporary = []
  while not temporary and time.time() < deadline:
    if target.exists():
      temporary = [n for n in os.listdir(target) if '.download-' in n]
    time.sleep(0.002)
  # Killed while a shard is copied or verified (not yet renamed).
  os.kill(process.pid, signal.SIGKILL)
  process.wait()
  assert temporary, 'the download never started'
  done = [n for n in os.listdir(target) if n.startswith('run_1-')]
  assert len(done) < 3, done

  completed = subprocess.run(
    _download('--run=1', destination, f'--source_root={long_bucket}'),
    capture_output=True,
    text=True,
  )
  assert completed.returncode == 0, completed.stderr[-3000:]
  expected = f'downloaded {3 - len(done)} shard(s), {len(done)} already there'
  assert expected in completed.stdout
  source = {
    n: b
    for n, b in _files(long_bucket / 'Breakout').items()
    if n.startswith('run_1')
  }
  assert _files(target) == source  # No temporary left, every byte copied.

  result, _, _ = download.download_run(
    'Breakout', 1, destination, [0, 2], root=str(long_bucket)
  )
  assert result.downloaded == [] and len(result.skipped) == 2


def test_damaged_source_is_not_kept(bucket, tmp_path):
  root = tmp_path / 'bucket'
  (root / 'Breakout').mkdir(parents=True)
  for name in os.listdir(bucket / 'Breakout'):
    data = (bucket / 'Breakout' / name).read_bytes()
    if name == 'run_1-00001-of-00003':
      data = data[: len(data) // 2]
    (root / 'Breakout' / name).write_bytes(data)
  destination = tmp_path / 'rlu'
  with pytest.raises(
    CheckpointError, match=r'run_1-00001-of-00003: the copy failed its check'
  ):
    download.download_run('Breakout', 1, destination, root=str(root))
  assert sorted(os.listdir(destination / 'Breakout')) == [
    'run_1-00000-of-00003'
  ]


def test_checkpoint_ranges():
  assert download.parse_checkpoints('0-2,7,9-10') == [0, 1, 2, 7, 9, 10]
  with pytest.raises(ValueError, match='bad checkpoint range'):
    download.parse_checkpoints('3-1')


def test_download_and_convert_keeps_no_raw_copy(bucket, rlu_dir, tmp_path):
  """Run 2 (checkpoints spanning shards): shards fetched again as needed."""
  destination = tmp_path / 'rlu'
  completed = subprocess.run(
    _download(
      '--run=2',
      destination,
      f'--source_root={bucket}',
      '--convert',
      '--checkpoints=0-2',
    ),
    capture_output=True,
    text=True,
  )
  assert completed.returncode == 0, completed.stderr[-3000:]
  assert 'converted checkpoint(s) [0, 1, 2]' in completed.stdout
  store = destination / 'Breakout' / 'run_2_compact'
  assert sorted(os.listdir(destination / 'Breakout')) == ['run_2_compact']
  reference = tmp_path / 'reference'
  rlu_convert.convert_rlu(rlu_dir[0], reference, run=2, workers=0)
  # The same rows and frames; the units differ as the run's dictionary
  # does: trained on the checkpoints the download had when it began.
  for checkpoint in range(3):
    name = f'checkpoint_{checkpoint}'
    assert content_digests(store / name) == content_digests(reference / name)


def test_several_runs_convert_into_the_layout_a_mixture_reads(bucket, tmp_path):
  """--games/--runs with --store_root: ROOT/<Game>/<run>, then a mixture."""
  root = tmp_path / 'games'
  completed = subprocess.run(
    _cli_download(
      '--games=Breakout',
      '--runs=1,2',
      tmp_path / 'rlu',
      f'--source_root={bucket}',
      '--convert',
      f'--store_root={root}',
      '--checkpoints=0-1',
    ),
    capture_output=True,
    text=True,
  )
  assert completed.returncode == 0, completed.stderr[-3000:]
  assert 'Breakout run 1: downloaded' in completed.stdout
  assert 'Breakout run 2: downloaded' in completed.stdout
  assert sorted(os.listdir(root / 'Breakout')) == ['1', '2']
  from fixed_replay.mixture import ReplayMixture

  with ReplayMixture(str(root), batch_size=64, seed=0) as mixture:
    assert [(r.game, r.name) for r in mixture.runs] == [
      ('Breakout', '1'),
      ('Breakout', '2'),
    ]
    batch = mixture.sample()
    assert set(batch['run'].tolist()) == {0, 1}
  # One run's store dir cannot take several runs.
  refused = subprocess.run(
    _cli_download(
      '--games=Breakout',
      '--runs=1,2',
      tmp_path / 'rlu',
      '--convert',
      f'--store_dir={tmp_path / "one"}',
    ),
    capture_output=True,
    text=True,
  )
  assert refused.returncode != 0
  assert 'use --store_root' in refused.stderr
