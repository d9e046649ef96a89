"""Where a conversion writes: the store directory, its locks, its errors.

Two advisory locks (flock) live in the store:

* `.convert.lock`, held exclusively by the converting process: one
  conversion per store;
* `.convert.workers.lock`, held shared by each of its worker processes for
  their whole life. A new conversion takes it exclusively (and lets it go)
  before touching anything, so it never works beside a worker left over
  from a killed run. Workers die with their parent (see workers.py); the
  lock is the proof.

Every failure to write is a CheckpointError naming the path and the cause
(no permission, read-only file system, a file in the way, disk full).
"""

from collections.abc import Iterator
import contextlib
import errno
import fcntl
import os
import time
from typing import IO

from fixed_replay.errors import CheckpointError

LOCK_FILE = '.convert.lock'
WORKERS_LOCK_FILE = '.convert.workers.lock'
# Workers of a killed run die within milliseconds (SIGKILL from the kernel);
# this is how long a new run waits for them before giving up.
_OLD_WORKERS_WAIT_S = 10.0

_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_REASONS = {
  errno.EACCES: 'permission denied',
  errno.EPERM: 'permission denied',
  errno.EROFS: 'read-only file system',
  errno.EEXIST: 'a file is in the way',
  errno.ENOTDIR: 'a file is in the way (not a directory)',
  errno.EISDIR: 'a directory is in the way',
  errno.ENOSPC: 'no space left on the device',
  errno.EDQUOT: 'disk quota exceeded',
  errno.EFBIG: 'file too large (file system or process file size limit)',
}


def error(path: str, os_error: OSError) -> CheckpointError:
  """The CheckpointError for an OSError met while writing the store.

  Args:
    path: str, the path being written when no better one is known.
    os_error: OSError.

  Returns:
    CheckpointError naming the file and the cause; after a full disk it says
    that freeing space and running again completes the store.
  """
  where = os_error.filename or path
  reason = _REASONS.get(os_error.errno, os_error.strerror or str(os_error))
  message = f'cannot write the compact store: {reason}'
  if os_error.errno in _FULL:
    message += (
      '. Free space and run the same command again: checkpoints already '
      'converted are kept, the partial one was removed'
    )
  return CheckpointError(str(where), message)


def create(store_dir: str) -> None:
  """Creates the store directory (and parents) if needed.

  Raises:
    CheckpointError: if it cannot be created or is not a directory.
  """
  if os.path.exists(store_dir) and not os.path.isdir(store_dir):
    raise CheckpointError(
      store_dir, 'a file is in the way: the store must be a directory'
    )
  try:
    os.makedirs(store_dir, exist_ok=True)
  except OSError as os_error:
    raise error(store_dir, os_error) from os_error


def _open_lock(store_dir: str, name):
  path = os.path.join(store_dir, name)
  try:
    return open(path, 'a')  # Never truncates: the file holds nothing.
  except OSError as os_error:
    raise error(path, os_error) from os_error


def lock(store_dir: str) -> IO:
  """Takes the store's lock: one converter per store at a time.

  Returns:
    The open lock file; closing it releases the lock.

  Raises:
    CheckpointError: if another conversion holds it, or it cannot be made.
  """
  handle = _open_lock(store_dir, LOCK_FILE)
  try:
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError as blocked:
    handle.close()
    raise CheckpointError(
      store_dir, 'another conversion is writing into this store'
    ) from blocked
  return handle


def wait_for_old_workers(
  store_dir: str, wait_s: float = _OLD_WORKERS_WAIT_S
) -> None:
  """Returns once no worker of an earlier conversion is alive.

  Raises:
    CheckpointError: if one still holds the workers' lock after `wait_s`.
  """
  handle = _open_lock(store_dir, WORKERS_LOCK_FILE)
  deadline = time.monotonic() + wait_s
  try:
    while True:
      try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
      except BlockingIOError as blocked:
        if time.monotonic() > deadline:
          raise CheckpointError(
            os.path.join(store_dir, WORKERS_LOCK_FILE),
            'worker processes of an earlier conversion are still running '
            'and hold this lock: stop them first',
          ) from blocked
        time.sleep(0.05)
  finally:
    handle.close()


def hold_workers_lock(store_dir: str) -> IO:
  """Takes the workers' lock shared, for the life of a worker process."""
  handle = _open_lock(store_dir, WORKERS_LOCK_FILE)
  fcntl.flock(handle, fcntl.LOCK_SH)
  return handle


@contextlib.contextmanager
def synced_file(directory: str, name: str) -> Iterator[IO[bytes]]:
  """A new file, flushed and fsynced once written (then it may commit)."""
  with open(os.path.join(directory, name), 'wb') as stream:
    yield stream
    stream.flush()
    os.fsync(stream.fileno())


def write_bytes(directory: str, name: str, data) -> str:
  """Writes a file of `data` and syncs it; returns `name`."""
  with synced_file(directory, name) as stream:
    stream.write(data)
  return name


def fsync_directory(path: str) -> None:
  descriptor = os.open(path, os.O_RDONLY)
  try:
    os.fsync(descriptor)
  finally:
    os.close(descriptor)
