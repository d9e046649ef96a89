"""`fixed-replay convert SRC DST`: a run into a compact store or Dopamine files.

SRC is one run, local or gs://, in one of three forms (detected from its
file names, or forced with --source):

  dopamine  Dopamine gzip checkpoints (`$store$_observation_ckpt.N.gz` ...),
            as in the original DQN Replay Dataset bucket;
  rlu       RL Unplugged's episode shards `run_<r>-NNNNN-of-MMMMM` (GZIP
            TFRecord, one episode per record); --run=N picks the run when
            SRC holds several, --run=all converts each run r into
            DST/run_<r>/ (one job, as below);
  tfds      a TFDS-prepared rlu_atari_checkpoints_ordered directory.

A compact store (any format version) is read back as SRC and written anew
in the current format, as `fixed-replay convert OLD_STORE NEW_STORE`.

Each checkpoint becomes DST/checkpoint_<N>/ (the compact store: frames in
independently decodable zstd units against a per-checkpoint dictionary; small
arrays, the table of valid rows, a manifest with checksums), or with
--format=dopamine Dopamine's own `*_ckpt.N.gz` files in DST. RL Unplugged
episodes become the rows Dopamine's replay buffer holds after adding them (see
the README). Checkpoints are converted in parallel, one process each, streaming
(bounded memory), and each is verified before it is moved into place. Run it
again after an interruption: converted checkpoints are checked and skipped, the
rest converted. SRC is never modified.

Several Dopamine runs at once, each into its own store under DST:

  fixed-replay convert GAME_DIR DST   every run directory of GAME_DIR (one
      holding checkpoints itself or in replay_logs/, as in the DQN Replay
      Dataset's Pong/1/replay_logs) goes to DST/<run directory's name>/;
  fixed-replay convert ROOT DST [--games=Pong,Breakout] [--runs=1,2]   every
      run of a root of games (ROOT/<Game>/<run>, as fixed_replay.ReplayMixture
      reads) goes to DST/<Game>/<run>/, all in one job;
  fixed-replay convert SRC1 SRC2 ... DST   each run (its checkpoints in
      SRC or SRC/replay_logs) to DST/<SRC's name>/ (the name of its parent
      for a SRC named replay_logs).

On Ray (`--ray` for a private Ray on this machine bound to 127.0.0.1,
`--ray_address=ADDR` for a running cluster whose nodes all mount DST at the
same path), each checkpoint is a retried Ray task, and the stores are the
same, byte for byte; see docs/guides/ray.md.

Then train on DST, either format, with `fixed-replay train --replay_dir=DST
...`: FixedReplayBuffer reads a store as it reads Dopamine's files.

  fixed-replay convert /data/Pong/1/replay_logs /data/Pong/1/compact
  fixed-replay convert /data/Pong /data/compact/Pong --ray
  fixed-replay convert gs://rl_unplugged/atari_episodes_ordered/Pong \\
      /data/pong1 --run=1
  fixed-replay convert /data/rlu/Pong /data/compact/Pong --run=all
  fixed-replay convert /data/dqn /data/games --games=Pong,Breakout --runs=1
"""

import os
import re
import sys

from absl import app
from absl import flags

from fixed_replay import cli
from fixed_replay import compat
from fixed_replay import progress
from fixed_replay.convert import convert
from fixed_replay.convert import convert_options
from fixed_replay.convert import rlu_convert
from fixed_replay.errors import CheckpointError
from fixed_replay.sources import layout
from fixed_replay.sources.rlu import rlu_shards

