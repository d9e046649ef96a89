"""A run's zstd dictionary: trained and stored once, shared by its checkpoints.

A store holds one dictionary for its run (`observation.dict` beside the
checkpoints), trained on frames from the first rows of every checkpoint a
conversion begins with, and every checkpoint of the run compresses its
units against it. A mixture of 40 runs then holds 40 dictionaries, not
2,000: a dictionary a checkpoint would be 2 GB over 40 full runs, beyond the
CPU's caches and TLB. Each checkpoint's manifest
records the size and CRC-32 of the dictionary it was compressed against, so
a damaged dictionary, or another conversion's, is refused by name.
"""

import os
import weakref

import numpy as np
import zstandard

from fixed_replay.errors import CheckpointError
from fixed_replay.io import mapped
from fixed_replay.store import manifest as manifest_lib
from fixed_replay.store import unit_decoding

# Its size: a larger dictionary makes every unit of the run smaller and is
# paid for once a run; past about 2 MB busy games' units barely shrink. zstd
# returns a smaller one where the frames hold less to learn (a few hundred
# KB on Breakout).
RUN_DICTIONARY_BYTES = 2 << 20
RUN_TRAINING_FRAMES = 12_000
# zstd's k and d for the dictionary: what its own parameter search chose on
# MsPacman and Seaquest. Fixed, training takes ~0.15 s a checkpoint instead
# of ~8 s, for the same size.
_TRAINING_K, _TRAINING_D = 1826, 8


def train(frames):
  """A zstd dictionary of RUN_DICTIONARY_BYTES trained on some of a run's
  frames (at most RUN_TRAINING_FRAMES, spread over them).

  Args:
    frames: sequence of frames (an array (n, *row_shape), or a list).

  Returns:
    bytes, empty when the frames are too few (or too alike) to train on:
    units are then compressed without a dictionary.
  """
  step = max(1, len(frames) // RUN_TRAINING_FRAMES)
  samples = [np.ascontiguousarray(f).tobytes() for f in frames[::step]]
  # zstd's trainer takes a segment from each stretch of the samples in turn:
  # in checkpoint order, stretches of one checkpoint's alike frames gave
  # Pong's drifting run a 240 KB dictionary and units 34-39% larger than
  # each checkpoint's own; shuffled (seeded: the same bytes), a full one.
  samples = [
    samples[i] for i in np.random.default_rng(0).permutation(len(samples))
  ]
  if len(samples) < 8:
    return b''
  # zstd refuses (or shrinks) a dictionary much larger than its samples.
  dictionary_bytes = min(RUN_DICTIONARY_BYTES, sum(map(len, samples)) // 16)
  try:
    trained = zstandard.train_dictionary(
      dictionary_bytes, samples, k=_TRAINING_K, d=_TRAINING_D, threads=1
    )
  except zstandard.ZstdError:
    return b''  # zstd refuses samples that are too few or too small.
  return trained.as_bytes()


# Run dictionaries mapped in this process, while a checkpoint uses them:
# {(path, inode, bytes, mtime): Dictionary}.
_RUN_DICTIONARIES = weakref.WeakValueDictionary()


def store_path(store_dir: str) -> str:
  """Where a store's (a run's) dictionary is."""
  return os.path.join(store_dir, manifest_lib.RUN_DICTIONARY_FILE)


def checkpoint_path(checkpoint_dir: str) -> str:
  """Where the dictionary of a checkpoint's run is: beside the checkpoint."""
  return store_path(os.path.dirname(os.path.abspath(checkpoint_dir)))


class _RunDictionary(unit_decoding.Dictionary):
  """A run's dictionary as mapped, with its size and CRC-32 (`entry`)."""

  def __init__(self, data: np.ndarray):
    super().__init__(data)
    self.entry = {'bytes': len(data), 'crc32': manifest_lib.crc32(data)}


def load(checkpoint_dir: str, expected: dict):
  """The run's dictionary a checkpoint decodes against.

  Mapped read-only once a process, where it lies: page cache that every
  process opening the run shares, checked (size and CRC-32) when first
  mapped, and against what each checkpoint was compressed with.

  Args:
    checkpoint_dir: str, the checkpoint.
    expected: dict, its manifest's `bytes` and `crc32` of the dictionary.

  Returns:
    unit_decoding.Dictionary, with `entry` (its bytes and CRC-32).

  Raises:
    CheckpointError: if the run's dictionary is missing, or is not the one
      the checkpoint was compressed against (damaged, or another's);
      naming the file and the checkpoint.
  """
  path = checkpoint_path(checkpoint_dir)
  try:
    status = os.stat(path)
  except FileNotFoundError as error:
    raise CheckpointError(
      path, f"missing: {checkpoint_dir} decodes against its run's dictionary"
    ) from error
  key = (path, status.st_ino, status.st_size, status.st_mtime_ns)
  found = _RUN_DICTIONARIES.get(key)
  if found is None:
    found = _RUN_DICTIONARIES[key] = _RunDictionary(mapped.map_file(path))
  if found.entry != expected:
    raise CheckpointError(
      path,
      f'{found.entry["bytes"]} bytes with CRC-32 {found.entry["crc32"]:#010x}'
      f', but {checkpoint_dir} was compressed against {expected["bytes"]} '
      f'bytes with {expected["crc32"]:#010x}: damaged, or the dictionary '
      'of another conversion',
    )
  return found
