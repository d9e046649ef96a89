r"""`fixed-replay report DIR...`: tables and learning curves of sweeps.

Reads every trial under each DIR (BASE/<game>/<run>/<agent>/seed_<s>/, as
`fixed-replay sweep` writes them) and prints, per game and agent, the final
and best average evaluation return (mean ± standard deviation over runs and
seeds), the final return normalized as in the REM paper
(100 (agent - random) / (online DQN - random)) and to human play, and per
agent the median over games. Games without published reference scores
(e.g. CartPole) keep their raw returns and say why the normalized columns
are empty.

  fixed-replay report /tmp/sweep --output=/tmp/sweep/report

--output=PREFIX also writes PREFIX.md, PREFIX.csv and one PNG of learning
curves per game, PREFIX_<game>.png (mean over trials, ± 1 std shaded).
--data=DATASET adds the data's own game score per checkpoint, where the
data records the game's reward:

  fixed-replay report /tmp/sweep --data=/data/pong1_compact
"""

from absl import app
from absl import flags

_OUTPUT = flags.DEFINE_string(
  'output',
  None,
  'Prefix of the files to write (PREFIX.md, PREFIX.csv, PREFIX_<game>.png); '
  'without it the table is only printed.',
)
_OVERWRITE = flags.DEFINE_boolean(
  'overwrite', False, 'Replace output files that already exist.'
)
_DATA = flags.DEFINE_multi_string(
  'data',
  [],
  "A dataset (compact store or Dopamine's files) whose own game score per "
  'checkpoint the report states: the mean game-score return of the '
  "complete episodes in each checkpoint, where the data records the game's "
  'reward (unclipped_reward, kept by conversions of RL Unplugged data). '
  'Repeatable; without DIR only this table is printed.',
)


def main(argv: list[str]) -> int:
  """Prints the report of the sweeps named by the positional arguments."""
  if len(argv) < 2 and not _DATA.value:
    raise app.UsageError(
      'expected one or more sweep directories\n'
      'usage: fixed-replay report DIR... [--output=PREFIX] [--data=DATASET]'
    )
  from fixed_replay.errors import CheckpointError
  from fixed_replay.training import report

  try:
    markdown, written = report.write_report(
      argv[1:],
      output=_OUTPUT.value,
      overwrite=_OVERWRITE.value,
      data_dirs=_DATA.value,
    )
  except (ValueError, FileExistsError, CheckpointError) as error:
    raise app.UsageError(str(error)) from error
  print(markdown, end='')
  for path in written:
    print(f'Wrote {path}')
  return 0
