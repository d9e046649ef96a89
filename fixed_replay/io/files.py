"""File access for local paths and anything `tf.io.gfile` reads (gs://...).

Local paths use the standard library so that reading a checkpoint never pays
for importing TensorFlow; paths with a URL scheme go through `tf.io.gfile`.
"""

import os
import re

_URL_SCHEME = re.compile(r'^[a-zA-Z][a-zA-Z0-9+.-]*://')


def is_remote(path):
  """Returns True for paths with a URL scheme such as gs:// or s3://."""
  return bool(_URL_SCHEME.match(str(path)))


def _gfile():
  import tensorflow as tf

  return tf.io.gfile


def join(directory, name):
  """Joins a directory and a file name, for local and remote paths alike."""
  directory = str(directory)
  if is_remote(directory):
    return directory.rstrip('/') + '/' + name
  return os.path.join(directory, name)


def isdir(path):
  return _gfile().isdir(path) if is_remote(path) else os.path.isdir(path)


def exists(path):
  return _gfile().exists(path) if is_remote(path) else os.path.exists(path)


def listdir(directory):
  """Returns the entry names of a directory (no trailing slashes)."""
  if is_remote(directory):
    return [name.rstrip('/') for name in _gfile().listdir(directory)]
  return os.listdir(directory)


def size(path):
  """Returns a file's size in bytes."""
  if is_remote(path):
    return _gfile().stat(path).length
  return os.path.getsize(path)


def open_read(path):
  """Opens a file for binary reading."""
  if is_remote(path):
    return _gfile().GFile(path, 'rb')
  return open(path, 'rb')


def open_write(path):
  """Opens a file for binary writing."""
  if is_remote(path):
    return _gfile().GFile(path, 'wb')
  return open(path, 'wb')


def makedirs(directory):
  if is_remote(directory):
    _gfile().makedirs(directory)
  else:
    os.makedirs(directory, exist_ok=True)


def rename(source, destination):
  """Renames a file, replacing the destination (atomic on local disks)."""
  if is_remote(source):
    _gfile().rename(source, destination, overwrite=True)
  else:
    os.replace(source, destination)
