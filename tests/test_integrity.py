"""No row of a file failing its gzip CRC-32 or length check reaches a sampler.

The damage used here is the subtlest there is: one bit of the CRC-32 stored
in the gzip trailer. Every byte inflates exactly as before, so only a reader
that checks the trailer can tell; a window that ends before its file does
must therefore inflate the rest before anyone may sample it.
"""

import os
import re
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

from fixed_replay.errors import CheckpointError
from fixed_replay.io import npy_stream
from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer
from fixed_replay.sources.dopamine import checkpoints

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORRUPT = 'corrupt gzip data'


def _copy(dopamine_dir, tmp_path, suffixes):
  """Hard links to the fixture's files of `suffixes` (nothing copied)."""
  source = dopamine_dir[0]
  copy = tmp_path / 'run'
  copy.mkdir()
  for name in os.listdir(source):
    if any(name.endswith(f'_ckpt.{s}.gz') for s in suffixes):
      os.link(source / name, copy / name)
  return copy


def _break_crc(path):
  """Flips one bit of the CRC-32 in the gzip trailer (not of the link)."""
  data = bytearray(path.read_bytes())
  data[-8] ^= 0x01
  os.remove(path)
  path.write_bytes(data)
  return str(path)


def test_windows_are_returned_only_after_the_whole_file_is_checked(
  dopamine_dir, tmp_path
):
  run = _copy(dopamine_dir, tmp_path, [3])
  intact = checkpoints.read_checkpoint(
    checkpoints.find_checkpoints(dopamine_dir[0])[3], 100, 50
  )
  damaged = _break_crc(run / '$store$_observation_ckpt.3.gz')
  files = checkpoints.find_checkpoints(run)[3]
  for start, count in ((100, 50), (0, 1), (0, None)):
    with pytest.raises(
      CheckpointError, match=re.escape(f'{damaged}: {CORRUPT}')
    ):
      checkpoints.read_checkpoint(files, start, count)
  # Turned off explicitly (data verified once): the window, unchecked...
  window = checkpoints.read_checkpoint(files, 100, 50, verify=False)
  assert window.store['observation'].tobytes() == (
    intact.store['observation'].tobytes()
  )
  # ...but a read reaching the end of the file is checked regardless.
  with pytest.raises(CheckpointError, match=CORRUPT):
    checkpoints.read_checkpoint(files, 950, 50, verify=False)


def test_truncated_trailer_and_wrong_length_are_refused(tmp_path):
  path = tmp_path / 'rows.gz'
  import gzip

  with gzip.open(path, 'wb') as stream:
    np.save(stream, np.arange(1000, dtype=np.int32))
  data = path.read_bytes()
  path.write_bytes(data[:-4])  # The ISIZE field is gone.
  with pytest.raises(CheckpointError, match='truncated'):
    npy_stream.read_rows(str(path), 0, 10)
  wrong_length = bytearray(data)
  wrong_length[-1] ^= 0x40
  path.write_bytes(wrong_length)
  with pytest.raises(CheckpointError, match=CORRUPT):
    npy_stream.read_rows(str(path), 0, 10)


def test_buffer_refuses_a_damaged_first_set(dopamine_dir, tmp_path):
  run = _copy(dopamine_dir, tmp_path, [1])
  damaged = _break_crc(run / '$store$_terminal_ckpt.1.gz')
  with pytest.raises(CheckpointError, match=re.escape(f'{damaged}: {CORRUPT}')):
    FixedReplayBuffer(str(run), 1, replay_capacity=300, prefetch=False)
  # verify_checksums=False: for data verified once, windows are not checked
  # past their end.
  buffer = FixedReplayBuffer(
    str(run), 1, replay_capacity=300, prefetch=False, verify_checksums=False
  )
  assert buffer.num_valid_transitions > 0


