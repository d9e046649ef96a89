"""Conversion into a compact store: atomic, resumable, deterministic."""

import fcntl
import os
import signal
import subprocess
import sys
import time

from dopamine_data import file_digests
import pytest

from fixed_replay.convert import convert
from fixed_replay.convert import convert_options
from fixed_replay.errors import CheckpointError
from fixed_replay.store import manifest as manifest_lib

# More checkpoints than conftest's four, as hard links (nothing copied), so
# that a conversion killed after its first checkpoint is surely midway.
_LINKED_SUFFIXES = {0: 0, 1: 1, 3: 3, 7: 7, 10: 0, 11: 1, 12: 3, 13: 7}


@pytest.fixture(scope='module')
def source(dopamine_dir, tmp_path_factory):
  """Eight checkpoints: conftest's four and hard links to them."""
  directory = tmp_path_factory.mktemp('source')
  original = dopamine_dir[0]
  for name in os.listdir(original):
    for suffix, of in _LINKED_SUFFIXES.items():
      if name.endswith(f'_ckpt.{of}.gz'):
        target = name.replace(f'_ckpt.{of}.gz', f'_ckpt.{suffix}.gz')
        os.link(original / name, directory / target)
  return directory


@pytest.fixture(scope='module')
def reference(source, tmp_path_factory):
  """An uninterrupted conversion, by a pool of worker processes."""
  directory = tmp_path_factory.mktemp('reference')
  result = convert.convert(source, directory, workers=2)
  assert sorted(result.converted) == sorted(_LINKED_SUFFIXES)
  return directory, result


_LOCK_FILES = ('.convert.lock', '.convert.workers.lock')


def _store_files(directory):
  return {
    path: digest
    for path, digest in file_digests(directory, skip_prefix=None).items()
    if path not in _LOCK_FILES
  }


def test_conversion_reports_and_leaves_source_unchanged(
  source, reference, tmp_path
):
  before = file_digests(source, skip_prefix=None)
  result = convert.convert(source, tmp_path / 'store', workers=0)
  assert file_digests(source, skip_prefix=None) == before
  assert result.frames == 8 * 1000 and not result.skipped
  assert 0 < result.store_bytes
  assert result.source_bytes == sum(
    os.path.getsize(source / name) for name in os.listdir(source)
  )
  # In-process and pooled conversions write the same bytes.
  assert _store_files(tmp_path / 'store') == _store_files(reference[0])


