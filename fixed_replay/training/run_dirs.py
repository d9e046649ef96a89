"""The directories a run reads: its replay data and the run it continues.

A DQN Replay Dataset run keeps its replay checkpoints in `replay_logs/`; a
Dopamine run keeps its agent checkpoints in `checkpoints/`. Both may be
named by the folder above.
"""

import os

from dopamine.discrete_domains import checkpointer
import tensorflow as tf

from fixed_replay.io import files as storage


def latest_checkpoint(init_dir):
  """(checkpoint folder, latest complete checkpoint number) of a run.

  Raises:
    ValueError: if neither init_dir nor init_dir/checkpoints holds one.
  """
  for directory in (os.path.join(init_dir, 'checkpoints'), init_dir):
    if not tf.io.gfile.isdir(directory):
      continue
    number = checkpointer.get_latest_checkpoint_number(directory)
    if number >= 0:
      return directory, number
  raise ValueError(
    f'init_checkpoint_dir={init_dir}: no Dopamine checkpoint (ckpt.N with '
    'its sentinel file) there or in its checkpoints/ folder'
  )


def restore_init_checkpoint(agent, init_dir, checkpoint_file_prefix):
  """Restores `agent` from the latest checkpoint of another run.

  Args:
    agent: the agent, restored through its `unbundle`.
    init_dir: str, the other run's base_dir or its checkpoints/ folder.
    checkpoint_file_prefix: str, as the runner's.

  Returns:
    (checkpoint folder, checkpoint number, the checkpoint's data dict).

  Raises:
    ValueError: if there is no checkpoint or the agent cannot restore it.
  """
  directory, number = latest_checkpoint(init_dir)
  data = checkpointer.Checkpointer(
    directory, checkpoint_file_prefix
  ).load_checkpoint(number)
  if not agent.unbundle(directory, number, data):
    raise ValueError(
      f'init_checkpoint_dir={init_dir}: {type(agent).__name__} '
      f'could not restore checkpoint {number} of {directory}'
    )
  return directory, number, data


def resolve_replay_dir(replay_dir):
  """Returns the directory holding the replay checkpoints.

  Args:
    replay_dir: str, a run directory (with a `replay_logs/` folder, as in the
      DQN Replay Dataset) or the checkpoint folder itself.

  Returns:
    str, `replay_dir/replay_logs` if that exists, else replay_dir.

  Raises:
    ValueError: if replay_dir is not a directory.
  """
  replay_dir = str(replay_dir)
  nested = storage.join(replay_dir, 'replay_logs')
  if storage.isdir(nested):
    return nested
  if not storage.isdir(replay_dir):
    raise ValueError(
      f'replay_dir={replay_dir}: no such directory (expected a run '
      'directory with replay_logs/ or a folder of replay checkpoints)'
    )
  return replay_dir