def test_a_damaged_background_load_fails_the_reload(dopamine_dir, tmp_path):
  run = _copy(dopamine_dir, tmp_path, [0, 3])
  damaged = _break_crc(run / '$store$_action_ckpt.3.gz')
  buffer = None
  for seed in range(20):  # Until the first draw is the intact checkpoint.
    try:
      buffer = FixedReplayBuffer(
        str(run), None, num_buffers_to_load=1, replay_capacity=300, seed=seed
      )
      break
    except CheckpointError as error:
      assert damaged in str(error)
  assert buffer is not None and buffer.loaded_suffixes == [0]
  failed = None
  for _ in range(40):
    assert set(buffer.sample_transition_batch(256)[-1]) == {0}
    try:
      buffer.reload_buffer()
    except CheckpointError as error:
      failed = error
      break
  buffer.close()
  assert failed is not None and damaged in str(failed)
  # The intact set stays in use: nothing of checkpoint 3 was ever sampled.
  assert buffer.loaded_suffixes == [0]
  assert set(buffer.sample_transition_batch(256)[-1]) == {0}


def test_tf_wrapper_refuses_damaged_data(dopamine_dir, tmp_path):
  from fixed_replay.agents.tf.wrapped_fixed_replay_buffer import (
    WrappedFixedReplayBuffer,
  )

  run = _copy(dopamine_dir, tmp_path, [7])
  damaged = _break_crc(run / '$store$_reward_ckpt.7.gz')
  with pytest.raises(CheckpointError, match=CORRUPT):
    WrappedFixedReplayBuffer(
      str(run), 7, (84, 84), 4, replay_capacity=200, batch_size=8
    )
  assert os.path.exists(damaged)


@pytest.mark.parametrize('fits_twice', [True, False])
def test_reload_without_prefetch_never_shows_samplers_an_empty_set(
  dopamine_dir, fits_twice
):
  directory, _, _ = dopamine_dir
  window_bytes = 1000 * (
    84 * 84 + 4 + 4 + 1 + 8
  )  # See checkpoint_loading.shard_bytes.
  buffer = FixedReplayBuffer(
    str(directory),
    None,
    num_buffers_to_load=1,
    prefetch=False,
    seed=3,
    memory_budget=int(window_bytes * (2.5 if fits_twice else 1.5)),
  )
  stop, errors, batches = threading.Event(), [], []

  def sample():
    while not stop.is_set():
      try:
        batches.append(len(buffer.sample_transition_batch(32)[0]))
      except Exception as error:  # noqa: BLE001 - the failure tested for.
        errors.append(error)
        return

  threads = [threading.Thread(target=sample) for _ in range(2)]
  for thread in threads:
    thread.start()
  seen = set()
  for _ in range(8):
    buffer.reload_buffer()
    seen.update(buffer.loaded_suffixes)
  stop.set()
  for thread in threads:
    thread.join()
  assert not errors, errors[0]
  assert batches and set(batches) == {32}
  assert len(seen) > 1  # Sets really changed.


def test_train_cli_names_the_damaged_file(dopamine_dir, tmp_path):
  run = _copy(dopamine_dir, tmp_path, [3])
  damaged = _break_crc(run / '$store$_observation_ckpt.3.gz')
  completed = subprocess.run(
    [
      sys.executable,
      '-m',
      'fixed_replay.cli',
      'train',
      f'--base_dir={tmp_path / "train"}',
      f'--replay_dir={run}',
      '--agent_name=dqn',
      '--gin_files=configs/dqn.gin',
      '--gin_bindings=FixedReplayBuffer.num_buffers_to_load = 1',
      '--gin_bindings=FixedReplayBuffer.replay_capacity = 200',
      '--gin_bindings=FixedReplayRunner.num_iterations = 1',
    ],
    capture_output=True,
    text=True,
    cwd=REPO,
    timeout=300,
  )
  assert completed.returncode == 1, completed.stderr[-2000:]
  assert f'fixed-replay train: {damaged}: {CORRUPT}' in completed.stderr
  assert 'Traceback' not in completed.stderr
  shutil.rmtree(tmp_path / 'train', ignore_errors=True)