_DEFAULTS = convert_options.ConvertOptions()
_BLOCK_ROWS = flags.DEFINE_integer(
  'block_rows',
  _DEFAULTS.block_rows,
  'Frames per zstd unit: larger compresses better, decodes more per '
  'random read.',
  lower_bound=1,
)
_CLEVEL = flags.DEFINE_integer(
  'clevel',
  _DEFAULTS.clevel,
  'compression level: zstd level 3 x clevel (at most 19); the same '
  'default whatever the source.',
  lower_bound=0,
  upper_bound=9,
)
_STACK_SIZE = flags.DEFINE_integer(
  'stack_size',
  _DEFAULTS.stack_size,
  'Frames per state, for the precomputed table of valid rows (default: 4 '
  'for Atari frames, else 1).',
  lower_bound=1,
)
_UPDATE_HORIZON = flags.DEFINE_integer(
  'update_horizon',
  _DEFAULTS.update_horizon,
  'n of the n-step return, for the table of valid rows (other values are '
  'computed when the buffer opens the store).',
  lower_bound=1,
)
_WORKERS = flags.DEFINE_integer(
  'workers',
  None,
  'Processes converting checkpoints at once (default: one per core); 0 '
  'converts in this process. With --ray: the CPUs of the local Ray.',
  lower_bound=0,
)
_RAY = flags.DEFINE_boolean(
  'ray',
  False,
  'Convert each checkpoint as a Ray task, on a private Ray on this machine '
  '(127.0.0.1) unless --ray_address names a cluster.',
)
_RAY_ADDRESS = flags.DEFINE_string(
  'ray_address',
  None,
  'A running Ray cluster to convert on: auto, HOST:PORT or ray://HOST:PORT '
  '(implies --ray). DST must be a directory all its nodes mount at the same '
  'path.',
)

_REMOTE_TIMEOUT = cli.define_remote_timeout_flag(__name__)
_SOURCE = flags.DEFINE_enum(
  'source',
  None,
  ['dopamine', 'rlu', 'tfds'],
  'Form of SRC (default: detected from its file names).',
)
_GAME = flags.DEFINE_string(
  'game',
  None,
  "The dataset's game as Dopamine names it (Pong, MsPacman), recorded in "
  "the store's manifests so that `fixed-replay train` evaluates in it. "
  "Default: the game SRC's path names (<Game>/<run>/replay_logs, RL "
  "Unplugged's <Game>/run_<r>-...), if any.",
)
_RUN = flags.DEFINE_string(
  'run',
  None,
  'Run to convert when SRC holds RL Unplugged shards of several runs: N, '
  'or all (each run r into DST/run_<r>/).',
)
_GAMES = flags.DEFINE_list(
  'games', None, 'Games to convert under a ROOT of <Game>/<run> (all).'
)
_RUNS = flags.DEFINE_list(
  'runs', None, 'Runs to convert under a ROOT of <Game>/<run> (all).'
)
_FORMAT = flags.DEFINE_enum(
  'format',
  'compact',
  ['compact', 'dopamine'],
  "compact: the compact store; dopamine: Dopamine's own checkpoint files "
  '(RL Unplugged sources only).',
)
_GZIP_LEVEL = flags.DEFINE_integer(
  'gzip_level',
  _DEFAULTS.gzip_level,
  'gzip level of --format=dopamine files (Dopamine itself writes 9: about '
  '0.6x the bytes, 10x slower).',
  lower_bound=1,
  upper_bound=9,
)

_USAGE = (
  'usage: fixed-replay convert SRC [SRC...] DST [--source=dopamine|rlu|tfds] '
  '[--run=N|all] [--format=compact|dopamine] [--workers=N] [--ray] '
  '[--ray_address=ADDR]'
)


_GAME_NAME = re.compile(r'^[A-Za-z0-9]+$')
# What each layout.Kind that converts is called by --source.
_SOURCE_OF = {
  layout.Kind.DOPAMINE: 'dopamine',
  layout.Kind.DOPAMINE_RUN: 'dopamine',
  # A compact store is read back checkpoint by checkpoint and written anew
  # (an old format version rewritten in the current one).
  layout.Kind.STORE: 'dopamine',
  layout.Kind.RLU: 'rlu',
  layout.Kind.TFDS: 'tfds',
}


def _source(path):
  """(form, directory) of SRC: --source's form and SRC itself, or detected.

  The directory is where the data's files are (a run's replay_logs/).

  Raises:
    CheckpointError: naming what SRC lacks or holds, if it is none of them.
  """
  if _SOURCE.value:
    return _SOURCE.value, path
  found = layout.detect(path)
  if found.kind not in _SOURCE_OF:
    raise found.error()
  return _SOURCE_OF[found.kind], found.data_dir


