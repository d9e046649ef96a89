r"""`fixed-replay sweep`: many training runs (games x runs x agents x seeds).

Each trial is a `fixed-replay train` run with its own seed, in
BASE_DIR/<game>/<run>/<agent>/seed_<seed>/, executed as a Ray task with the
resources you declare, in a fresh process per attempt. `{game}`, `{run}` and
`{agent}` in --replay_dir, --gin_files and --gin_bindings are filled per
trial; the game also goes to Dopamine's Atari environment.

  fixed-replay sweep --base_dir=/tmp/sweep --replay_dir='/data/{game}/{run}' \
      --games=Pong,Breakout --runs=1,2 --agents=dqn,rem --seeds=0,1,2 \
      --gin_files='configs/{agent}.gin'

Without --games, the sweep trains on the one dataset --replay_dir names
(its agents x seeds), evaluating in the data's own game:

  fixed-replay sweep --base_dir=/tmp/sweep --replay_dir=/data/cartpole \
      --agents=dqn --seeds=0,1 --gin_files='configs/cartpole/{agent}.gin'

Without --ray_address Ray runs on this machine only (127.0.0.1, started and
stopped by the command); --ray_address=auto or HOST:PORT uses a running
cluster (`ray start --head` on the head node). Rerun the same command after
an interruption or failure: finished trials are skipped (if all are, it
returns at once), interrupted ones resume from their last checkpoint, failed
ones are tried again. Then `fixed-replay report BASE_DIR`.
"""

import sys

from absl import app
from absl import flags

from fixed_replay import cli
from fixed_replay.agents import AGENTS

_BASE_DIR = flags.DEFINE_string(
  'base_dir', None, 'Directory of the sweep (one subdirectory per trial).'
)
_REPLAY_DIR = flags.DEFINE_string(
  'replay_dir',
  None,
  "Dataset of each trial, as train's --replay_dir takes it (Dopamine's "
  'files, local or gs://, or a compact store); may hold {game}, {run} and '
  '{agent}, e.g. /data/{game}/{run}.',
)
_GAMES = flags.DEFINE_list(
  'games',
  None,
  'Games, e.g. Pong,Breakout (names the trial directories and, for Atari, '
  'the game played in evaluation). Without it, the sweep trains on the one '
  'dataset --replay_dir names, evaluating in its own game.',
)
_RUNS = flags.DEFINE_list('runs', ['1'], 'Dataset runs, e.g. 1,2,3,4,5.')
_AGENTS = flags.DEFINE_list(
  'agents',
  ['dqn'],
  f'Agents, e.g. dqn,rem; any of {", ".join(AGENTS)}.',
)
_SEEDS = flags.DEFINE_list('seeds', ['0'], 'Seeds, e.g. 0,1,2.')
_GIN_FILES = flags.DEFINE_multi_string(
  'gin_files',
  [],
  'Gin files, may hold {game}, {run} and {agent}, e.g. configs/{agent}.gin.',
)
_GIN_BINDINGS = flags.DEFINE_multi_string(
  'gin_bindings', [], 'Gin bindings applied after the files, to every trial.'
)
_RAY_ADDRESS = flags.DEFINE_string(
  'ray_address',
  None,
  'Ray cluster to use: auto, HOST:PORT or ray://HOST:PORT (with token '
  'authentication, as `ray start` sets up, also set RAY_AUTH_MODE=token). '
  'Default: a private local Ray on 127.0.0.1.',
)
_CPUS_PER_TRIAL = flags.DEFINE_float(
  'cpus_per_trial', 1.0, 'CPUs Ray reserves per trial.', lower_bound=0.0
)
_GPUS_PER_TRIAL = flags.DEFINE_float(
  'gpus_per_trial',
  0.0,
  'GPUs Ray reserves per trial; a fraction (e.g. 0.5) shares a GPU.',
  lower_bound=0.0,
)
_MAX_ATTEMPTS = flags.DEFINE_integer(
  'max_attempts', 3, 'Attempts per trial before it fails.', lower_bound=1
)
_ALLOW_CHANGED_CONFIG = flags.DEFINE_boolean(
  'allow_changed_config',
  False,
  'Resume trials whose gin files, bindings or dataset changed since they '
  'started (by default such a sweep is refused).',
)


def _seeds():
  try:
    return [int(seed) for seed in _SEEDS.value]
  except ValueError as error:
    raise app.UsageError(f'--seeds: integers expected ({error})') from error


def main(argv: list[str]) -> int:
  """Plans the sweep from the flags, runs what is left, prints a summary."""
  cli.take_flags_only(argv)
  cli.require_flags(_BASE_DIR, _REPLAY_DIR)
  # Neither Ray nor TensorFlow is imported here: trials import them in
  # their own processes, and Ray only starts when a trial is left to run.
  from fixed_replay.training import sweep

  try:
    trials = sweep.plan(
      _BASE_DIR.value,
      _REPLAY_DIR.value,
      agents=_AGENTS.value,
      seeds=_seeds(),
      games=_GAMES.value,
      runs=_RUNS.value,
      gin_files=_GIN_FILES.value,
      gin_bindings=_GIN_BINDINGS.value,
    )
  except ValueError as error:
    raise app.UsageError(str(error)) from error
  try:
    result = sweep.run_sweep(
      trials,
      ray_address=_RAY_ADDRESS.value,
      cpus_per_trial=_CPUS_PER_TRIAL.value,
      gpus_per_trial=_GPUS_PER_TRIAL.value,
      max_attempts=_MAX_ATTEMPTS.value,
      allow_changed_config=_ALLOW_CHANGED_CONFIG.value,
    )
  except ValueError as error:
    # A refusal (a changed configuration, resources no node has), not a
    # misspelt flag: the reason alone, without the flags' help.
    print(f'fixed-replay sweep: {error}', file=sys.stderr)
    return 2
  print(sweep.format_summary(result))
  if not result.failed:
    print(f'Report: fixed-replay report {_BASE_DIR.value}')
  return 1 if result.failed else 0
