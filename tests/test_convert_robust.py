"""convert killed at any moment, or writing where it cannot.

A real `fixed-replay convert` process is killed at several moments (while
its worker processes start, while they write, after a checkpoint is done;
by SIGKILL, SIGTERM and SIGINT): no process of it may survive, and the rerun
must complete a store byte-identical to an uninterrupted conversion.
Destination problems (a file in the way, a read-only file system, a full
disk) must be clear errors naming the path; after a full disk, freeing space
and rerunning completes the store. Full disks are real: a process file size
limit (RLIMIT_FSIZE: EFBIG) and, where user namespaces are allowed, a small
tmpfs mounted in a private namespace (ENOSPC); the machine's disk is never
filled.
"""

import os
import resource
import shutil
import signal
import subprocess
import sys
import time

from dopamine_data import file_digests
import pytest

from fixed_replay.convert import convert
from fixed_replay.errors import CheckpointError
from fixed_replay.store import manifest as manifest_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# conftest's four checkpoints and hard links to them under more suffixes.
_LINKED = {0: 0, 1: 1, 3: 3, 7: 7, 10: 0}
_LOCK_FILES = ('.convert.lock', '.convert.workers.lock')


def _linked_run(dopamine_dir, directory, linked):
  for name in os.listdir(dopamine_dir[0]):
    for suffix, of in linked.items():
      if name.endswith(f'_ckpt.{of}.gz'):
        target = name.replace(f'_ckpt.{of}.gz', f'_ckpt.{suffix}.gz')
        os.link(dopamine_dir[0] / name, directory / target)
  return directory


@pytest.fixture(scope='module')
def source(dopamine_dir, tmp_path_factory):
  """Enough checkpoints for a conversion to be killed midway."""
  return _linked_run(dopamine_dir, tmp_path_factory.mktemp('source'), _LINKED)


@pytest.fixture(scope='module')
def reference(source, tmp_path_factory):
  """Digests of an uninterrupted conversion."""
  directory = tmp_path_factory.mktemp('reference')
  convert.convert(source, directory, workers=2)
  return file_digests(directory), directory


@pytest.fixture(scope='module')
def small_source(dopamine_dir, tmp_path_factory):
  """Two checkpoints: enough for the destination tests."""
  return _linked_run(
    dopamine_dir, tmp_path_factory.mktemp('small_source'), {0: 0, 3: 3}
  )


@pytest.fixture(scope='module')
def small_reference(small_source, tmp_path_factory):
  directory = tmp_path_factory.mktemp('small_reference')
  convert.convert(small_source, directory, workers=2)
  return file_digests(directory), directory


def _command(source, store, *flags):
  return [
    sys.executable,
    '-m',
    'fixed_replay.cli',
    'convert',
    str(source),
    str(store),
    *flags,
  ]


def _start(source, store, log):
  """Starts a conversion as the leader of a new session (its processes)."""
  return subprocess.Popen(
    _command(source, store, '--workers=2'),
    cwd=REPO,
    stdout=log,
    stderr=log,
    start_new_session=True,
  )


def _processes():
  """{pid: (parent pid, session id, command line)} of every process."""
  found = {}
  for entry in os.listdir('/proc'):
    if not entry.isdigit():
      continue
    try:
      with open(f'/proc/{entry}/stat') as stream:
        fields = stream.read().rsplit(')', 1)[1].split()
      with open(f'/proc/{entry}/cmdline', 'rb') as stream:
        command = stream.read().replace(b'\0', b' ').decode(errors='replace')
    except OSError:
      continue
    if fields[0] != 'Z':  # Zombies are gone, waiting to be reaped.
      found[int(entry)] = (int(fields[1]), int(fields[3]), command)
  return found


def _workers_started(process, store):
  return any(
    parent == process.pid and 'spawn_main' in command
    for parent, _, command in _processes().values()
  )


def _writing(process, store):
  return store.exists() and any('partial' in n for n in os.listdir(store))


def _one_done(process, store):
  return store.exists() and any(
    n.startswith('checkpoint_') for n in os.listdir(store)
  )


def _after(seconds):
  began = time.monotonic()
  return lambda process, store: time.monotonic() - began > seconds


def _survivors(session, wait_s=10.0):
  """Processes of `session` still alive after up to wait_s seconds."""
  deadline = time.monotonic() + wait_s
  while True:
    alive = [
      (pid, command)
      for pid, (_, sid, command) in _processes().items()
      if sid == session
    ]
    if not alive or time.monotonic() > deadline:
      return alive
    time.sleep(0.05)


def test_killed_at_any_moment_leaves_nothing_running(
  source, reference, tmp_path
):
  store = tmp_path / 'store'
  moments = [
    ('in its first second', _after(0.3), signal.SIGKILL),
    ('while workers start', _workers_started, signal.SIGKILL),
    ('while workers write', _writing, signal.SIGTERM),
    ('after a checkpoint is done', _one_done, signal.SIGINT),
  ]
  for label, ready, signal_number in moments:
    with open(tmp_path / f'{label}.log', 'w') as log:
      process = _start(source, store, log)
      deadline = time.monotonic() + 120
      while not ready(process, store) and time.monotonic() < deadline:
        assert process.poll() is None, f'finished before being killed {label}'
        time.sleep(0.002)
      process.send_signal(signal_number)
      process.wait(timeout=60)
    survivors = _survivors(process.pid)
    assert not survivors, (label, survivors)
    # Nothing is written once it is dead.
    before = file_digests(store) if store.exists() else {}
    time.sleep(0.3)
    assert (file_digests(store) if store.exists() else {}) == before, label
  done = [n for n in os.listdir(store) if n.startswith('checkpoint_')]
  # The last kill may land after the last checkpoint was committed.
  assert 1 <= len(done) <= len(_LINKED), done

  result = convert.convert(source, store, workers=2)
  assert sorted(result.converted + result.skipped) == sorted(_LINKED)
  assert not [n for n in os.listdir(store) if 'partial' in n]
  assert file_digests(store) == reference[0]


