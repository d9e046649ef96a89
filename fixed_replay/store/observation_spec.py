"""The arguments the data already knows: observation shape, dtype and stack.

A CartPole directory used to need `observation_shape=(4,)`,
`observation_dtype=np.float64` and `stack_size=1`, each found through its
own error, one at a time; forgetting the stack silently stacked four
CartPole states into one. The data says all of it. Dopamine's files carry
the observation array's `.npy` header (a few hundred inflated bytes), and a
store's manifest records its frames' shape and dtype and the stack and
n-step its table of valid rows was made for.

This module is the one place those arguments are read from the data,
defaulted and checked against what a user asked. The buffers (and so
`ReplayDataset`, `FixedReplayDataset` and `jax_batches`), `convert` and
`inspect` all call it. An argument left unset (None) takes the data's value;
one that disagrees with the data is refused with a single error naming the
file, what it holds and what was asked.

Dopamine's files do not record a stack size. Dopamine stacks 4 frames of an
Atari game (84x84 uint8) and 1 observation of anything else (its gym configs
bind `stack_size=1`), so that is the default, and it is logged.
"""

import os

from absl import logging
import numpy as np

from fixed_replay.errors import CheckpointError
from fixed_replay.io import npy_stream
from fixed_replay.sources import layout
from fixed_replay.sources.dopamine import checkpoints
from fixed_replay.sources.dopamine import environments
from fixed_replay.sources.dopamine import file_names
from fixed_replay.store import manifest as manifest_lib

# Dopamine's Atari frames and stack (84x84 uint8, 4), as `generate` writes.
ATARI = environments.ENVIRONMENT_SPECS['atari']
# The user's arguments that, given, replace the data's (when they agree).
_ASKED = ('stack_size', 'update_horizon')


def default_stack_size(shape: tuple, dtype: np.dtype) -> int:
  """Dopamine's stack for observations of `shape` and `dtype`: 4 or 1."""
  atari = (
    tuple(shape) == ATARI.observation_shape
    and np.dtype(dtype) == ATARI.observation_dtype
  )
  return ATARI.stack_size if atari else 1


def read(checkpoint: 'file_names.CheckpointFiles | str') -> tuple[str, dict]:
  """What one checkpoint's data says of the buffer's arguments.

  Args:
    checkpoint: the CheckpointFiles of Dopamine's files, or a store
      checkpoint's directory.

  Returns:
    (path, {name: value}): the file read, and the observation shape and
    dtype, with a store's `stack_size` and `update_horizon` (Dopamine's
    files record neither).

  Raises:
    CheckpointError: if the header or manifest cannot be read.
  """
  if isinstance(checkpoint, file_names.CheckpointFiles):
    path = checkpoint.store_paths['observation']
    header = npy_stream.read_npy_header(path)
    return path, {
      'observation_shape': tuple(header.row_shape),
      'observation_dtype': np.dtype(header.dtype),
    }
  # Any version: a store to upgrade is described too (a buffer refuses an
  # old one as it opens its checkpoints).
  manifest = manifest_lib.read_manifest(checkpoint, manifest_lib.ALL_VERSIONS)
  spec, valid_rows = manifest['observation'], manifest['valid_rows']
  return os.path.join(checkpoint, manifest_lib.MANIFEST), {
    'observation_shape': tuple(spec['row_shape']),
    'observation_dtype': np.dtype(spec['dtype']),
    'stack_size': valid_rows['stack_size'],
    'update_horizon': valid_rows['update_horizon'],
  }


def resolve(
  checkpoint: 'file_names.CheckpointFiles | str', asked: dict
) -> dict:
  """`asked` with the data's values for the arguments left None.

  Args:
    checkpoint: as for `read`: the checkpoint whose data decides.
    asked: dict of the observation_shape, observation_dtype, stack_size
      and update_horizon the user gave; one absent or None is the data's.

  Returns:
    dict: the four arguments, each the user's or the data's.

  Raises:
    CheckpointError: naming the file, what it holds and what was asked,
      for every observation shape or dtype given that the data does not
      hold (a store's stack_size may differ: its valid rows are redone).
  """
  path, held = read(checkpoint)
  shape_and_dtype = held['observation_shape'], held['observation_dtype']
  given = {
    name: convert(asked[name])
    for name, convert in (
      ('observation_shape', tuple),
      ('observation_dtype', np.dtype),
    )
    if asked.get(name) is not None
  }
  wrong = [name for name, value in given.items() if value != held[name]]
  if wrong:
    holds = ', '.join(f'{n}={held[n]!s}' for n in wrong)
    was = ', '.join(f'{n}={given[n]!s}' for n in wrong)
    raise CheckpointError(
      path,
      f'the data holds {holds}, but {was} was asked for: leave '
      f'{" and ".join(wrong)} unset to take the data\'s',
    )
  resolved = dict(held, **{k: asked[k] for k in _ASKED if asked.get(k)})
  if resolved.get('stack_size') is None:
    resolved['stack_size'] = default_stack_size(*shape_and_dtype)
    logging.info(
      'stack_size=%d: the default for observations of shape %s and dtype %s '
      '(4 for Atari frames, else 1); pass stack_size to change it',
      resolved['stack_size'],
      *shape_and_dtype,
    )
  resolved.setdefault('update_horizon', 1)
  return resolved


def resolve_directory(data_dir: str, asked: dict) -> dict:
  """`resolve` by the first checkpoint of Dopamine's files or a store.

  Raises:
    CheckpointError: as `resolve`, or layout.detect's error when `data_dir`
      holds neither.
  """
  found = layout.detect(str(data_dir)).require_trainable()
  if found.kind is layout.Kind.STORE:
    checkpoints_found = manifest_lib.find_stored_checkpoints(found.data_dir)
  else:
    checkpoints_found = checkpoints.find_checkpoints(found.data_dir)
  return resolve(checkpoints_found[min(checkpoints_found)], asked)
