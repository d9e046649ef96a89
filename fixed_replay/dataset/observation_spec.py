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

from fixed_replay.dataset import checkpoints
from fixed_replay.dataset import layout
from fixed_replay.errors import CheckpointError
from fixed_replay.io import npy_stream
from fixed_replay.store import manifest as manifest_lib

ATARI_FRAME = ((84, 84), np.dtype(np.uint8))
ATARI_STACK_SIZE = 4
# The arguments the data decides, in the order errors name them.
NAMES = ('observation_shape', 'observation_dtype', 'stack_size')


def default_stack_size(shape: tuple, dtype: np.dtype) -> int:
  """Dopamine's stack for observations of `shape` and `dtype`: 4 or 1."""
  frame = (tuple(shape), np.dtype(dtype))
  return ATARI_STACK_SIZE if frame == ATARI_FRAME else 1


def read(checkpoint: 'checkpoints.CheckpointFiles | str') -> tuple[str, dict]:
  """What one checkpoint's data says of the arguments in NAMES.

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
  if isinstance(checkpoint, checkpoints.CheckpointFiles):
    path = checkpoint.store_paths['observation']
    header = npy_stream.read_npy_header(path)
    return path, {
      'observation_shape': tuple(header.row_shape),
      'observation_dtype': np.dtype(header.dtype),
    }
  manifest = manifest_lib.read_manifest(checkpoint)
  spec, valid_rows = manifest['observation'], manifest['valid_rows']
  return os.path.join(checkpoint, manifest_lib.MANIFEST), {
    'observation_shape': tuple(spec['row_shape']),
    'observation_dtype': np.dtype(spec['dtype']),
    'stack_size': valid_rows['stack_size'],
    'update_horizon': valid_rows['update_horizon'],
  }


def resolve(checkpoint: 'checkpoints.CheckpointFiles | str', asked: dict):
  """`asked` with the data's values for the arguments left None.

  Args:
    checkpoint: as for `read`: the checkpoint whose data decides.
    asked: dict of the arguments of NAMES and `update_horizon` the user
      gave; one that is absent or None is left to the data.

  Returns:
    dict: the four arguments, each the user's or the data's.

  Raises:
    CheckpointError: naming the file, what it holds and what was asked,
      for every given argument of NAMES that disagrees with the data (a
      store's stack_size may differ: its table of valid rows is redone).
  """
  path, held = read(checkpoint)
  given = {
    'observation_shape': _shape(asked.get('observation_shape')),
    'observation_dtype': _dtype(asked.get('observation_dtype')),
  }
  wrong = [
    name
    for name, value in given.items()
    if value is not None and value != held[name]
  ]
  if wrong:
    holds = ', '.join(f'{n}={_shown(held[n])}' for n in wrong)
    was = ', '.join(f'{n}={_shown(given[n])}' for n in wrong)
    raise CheckpointError(
      path,
      f'the data holds {holds}, but {was} was asked for: leave '
      f'{" and ".join(wrong)} unset to take the data\'s',
    )
  resolved = {name: held[name] for name in given}
  stack_size = asked.get('stack_size') or held.get('stack_size')
  if stack_size is None:
    stack_size = default_stack_size(*resolved.values())
    logging.info(
      'stack_size=%d: the default for observations of shape %s and dtype %s '
      '(4 for Atari frames, else 1); pass stack_size to change it',
      stack_size,
      resolved['observation_shape'],
      resolved['observation_dtype'],
    )
  horizon = asked.get('update_horizon') or held.get('update_horizon') or 1
  return dict(resolved, stack_size=stack_size, update_horizon=horizon)


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


def _shape(value):
  return None if value is None else tuple(value)


def _dtype(value):
  return None if value is None else np.dtype(value)


def _shown(value):
  return str(value) if isinstance(value, np.dtype) else repr(value)
