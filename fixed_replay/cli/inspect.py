"""`fixed-replay inspect DIR`: summarises and verifies replay checkpoints.

Prints one line per checkpoint suffix (completeness, rows, add_count, cursor,
valid transitions, complete episodes and their returns, observation shape,
sizes) and the totals, then every problem found, each naming its file. Exits
with status 1 when a checkpoint is damaged or incomplete, or when the
directory holds no complete checkpoint.

  fixed-replay inspect /data/Pong/1/replay_logs
  fixed-replay inspect gs://atari-replay-datasets/dqn/Pong/1/replay_logs \
      --verify
"""

import json
import sys

from absl import app
from absl import flags

from fixed_replay import cli
from fixed_replay.dataset import inspection

_VERIFY = flags.DEFINE_boolean(
  'verify',
  False,
  'Decompress every file to the end (gzip CRC, .npy header, payload length) '
  'on top of the header and consistency checks. Reads all the data: about a '
  'minute per 7 GB observation file.',
)
_STACK_SIZE = flags.DEFINE_integer(
  'stack_size',
  4,
  'Frames per state, for the count of valid transitions.',
  lower_bound=1,
)
_UPDATE_HORIZON = flags.DEFINE_integer(
  'update_horizon',
  1,
  'n of the n-step return, for the count of valid transitions.',
  lower_bound=1,
)
_JSON = flags.DEFINE_boolean(
  'json', False, 'Print machine-readable JSON instead of a table.'
)

_REMOTE_TIMEOUT = cli.define_remote_timeout_flag(__name__)

_USAGE = (
  'usage: fixed-replay inspect DIR [--verify] [--stack_size=4] '
  '[--update_horizon=1] [--json]'
)


def main(argv):
  """Inspects the directory named by the one positional argument."""
  if len(argv) != 2:
    raise app.UsageError(
      f'expected one replay directory, got {len(argv) - 1} arguments\n{_USAGE}'
    )
  cli.apply_remote_timeout(_REMOTE_TIMEOUT)
  summary = inspection.summarize_directory(
    argv[1],
    stack_size=_STACK_SIZE.value,
    update_horizon=_UPDATE_HORIZON.value,
    verify=_VERIFY.value,
  )
  if _JSON.value:
    print(json.dumps(summary.to_dict(), indent=2))
  else:
    print(inspection.format_table(summary))
  sys.stdout.flush()
  if summary.ok:
    return 0
  print(inspection.format_problems(summary), file=sys.stderr)
  return 1


if __name__ == '__main__':
  app.run(main)