def _run_cli(source, store, preexec_fn=None):
  return subprocess.run(
    _command(source, store, '--workers=2'),
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    preexec_fn=preexec_fn,
  )


def test_a_file_in_the_way_is_named(small_source, tmp_path):
  in_the_way = tmp_path / 'store'
  in_the_way.write_text('not a directory')
  completed = _run_cli(small_source, in_the_way)
  assert completed.returncode == 1
  assert f'{in_the_way}: a file is in the way' in completed.stderr
  assert 'Traceback' not in completed.stderr
  with pytest.raises(CheckpointError, match='a file is in the way'):
    convert.convert(small_source, in_the_way / 'store', workers=0)


def _user_namespaces_work():
  try:
    return (
      subprocess.run(
        ['unshare', '--user', '--map-root-user', '--mount', 'true'],
        capture_output=True,
        timeout=30,
      ).returncode
      == 0
    )
  except (OSError, subprocess.SubprocessError):
    return False


def _in_namespace(script, tmp_path):
  """Runs a shell script in a private user and mount namespace."""
  return subprocess.run(
    ['unshare', '--user', '--map-root-user', '--mount', 'sh', '-c', script],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )


def _convert_line(source, store):
  return ' '.join(
    f"'{part}'" for part in _command(source, store, '--workers=2')
  )


def test_a_read_only_destination_is_named(small_source, tmp_path):
  target = tmp_path / 'read_only'
  target.mkdir()
  store = target / 'store'
  if os.geteuid() != 0:  # Permissions hold only for a user who is not root.
    target.chmod(0o555)
    try:
      completed = _run_cli(small_source, store)
    finally:
      target.chmod(0o755)
    assert completed.returncode == 1
    assert f'{store}: cannot write the compact store: permission denied' in (
      completed.stderr
    )
  if not _user_namespaces_work():
    pytest.skip('no user namespaces for a read-only mount')
  completed = _in_namespace(
    f"mount --bind '{target}' '{target}' && "
    f"mount -o remount,bind,ro '{target}' && "
    f'{_convert_line(small_source, store)}',
    tmp_path,
  )
  assert completed.returncode == 1, completed.stderr[-2000:]
  assert f'{store}: cannot write the compact store: read-only file system' in (
    completed.stderr
  )
  assert 'Traceback' not in completed.stderr


def test_a_file_size_limit_fails_cleanly_and_the_rerun_completes(
  small_source, small_reference, tmp_path
):
  smallest = min(
    os.path.getsize(os.path.join(small_reference[1], name, 'observation.units'))
    for name in os.listdir(small_reference[1])
    if name.startswith('checkpoint_')
  )
  limit = smallest // 2

  def limit_file_size():
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

  store = tmp_path / 'store'
  completed = _run_cli(small_source, store, preexec_fn=limit_file_size)
  assert completed.returncode == 1, completed.stderr[-2000:]
  # The run's dictionary, larger than these small units, is written first:
  # the error names the store.
  assert f'convert: {store}: cannot write the compact store' in (
    completed.stderr
  )
  assert 'file too large' in completed.stderr
  assert 'Free space and run the same command again' in completed.stderr
  assert 'Traceback' not in completed.stderr
  assert not [n for n in os.listdir(store) if n.startswith('.checkpoint_')]
  assert not [n for n in os.listdir(store) if 'dict' in n]  # Tidied.
  # Space freed (the limit lifted): the same command completes the store.
  convert.convert(small_source, store, workers=2)
  assert file_digests(store) == small_reference[0]


def test_a_full_disk_fails_cleanly_and_the_rerun_completes(
  small_source, small_reference, tmp_path
):
  if not _user_namespaces_work():
    pytest.skip('no user namespaces for a small tmpfs')
  total = sum(
    os.path.getsize(os.path.join(root, name))
    for root, _, names in os.walk(small_reference[1])
    for name in names
  )
  # Room for the run's dictionary (written first) and half the checkpoints.
  dictionary = os.path.getsize(
    small_reference[1] / manifest_lib.RUN_DICTIONARY_FILE
  )
  size = dictionary + (total - dictionary) // 2
  mount = tmp_path / 'small_disk'
  mount.mkdir()
  store = mount / 'store'
  out = tmp_path / 'out'
  line = _convert_line(small_source, store)
  # Fill the tmpfs, then grow it (freeing space) and run again; the store is
  # copied out before the namespace, and the tmpfs with it, goes away.
  script = (
    f"mount -t tmpfs -o size={size // 1024}k tmpfs '{mount}' && "
    f'{{ {line}; echo "first=$?"; }} && '
    f"mount -o remount,size=64m '{mount}' && "
    f'{{ {line} >/dev/null 2>&1; echo "second=$?"; }} && '
    f"cp -a '{store}' '{out}'"
  )
  completed = _in_namespace(script, tmp_path)
  assert 'first=1' in completed.stdout, completed.stderr[-3000:]
  assert f'{store}/checkpoint_' in completed.stderr
  assert 'no space left on the device' in completed.stderr
  assert 'Free space and run the same command again' in completed.stderr
  assert 'Traceback' not in completed.stderr
  assert 'second=0' in completed.stdout, completed.stderr[-3000:]
  assert file_digests(out) == small_reference[0]
  shutil.rmtree(out)
