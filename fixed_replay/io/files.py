"""File access for local paths and anything `tf.io.gfile` reads (gs://...).

Local paths use the standard library so that reading a checkpoint never pays
for importing TensorFlow; paths with a URL scheme go through `tf.io.gfile`,
each call bounded in time and failing with its cause (see remote.py).
"""

import os
import re
from typing import BinaryIO

from fixed_replay.io import remote

_URL_SCHEME = re.compile(r'^[a-zA-Z][a-zA-Z0-9+.-]*://')


def is_remote(path: str) -> bool:
  """Returns True for paths with a URL scheme such as gs:// or s3://."""
  return bool(_URL_SCHEME.match(str(path)))


def _gfile():
  """tf.io.gfile, imported in the caller's thread.

  Never inside remote.call: importing TensorFlow takes seconds, which must
  not count against the network's time limit.
  """
  import tensorflow as tf

  return tf.io.gfile


def _children_lister():
  """Returns a function listing a remote directory.

  Not tf.io.gfile.listdir: its isdir check turns a network failure into
  'Could not find directory'.
  """
  try:
    from tensorflow.python.lib.io import _pywrap_file_io
  except ImportError:  # pragma: no cover - private module moved.
    return _gfile().listdir

  def get_children(directory: str):
    return [
      name.decode() if isinstance(name, bytes) else name
      for name in _pywrap_file_io.GetChildren(directory.encode())
    ]

  return get_children


def _remote_isdir(tf, path: str):
  # Not gfile.isdir first: it says False for any failure, after spending its
  # whole retry budget. stat raises the failure's cause instead.
  try:
    return tf.io.gfile.stat(path).is_directory
  except tf.errors.NotFoundError:
    return False
  except Exception as error:
    if remote.classify(str(error)):
      raise
    # A file system whose stat skips directories.
    return tf.io.gfile.isdir(path)


def join(directory: str, name: str) -> str:
  """Joins a directory and a file name, for local and remote paths alike."""
  directory = str(directory)
  if is_remote(directory):
    return directory.rstrip('/') + '/' + name
  return os.path.join(directory, name)


def isdir(path: str) -> bool:
  """Whether path is a directory; raises RemoteError on a network failure."""
  if is_remote(path):
    import tensorflow as tf

    return remote.call('checking the directory', path, _remote_isdir, tf, path)
  return os.path.isdir(path)


def exists(path: str) -> bool:
  if is_remote(path):
    return remote.call('checking the path', path, _gfile().exists, path)
  return os.path.exists(path)


def listdir(directory: str) -> list[str]:
  """Returns the entry names of a directory (no trailing slashes)."""
  if is_remote(directory):
    names = remote.call(
      'listing the directory', directory, _children_lister(), str(directory)
    )
    return [name.rstrip('/') for name in names]
  return os.listdir(directory)


def size(path: str) -> int:
  """Returns a file's size in bytes."""
  if is_remote(path):
    gfile = _gfile()
    return remote.call(
      'reading the file size', path, lambda: gfile.stat(path).length
    )
  return os.path.getsize(path)


class _RemoteReader:
  """A tf.io.gfile file whose every read is bounded in time."""

  def __init__(self, path: str) -> None:
    self._path = path
    self._file = remote.call(
      'opening the file', path, _gfile().GFile, path, 'rb'
    )

  def read(self, num_bytes: int):
    return remote.call(
      'reading the file', self._path, self._file.read, num_bytes
    )

  def readinto(self, buffer):
    """Fills as much of `buffer` as one bounded read gives (gzip readers)."""
    view = memoryview(buffer).cast('B')
    data = self.read(len(view))
    view[: len(data)] = data
    return len(data)

  def size(self):
    return remote.call('reading the file size', self._path, self._file.size)

  def close(self) -> None:
    self._file.close()

  def __enter__(self):  # `with storage.open_read(path)`, as for a local file.
    return self

  def __exit__(self, *exc_info):
    self.close()


def open_read(path: str) -> BinaryIO:
  """Opens a file for binary reading (remote reads are time-bounded)."""
  if is_remote(path):
    return _RemoteReader(str(path))
  return open(path, 'rb')


def open_write(path: str) -> BinaryIO:
  """Opens a file for binary writing."""
  if is_remote(path):
    return remote.call('creating the file', path, _gfile().GFile, path, 'wb')
  return open(path, 'wb')


def makedirs(directory: str) -> None:
  if is_remote(directory):
    remote.call(
      'creating the directory', directory, _gfile().makedirs, directory
    )
  else:
    os.makedirs(directory, exist_ok=True)


def rename(source: str, destination: str) -> None:
  """Renames a file, replacing the destination (atomic on local disks)."""
  if is_remote(source):
    gfile = _gfile()
    remote.call(
      'renaming the file',
      source,
      lambda: gfile.rename(source, destination, overwrite=True),
    )
  else:
    os.replace(source, destination)