def _game():
  """--game, checked; None leaves it to the game SRC's path names."""
  if _GAME.value and not _GAME_NAME.match(_GAME.value):
    raise app.UsageError(f'--game={_GAME.value}: letters and digits only')
  return _GAME.value


def _ray():
  """What --ray and --ray_address ask for (convert.convert's `ray`)."""
  if not (_RAY_ADDRESS.value or _RAY.value):
    return None
  compat.require('ray', 'ray', 'convert --ray', extra='ray')  # Fail now.
  if _RAY_ADDRESS.value:
    if _WORKERS.value is not None:
      raise app.UsageError(
        '--workers sets the CPUs of the local Ray (--ray); with '
        "--ray_address the cluster's CPUs decide"
      )
    return _RAY_ADDRESS.value
  if _WORKERS.value == 0:
    raise app.UsageError('--workers=0 converts in this process: not --ray')
  return True


def _check_dopamine_flags(options):
  if options.output_format == 'dopamine':
    raise app.UsageError(
      "--format=dopamine: SRC is already in Dopamine's format"
    )
  if _RUN.value is not None:
    raise app.UsageError('--run is for RL Unplugged shards (--source=rlu)')


_NOT_A_ROOT = (
  '--games and --runs select runs under a ROOT of <Game>/<run> directories'
)


def several_runs(sources, destination):
  """[(run, store)] when SRC names several runs, None for a single run.

  Raises:
    app.UsageError: if two runs would share a store, or --games or --runs
      are given without a root of games.
  """
  selecting = bool(_GAMES.value or _RUNS.value)
  if len(sources) == 1 and not _SOURCE.value:
    found = layout.detect(sources[0])
    if found.kind is layout.Kind.UNKNOWN:
      runs = _root_runs(sources[0], destination)
      if runs is not None or not selecting:
        return runs
  if selecting:
    raise app.UsageError(_NOT_A_ROOT)
  if len(sources) == 1:
    if _SOURCE.value or found.kind is not layout.Kind.GAME:
      return None  # Converting it as one run names what is wrong.
    return [
      (run_dir, os.path.join(destination, name)) for name, run_dir in found.runs
    ]
  names = [layout.run_name(source) for source in sources]
  repeated = sorted({name for name in names if names.count(name) > 1})
  if repeated:
    raise app.UsageError(
      f'runs named {repeated} would go into the same store under '
      f'{destination}: convert them with separate commands'
    )
  return [
    (
      source if _SOURCE.value else layout.run_checkpoint_dir(source) or source,
      os.path.join(destination, name),
    )
    for source, name in zip(sources, names, strict=True)
  ]


def _root_runs(root, destination):
  """[(run, store)] of ROOT/<Game>/<run>, each into DST/<Game>/<run>/.

  None if ROOT holds no such runs (converting it as one run then names
  what it holds).
  """
  # Imported here: a single run's conversion needs none of the samplers.
  from fixed_replay.sources import game_roots

  try:
    runs = game_roots.runs_of_root(root, _GAMES.value, _RUNS.value)
  except ValueError as error:
    raise app.UsageError(str(error)) from error
  if runs is None:
    return None
  return [
    (r.detected.data_dir, os.path.join(destination, r.game, r.name))
    for r in runs
  ]


def _convert_runs(runs, options):
  for source, _ in runs:
    kind, _ = _source(source)
    if kind != 'dopamine':
      raise app.UsageError(
        f'{source}: a list of runs is for Dopamine checkpoints; all RL '
        'Unplugged runs of one shard directory convert with --run=all'
      )
  _check_dopamine_flags(options)
  results = convert.convert_runs(runs, options, _WORKERS.value, _ray())
  return [(store, r) for (_, store), r in zip(runs, results, strict=True)]


