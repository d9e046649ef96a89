"""Where a run's agent checkpoints are, and restoring another run's.

A Dopamine Runner keeps its agent checkpoints (`ckpt.N` with
`sentinel_checkpoint_complete.N`) in `base_dir/checkpoints/`; users name
either folder. `latest_agent_checkpoint` is the one place that looks, for
`--init_checkpoint_dir` and for generating data with a trained agent
(dataset/policies.py), so both accept the same folders in the same order and
fail with the same error. Where a dataset's replay files are is
dataset/layout.py's answer.
"""

from dopamine.discrete_domains import checkpointer

from fixed_replay.errors import CheckpointError
from fixed_replay.io import files as storage

CHECKPOINTS = 'checkpoints'


def latest_agent_checkpoint(directory: str) -> tuple[str, int]:
  """(checkpoint folder, latest complete number) of a Runner's checkpoints.

  Args:
    directory: str, the Runner's base_dir or its checkpoints/ folder; the
      checkpoints/ folder below it is looked at first.

  Raises:
    CheckpointError: if neither holds a complete agent checkpoint.
  """
  directory = str(directory)
  for candidate in (storage.join(directory, CHECKPOINTS), directory):
    if not storage.isdir(candidate):
      continue
    number = checkpointer.get_latest_checkpoint_number(candidate)
    if number >= 0:
      return candidate, number
  raise CheckpointError(
    directory,
    'no complete Dopamine agent checkpoint (ckpt.N with its '
    f'sentinel_checkpoint_complete.N) in it or in its {CHECKPOINTS}/ folder; '
    "name a Runner's base_dir or its checkpoints/ folder",
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
    CheckpointError: if there is no checkpoint.
    ValueError: if the agent cannot restore it.
  """
  directory, number = latest_agent_checkpoint(init_dir)
  data = checkpointer.Checkpointer(
    directory, checkpoint_file_prefix
  ).load_checkpoint(number)
  if not agent.unbundle(directory, number, data):
    raise ValueError(
      f'init_checkpoint_dir={init_dir}: {type(agent).__name__} '
      f'could not restore checkpoint {number} of {directory}'
    )
  return directory, number, data