def test_killed_conversion_resumes_to_identical_store(
  source, reference, tmp_path
):
  store = tmp_path / 'store'
  process = subprocess.Popen(
    [
      sys.executable,
      '-m',
      'fixed_replay.cli',
      'convert',
      str(source),
      str(store),
      '--workers=1',
    ],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  deadline = time.time() + 120
  complete = []
  while not complete and time.time() < deadline:
    if store.exists():
      complete = [n for n in os.listdir(store) if n.startswith('checkpoint_')]
    time.sleep(0.002)
  os.kill(process.pid, signal.SIGKILL)
  process.wait()
  time.sleep(0.2)  # The worker dies with its parent.
  complete = [n for n in os.listdir(store) if n.startswith('checkpoint_')]
  assert 1 <= len(complete) < len(_LINKED_SUFFIXES), complete

  result = convert.convert(source, store, workers=2)
  assert sorted(result.skipped) == sorted(
    int(n.split('_')[1]) for n in complete
  )
  assert sorted(result.skipped + result.converted) == sorted(_LINKED_SUFFIXES)
  assert not [n for n in os.listdir(store) if 'partial' in n]
  assert _store_files(store) == _store_files(reference[0])


def test_rerun_skips_everything(source, reference):
  store, _ = reference
  before = _store_files(store)
  result = convert.convert(source, store)
  assert result.converted == [] and len(result.skipped) == 8
  assert _store_files(store) == before


def test_partial_directories_are_removed_and_redone(
  source, reference, tmp_path
):
  store = tmp_path / 'store'
  convert.convert(source, store, workers=0)
  # A checkpoint half written when its conversion was killed:
  os.rename(store / 'checkpoint_12', store / '.checkpoint_12.partial-999')
  os.remove(store / '.checkpoint_12.partial-999' / manifest_lib.MANIFEST)
  result = convert.convert(source, store, workers=0)
  assert result.converted == [12]
  assert _store_files(store) == _store_files(reference[0])


def test_damaged_stored_checkpoint_is_not_skipped_silently(source, tmp_path):
  store = tmp_path / 'store'
  convert.convert(source, store, workers=0)
  directory = store / 'checkpoint_3'
  offset = manifest_lib.read_manifest(directory)['tables']['layout']['reward']
  with open(directory / 'tables', 'r+b') as stream:
    stream.seek(offset['offset'] + 2)
    stream.write(b'\x01\x02')
  with pytest.raises(CheckpointError, match=r'checkpoint_3/tables: damaged'):
    convert.convert(source, store, workers=0)


def test_other_options_on_resume_are_refused(source, reference):
  with pytest.raises(CheckpointError, match='block_rows.: 32'):
    convert.convert(
      source,
      reference[0],
      convert_options.ConvertOptions(block_rows=32),
      workers=0,
    )


def test_damaged_source_names_the_file_and_leaves_nothing(
  dopamine_dir, tmp_path
):
  source = tmp_path / 'source'
  os.mkdir(source)
  for name in os.listdir(dopamine_dir[0]):
    if name.endswith('_ckpt.1.gz'):
      os.link(dopamine_dir[0] / name, source / name)
  bad = source / '$store$_observation_ckpt.1.gz'
  data = bad.read_bytes()
  os.remove(bad)  # The link: the fixture's file stays intact.
  bad.write_bytes(data[: len(data) // 2])
  with pytest.raises(CheckpointError, match=r'observation_ckpt\.1\.gz'):
    convert.convert(source, tmp_path / 'store', workers=1)
  assert [
    n for n in os.listdir(tmp_path / 'store') if n not in _LOCK_FILES
  ] == []


def test_one_converter_per_store(source, tmp_path):
  store = tmp_path / 'store'
  os.mkdir(store)
  with open(store / '.convert.lock', 'w') as held:
    fcntl.flock(held, fcntl.LOCK_EX)
    with pytest.raises(CheckpointError, match='another conversion'):
      convert.convert(source, store, workers=0)


def test_store_must_not_be_the_source(source):
  with pytest.raises(CheckpointError, match='must not be the source'):
    convert.convert(source, source)


def test_cli_prints_summary(source, tmp_path):
  completed = subprocess.run(
    [
      sys.executable,
      '-m',
      'fixed_replay.cli',
      'convert',
      str(source),
      str(tmp_path / 'store'),
      '--workers=0',
      '--block_rows=8',
    ],
    capture_output=True,
    text=True,
    check=True,
  )
  assert 'converted 8 checkpoint(s)' in completed.stdout
  manifest = manifest_lib.read_manifest(tmp_path / 'store' / 'checkpoint_0')
  assert manifest['observation']['block_rows'] == 8


def test_small_job_converts_in_this_process_by_default(source, tmp_path):
  """Without --workers a small job skips the worker start-up; same bytes."""
  completed = subprocess.run(
    [
      sys.executable,
      '-m',
      'fixed_replay.cli',
      'convert',
      str(source),
      str(tmp_path / 'default'),
    ],
    capture_output=True,
    text=True,
  )
  assert completed.returncode == 0, completed.stderr[-3000:]
  assert 'Converting in this process (8 checkpoints' in completed.stderr
  convert.convert(source, tmp_path / 'pool', workers=2)
  assert file_digests(tmp_path / 'default') == file_digests(tmp_path / 'pool')
