"""`fixed-replay inspect DIR`: summarises and verifies replay data.

DIR is one of:

  a Dopamine replay directory (`*_ckpt.N.gz`, local or gs://): one line per
    checkpoint suffix (completeness, rows, add_count, cursor, valid
    transitions, complete episodes and their returns, and their game-score
    returns where an `unclipped_reward` element records the game's reward,
    observation shape, sizes); --verify decompresses everything;
  a compact store (`fixed-replay convert` output): the same table from the
    manifests and small arrays; --verify checks every file's CRC-32 and
    decodes every frame block;
  RL Unplugged shards (`run_<r>-NNNNN-of-MMMMM`, --run picks a run) or a
    TFDS-prepared rlu_atari_checkpoints_ordered: one line per checkpoint
    (episodes, steps, terminal episodes, return range, game-score range
    from `unclipped_rewards`, shards), reading every record; --verify also
    decodes every frame;
  a root of many games' runs (ROOT/<Game>/<run>, as fixed_replay.ReplayMixture
    reads): one line per run (its kind and checkpoints), then the runs one
    game has and another lacks, and the runs whose checkpoint count differs
    from their game's others; --verify checks every run as above.

Then every problem found, each naming its file. Exits with status 1 when
anything is damaged or incomplete, or nothing usable was found.

  fixed-replay inspect /data/Pong/1/replay_logs
  fixed-replay inspect gs://atari-replay-datasets/dqn/Pong/1/replay_logs \
      --verify
  fixed-replay inspect /data/rlu/Pong --run=1
  fixed-replay inspect /data/pong1_compact --verify
  fixed-replay inspect /data/games
"""

import json
import sys

from absl import app
from absl import flags

from fixed_replay import cli
from fixed_replay.cli import tables
from fixed_replay.convert import rlu_convert
from fixed_replay.convert import rlu_source
from fixed_replay.errors import CheckpointError
from fixed_replay.sources import layout
from fixed_replay.sources.rlu import rlu_inspection
from fixed_replay.store import store_inspection

_VERIFY = flags.DEFINE_boolean(
  'verify',
  False,
  'Decompress every file to the end (gzip CRC, .npy header, payload length) '
  'on top of the header and consistency checks. Reads all the data: about a '
  "minute per 7 GB observation file. For a compact store: every file's "
  'CRC-32 and every frame block; for RL Unplugged: every frame decoded.',
)
_RUN = flags.DEFINE_integer(
  'run',
  None,
  'RL Unplugged run to inspect when DIR holds shards of several runs.',
  lower_bound=1,
)
_STACK_SIZE = flags.DEFINE_integer(
  'stack_size',
  None,
  "Frames per state, for the count of valid transitions (default: a store's, "
  'else 4 for Atari frames and 1 for other observations).',
  lower_bound=1,
)
_UPDATE_HORIZON = flags.DEFINE_integer(
  'update_horizon',
  None,
  'n of the n-step return, for the count of valid transitions (default: a '
  "store's, else 1).",
  lower_bound=1,
)
_JSON = flags.DEFINE_boolean(
  'json', False, 'Print machine-readable JSON instead of a table.'
)

_REMOTE_TIMEOUT = cli.define_remote_timeout_flag(__name__)

_USAGE = (
  'usage: fixed-replay inspect DIR [--verify] [--run=N] [--stack_size=N] '
  '[--update_horizon=N] [--json]'
)


def _report(summary, table):
  print(
    json.dumps(summary.to_dict(), indent=2) if _JSON.value else table(summary)
  )
  return _exit_status([] if summary.ok else [tables.format_problems(summary)])


def _exit_status(problems):
  """0, or 1 once the problems are printed to stderr (after stdout's lines)."""
  sys.stdout.flush()
  if not problems:
    return 0
  print('\n'.join(problems), file=sys.stderr)
  return 1


def _inspect_run(directory, kind):
  location, parts = rlu_convert.discover(directory, kind, _RUN.value)
  summary = rlu_inspection.summarize_run(
    kind,
    location,
    parts,
    lambda part: rlu_source.open_part(kind, location, part),
    verify=_VERIFY.value,
  )
  return _report(summary, tables.format_run_table)


def _inspect_root(directory):
  """Lists a root's games and runs, and which are missing or differ.

  Returns:
    The exit status, or None if the directory holds no <Game>/<run>/ runs.
  """
  # Imported here: the other layouts need none of the samplers.
  from fixed_replay.sources import game_roots
  from fixed_replay.sources.dopamine import checkpoints
  from fixed_replay.store import manifest as manifest_lib

  try:
    runs = game_roots.runs_of_root(directory)
  except ValueError as error:
    raise CheckpointError(directory, str(error)) from error
  if runs is None:
    return None  # Not a root of runs: the unknown layout is reported.
  counts, lines, damaged = {}, [], []
  for run in runs:
    found = run.detected
    if found.kind is layout.Kind.STORE:
      suffixes = manifest_lib.find_stored_checkpoints(found.data_dir)
    else:
      suffixes = checkpoints.scan_checkpoints(found.data_dir)[0]
    counts[run] = len(suffixes)
    kind = 'compact store' if found.kind is layout.Kind.STORE else 'Dopamine'
    if _VERIFY.value:
      summary = store_inspection.summarize_data(found, verify=True)
      kind += ', verified' if summary.ok else ', DAMAGED'
      if not summary.ok:
        damaged.append(f'{found.path}: {tables.format_problems(summary)}')
    lines.append(f'{run.game:<16} {run.name:<6} {len(suffixes):>11}  {kind}')
  games = sorted({r.game for r in runs})
  print(f'{directory}: {len(games)} game(s), {len(runs)} run(s)')
  print(f'{"game":<16} {"run":<6} {"checkpoints":>11}  kind')
  print('\n'.join(lines))
  if not _VERIFY.value:
    print('Checkpoints counted, not read: --verify checks every run')
  notes = []
  names = {r.name for r in runs}
  for game in games:
    own = [r for r in runs if r.game == game]
    lacking = sorted(names - {r.name for r in own})
    if lacking:
      notes.append(f'missing: {game} lacks run(s) {", ".join(lacking)}')
    sizes = [counts[r] for r in own]
    usual = max(set(sizes), key=sizes.count)
    notes += [
      f"differs: {game}/{r.name} has {counts[r]} checkpoints, its game's "
      f'others {usual}'
      for r in own
      if counts[r] != usual
    ]
  if notes:
    print('\n'.join(notes))
  return _exit_status(damaged)


def main(argv: list[str]) -> int:
  """Inspects the directory named by the one positional argument."""
  if len(argv) != 2:
    raise app.UsageError(
      f'expected one replay directory, got {len(argv) - 1} arguments\n{_USAGE}'
    )
  cli.apply_remote_timeout(_REMOTE_TIMEOUT)
  directory = argv[1]
  try:
    found = layout.detect(directory)
    if found.kind in (layout.Kind.RLU, layout.Kind.TFDS):
      return _inspect_run(directory, found.kind.name.lower())
    if found.kind is layout.Kind.UNKNOWN:
      root = _inspect_root(directory)
      if root is not None:
        return root
    summary = store_inspection.summarize_data(
      found,
      stack_size=_STACK_SIZE.value,
      update_horizon=_UPDATE_HORIZON.value,
      verify=_VERIFY.value,
    )
  except CheckpointError as error:  # No data there, or no answer from it.
    print(f'fixed-replay inspect: {error}', file=sys.stderr)
    return 1
  return _report(summary, tables.format_table)
