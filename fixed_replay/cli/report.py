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


def main(argv):
  """Prints the report of the sweeps named by the positional arguments."""
  if len(argv) < 2:
    raise app.UsageError(
      'expected one or more sweep directories\n'
      'usage: fixed-replay report DIR... [--output=PREFIX]'
    )
  from fixed_replay.training import report

  try:
    markdown, written = report.write_report(
      argv[1:], output=_OUTPUT.value, overwrite=_OVERWRITE.value
    )
  except (ValueError, FileExistsError) as error:
    raise app.UsageError(str(error)) from error
  print(markdown, end='')
  for path in written:
    print(f'Wrote {path}')
  return 0


if __name__ == '__main__':
  app.run(main)
