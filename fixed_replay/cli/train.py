r"""`fixed-replay train`: trains an offline agent on a replay dataset.

Every iteration trains from the fixed dataset (no environment step), then
evaluates the agent in the real game; checkpoints, logs/ and TensorBoard
events go to --base_dir. Same flags as batch_rl's
`batch_rl.fixed_replay.train`, also reachable as `python -m fixed_replay.train`:

  fixed-replay train --base_dir=/tmp/dqn_pong \
      --replay_dir=/data/Pong/1 --agent_name=dqn \
      --gin_files=configs/dqn.gin \
      --gin_bindings='FixedReplayRunner.num_iterations=200'

--replay_dir may be a run directory (its replay_logs/ is used), the folder
of checkpoints itself (local or gs://), or a compact store (`fixed-replay
convert`). Rerunning with the same --base_dir resumes from the
last completed iteration. --agent_name also takes your own agent class as
`package.module:Class` (see the README, "Your own agent").
"""

from absl import flags

from fixed_replay import cli
from fixed_replay.agents import AGENTS

_BASE_DIR = flags.DEFINE_string(
  'base_dir',
  None,
  'Directory for checkpoints/, logs/ and TensorBoard events; an existing run '
  'there is resumed.',
)
_REPLAY_DIR = flags.DEFINE_string(
  'replay_dir',
  None,
  "The dataset: Dopamine's replay checkpoint files (a run directory with "
  'replay_logs/, or the folder of checkpoints itself; local or gs://), or a '
  'compact store written by `fixed-replay convert`.',
)
_AGENT_NAME = flags.DEFINE_string(
  'agent_name',
  'dqn',
  f'Name of the agent: one of {", ".join(AGENTS)}; or your own agent '
  "class as 'package.module:Class'.",
)
_GIN_FILES = flags.DEFINE_multi_string(
  'gin_files', [], 'Gin configuration files (e.g. configs/dqn.gin).'
)
_GIN_BINDINGS = flags.DEFINE_multi_string(
  'gin_bindings',
  [],
  'Gin bindings applied after the files (e.g. '
  '"FixedReplayRunner.num_iterations=10").',
)
_INIT_CHECKPOINT_DIR = flags.DEFINE_string(
  'init_checkpoint_dir',
  None,
  "Another run's base_dir (or its checkpoints/): when --base_dir has no "
  'checkpoint yet, training continues from its latest one (weights, training '
  'steps, logged history), from the next iteration, as in batch_rl.',
)

_REMOTE_TIMEOUT = cli.define_remote_timeout_flag(__name__)


def _refuse_early_mistakes():
  """Raises what create_runner would raise first, before TensorFlow loads.

  The wrong data, an unknown agent or a missing gin file then cost a user a
  fraction of a second, not the seconds TensorFlow and JAX take to import.
  The checks are create_runner's own, in its order; a remote replay_dir is
  left to it (one listing of a bucket, after the imports).

  Returns:
    the local dataset's trainable layout.Layout (for create_runner), or the
    remote replay_dir.
  """
  from fixed_replay import agents
  from fixed_replay import gin_files
  from fixed_replay.io import files
  from fixed_replay.sources import layout

  if files.is_remote(_REPLAY_DIR.value):
    return _REPLAY_DIR.value
  dataset = layout.detect(_REPLAY_DIR.value).require_trainable()
  if _AGENT_NAME.value not in agents.AGENTS:  # Ours load in create_runner.
    agents.agent_class(_AGENT_NAME.value)
  for gin_file in _GIN_FILES.value:
    gin_files.locate(gin_file)
  return dataset


def main(argv: list[str]) -> int:
  """Creates the runner from the flags and runs the experiment."""
  cli.take_flags_only(argv)
  cli.require_flags(_BASE_DIR, _REPLAY_DIR)
  cli.apply_remote_timeout(_REMOTE_TIMEOUT)
  dataset = _refuse_early_mistakes()
  # Imported here so that --help does not wait for TensorFlow and JAX.
  from fixed_replay.training import run_experiment

  # A CheckpointError (damaged or untrainable data) or UsageError is
  # printed as one line by fixed_replay.cli.
  runner = run_experiment.create_runner(
    _BASE_DIR.value,
    agent_name=_AGENT_NAME.value,
    replay_dir=dataset,
    gin_files=_GIN_FILES.value,
    gin_bindings=_GIN_BINDINGS.value,
    init_checkpoint_dir=_INIT_CHECKPOINT_DIR.value,
  )
  runner.run_experiment()
  return 0