def _run():
  """--run: None, 'all' or a run number."""
  value = _RUN.value
  if value is None or value == 'all':
    return value
  if not value.isdigit() or int(value) < 1:
    raise app.UsageError(f'--run={value}: a run number (1, 2, ...) or all')
  return int(value)


def _one_rlu_run(source):
  """Refuses shards of several runs without --run, naming them."""
  runs = sorted(rlu_shards.find_runs(source))
  if len(runs) > 1:
    raise CheckpointError(
      source,
      f'holds shards of runs {runs}: choose one with --run=N, or convert '
      'each run r into DST/run_<r>/ with --run=all',
    )


def _convert_all_runs(source, destination, options):
  """--run=all: [(store, result)] of every run of the shards in SRC."""
  if _source(source)[0] != 'rlu':
    raise app.UsageError('--run=all is for RL Unplugged shards (--source=rlu)')
  results = rlu_convert.convert_all_runs(
    source, destination, options, workers=_WORKERS.value, ray=_ray()
  )
  return [
    (rlu_convert.run_store(destination, run), result)
    for run, result in results.items()
  ]


def _convert(source, destination, options):
  kind, directory = _source(source)
  if kind == 'dopamine':
    _check_dopamine_flags(options)
    return kind, convert.convert(
      directory, destination, options, workers=_WORKERS.value, ray=_ray()
    )
  if kind == 'rlu' and _run() is None:
    _one_rlu_run(source)
  return kind, rlu_convert.convert_rlu(
    source,
    destination,
    kind=kind,
    run=_run(),
    options=options,
    workers=_WORKERS.value,
    ray=_ray(),
  )


def _timed(frames, seconds):
  rate = frames / seconds if seconds else 0.0
  return f'{frames:,} frames in {seconds:.1f} s ({rate:,.0f}/s)'


def _print_results(kind, stored):
  """Each store's own figures, then the job's time (one for all runs)."""
  what = {'dopamine': 'gzip', 'rlu': 'RL Unplugged shards', 'tfds': 'TFDS'}
  for store, result in stored:
    frames = f'{result.frames:,} frames'
    print(
      f'converted {len(result.converted)} checkpoint(s) {result.converted}, '
      f'{len(result.skipped)} already there {result.skipped}; '
      + (_timed(result.frames, result.seconds) if len(stored) == 1 else frames)
    )
    print(
      f'{_FORMAT.value} output {progress.format_bytes(result.store_bytes)} '
      f'for {progress.format_bytes(result.source_bytes)} of {what[kind]} '
      f'({result.store_bytes / max(result.source_bytes, 1):.2f}x): {store}'
    )
  if len(stored) > 1:
    frames = sum(result.frames for _, result in stored)
    print(f'{len(stored)} runs: {_timed(frames, stored[0][1].seconds)}')


def main(argv: list[str]) -> int:
  """Converts SRC into DST (or each run of SRC under DST); prints a summary."""
  if len(argv) < 3:
    raise app.UsageError(
      f'expected SRC and DST, got {len(argv) - 1} arguments\n{_USAGE}'
    )
  cli.apply_remote_timeout(_REMOTE_TIMEOUT)
  options = convert_options.ConvertOptions(
    block_rows=_BLOCK_ROWS.value,
    clevel=_CLEVEL.value,
    stack_size=_STACK_SIZE.value,
    update_horizon=_UPDATE_HORIZON.value,
    output_format=_FORMAT.value,
    gzip_level=_GZIP_LEVEL.value,
    game=_game(),
  )
  sources, destination = argv[1:-1], argv[-1]
  try:
    if _run() == 'all':
      if len(sources) != 1:
        raise app.UsageError('--run=all takes one SRC: a directory of shards')
      kind, stored = 'rlu', _convert_all_runs(sources[0], destination, options)
    elif (runs := several_runs(sources, destination)) is None:
      kind, result = _convert(sources[0], destination, options)
      stored = [(destination, result)]
    else:
      kind, stored = 'dopamine', _convert_runs(runs, options)
  except CheckpointError as error:
    print(f'fixed-replay convert: {error}', file=sys.stderr)
    return 1
  _print_results(kind, stored)
  return 0
