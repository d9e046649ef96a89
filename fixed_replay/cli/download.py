"""`fixed-replay download --game=G --run=R DST`: a run from RL Unplugged.

Copies the run's shards (one per checkpoint, ~1 GB each) from RL Unplugged's
bucket, gs://rl_unplugged/atari_episodes_ordered/<Game>/run_<R>-NNNNN-of-
MMMMM, into DST/<Game>/ with tf.io.gfile (anonymous: the bucket is public).
Each copy is verified (size, every record read to its end) before it takes
its name; a rerun skips complete shards and resumes the rest.

With --convert, each shard is converted as it arrives (into --store_dir,
default DST/<Game>/run_<R>_compact, or _dopamine with --format=dopamine) and
its raw copy deleted once its checkpoint is verified: about 50 MB of disk a
checkpoint instead of 1 GB.

  fixed-replay download --game=Pong --run=1 /data/rlu --checkpoints=0-4
  fixed-replay download --game=Pong --run=1 /data/rlu --convert

Several games and runs in one command, each converted into the layout
fixed_replay.ReplayMixture reads (STORE_ROOT/<Game>/<run>):

  fixed-replay download --games=Pong,Breakout --runs=1,2 /data/rlu \
      --convert --store_root=/data/games
"""

import os
import sys

from absl import app
from absl import flags

from fixed_replay.convert import download
from fixed_replay.convert.convert_options import ConvertOptions
from fixed_replay.errors import CheckpointError
from fixed_replay.progress import format_bytes

_GAME = flags.DEFINE_string(
  'game', None, 'Atari game, e.g. Pong (as RL Unplugged names it).'
)
_RUN = flags.DEFINE_integer('run', None, 'Run, 1..5.', lower_bound=1)
_GAMES = flags.DEFINE_list('games', None, 'Several games (instead of --game).')
_RUNS = flags.DEFINE_list('runs', None, 'Several runs (instead of --run).')
_STORE_ROOT = flags.DEFINE_string(
  'store_root',
  None,
  'With --convert: each run into STORE_ROOT/<Game>/<run>, the layout '
  'fixed_replay.ReplayMixture reads.',
)
_CHECKPOINTS = flags.DEFINE_string(
  'checkpoints', None, 'Checkpoints to fetch, e.g. 0-49 or 0,3,5-7 (all).'
)
_CONVERT = flags.DEFINE_boolean(
  'convert', False, 'Convert each shard as it arrives; keep no raw copy.'
)
_STORE_DIR = flags.DEFINE_string(
  'store_dir',
  None,
  'Where --convert writes (default DST/<Game>/run_<R>_<format>).',
)
_FORMAT = flags.DEFINE_enum(
  'format',
  'compact',
  ['compact', 'dopamine'],
  "--convert's output: the compact store or Dopamine's checkpoint files.",
)
_SOURCE_ROOT = flags.DEFINE_string(
  'source_root',
  download.DEFAULT_ROOT,
  'Directory holding <Game>/run_<R>-NNNNN-of-MMMMM (any path tf.io.gfile '
  'reads; a local copy laid out like the bucket works).',
)

_USAGE = (
  'usage: fixed-replay download --game=Pong --run=1 DST [--checkpoints=0-49] '
  '[--convert] [--source_root=...]; or --games=Pong,Breakout --runs=1,2'
)


def _runs() -> list[tuple[str, int]]:
  """The (game, run) pairs asked for, by --game/--run or --games/--runs."""
  games = _GAMES.value or ([_GAME.value] if _GAME.value else [])
  try:
    runs = [int(r) for r in _RUNS.value] if _RUNS.value else [_RUN.value]
  except ValueError as error:
    raise app.UsageError(f'--runs must be run numbers: {error}') from error
  if not games or None in runs or min(runs) < 1:
    raise app.UsageError(f'expected --game(s), --run(s) >= 1 and DST\n{_USAGE}')
  pairs = [(game, run) for game in games for run in runs]
  if _STORE_DIR.value and len(pairs) > 1:
    raise app.UsageError(
      "--store_dir names one run's store; for several, use --store_root"
    )
  return pairs


def _download(game, run, destination, checkpoints):
  """Downloads (and converts) one run: (the result, where it is)."""
  if not _CONVERT.value:
    result, _, store = download.download_run(
      game, run, destination, checkpoints, _SOURCE_ROOT.value
    )
    return result, store
  if _STORE_ROOT.value:
    store = os.path.join(_STORE_ROOT.value, game, str(run))
  else:
    store = _STORE_DIR.value or os.path.join(
      destination, game, f'run_{run}_{_FORMAT.value}'
    )
  result = download.download_and_convert(
    game,
    run,
    destination,
    store,
    checkpoints,
    _SOURCE_ROOT.value,
    ConvertOptions(output_format=_FORMAT.value),
  )
  return result, store


def main(argv: list[str]) -> int:
  """Downloads (and converts) one run or several."""
  if len(argv) != 2:
    raise app.UsageError(f'expected --game, --run and DST\n{_USAGE}')
  pairs = _runs()
  try:
    checkpoints = None
    if _CHECKPOINTS.value:
      checkpoints = download.parse_checkpoints(_CHECKPOINTS.value)
  except ValueError as error:
    raise app.UsageError(str(error)) from error
  destination = argv[1]
  for game, run in pairs:
    try:
      result, store = _download(game, run, destination, checkpoints)
    except CheckpointError as error:
      print(
        f'fixed-replay download: {game} run {run}: {error}', file=sys.stderr
      )
      return 1
    rate = result.bytes / max(result.seconds, 1e-9)
    print(
      f'{game} run {run}: downloaded {len(result.downloaded)} shard(s), '
      f'{len(result.skipped)} already there; '
      f'{format_bytes(result.bytes)} in {result.seconds:.1f} s '
      f'({format_bytes(rate)}/s)'
    )
    if result.conversion is not None:
      print(
        f'converted checkpoint(s) {result.conversion["converted"]} into '
        f'{store} (raw copies deleted)'
      )
    else:
      print(f'shards in {store}')
  return 0
