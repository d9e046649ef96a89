"""What is at a path: the one answer for inspect, convert, train and sweep.

A dataset reaches the commands in several shapes: Dopamine's checkpoint
files (`*_ckpt.N.gz`) in a folder, a run directory holding them in
`replay_logs/` (the DQN Replay Dataset's `<Game>/<run>/replay_logs`), a game
directory whose subdirectories are runs, a compact store (`checkpoint_N/`
directories written by `fixed-replay convert`), RL Unplugged shards
(`run_<r>-NNNNN-of-MMMMM`) or a TFDS-prepared
`rlu_atari_checkpoints_ordered`. Each command used to decide this on its
own, in a different order and with different errors; `detect(path)` decides
it once, from the file names only (no file is opened but a TFDS
dataset_info.json and a store's manifest), for local and gs:// paths.

What cannot be trained on as it is gets an error that says what to do:
`Layout.require_trainable()` names the `fixed-replay convert` command for
RL Unplugged or TFDS input, what is missing for a half-written directory, and
what was found and which layouts are accepted for anything else.

The layout also knows the dataset's game where the path or the store says
it: RL Unplugged's `<Game>/run_<r>-...` shards, TFDS' `<Game>_run_<r>`
config, the `game` a store's manifest records (`fixed-replay convert`
records each run's), else a run's `<Game>/<run>/` path (Dopamine's files or
a store).
"""

import dataclasses
import enum
import json
import re

from fixed_replay.errors import CheckpointError
from fixed_replay.io import files as storage
from fixed_replay.sources.dopamine import checkpoints
from fixed_replay.sources.rlu import rlu_shards
from fixed_replay.sources.rlu import rlu_tfds

REPLAY_LOGS = 'replay_logs'
# Dopamine names Atari games in CamelCase ('Pong', 'MsPacman'); a directory
# named otherwise ('1', 'data', 'tmp') is not taken for a game.
_GAME_NAME = re.compile(r'^[A-Z][A-Za-z0-9]*$')
_TFDS_CONFIG = re.compile(r'^(?P<game>[A-Za-z0-9]+)_run_(?P<run>\d+)$')
_STORE_CHECKPOINT = re.compile(r'^checkpoint_\d+$')
_STORE_PARTIAL = re.compile(r'^\.checkpoint_\d+\.partial-\d+$')
_STORE_MANIFEST = 'manifest.json'
_SHOWN_NAMES = 8  # Entries named in an error about an unknown directory.


class Kind(enum.Enum):
  """The layouts a path may have."""

  DOPAMINE = 'Dopamine replay checkpoints (*_ckpt.N.gz)'
  DOPAMINE_RUN = 'a run directory with its checkpoints in replay_logs/'
  GAME = 'a game directory of runs (<run>/replay_logs/ or <run>/*.gz)'
  STORE = 'a compact store (checkpoint_N/, from `fixed-replay convert`)'
  RLU = 'RL Unplugged shards (run_<r>-NNNNN-of-MMMMM)'
  TFDS = 'a TFDS-prepared rlu_atari_checkpoints_ordered dataset'
  PARTIAL = 'half-written data'
  EMPTY = 'an empty directory'
  MISSING = 'no such directory'
  UNKNOWN = 'no known layout'


# What the training buffer reads as it is.
TRAINABLE = frozenset([Kind.DOPAMINE, Kind.DOPAMINE_RUN, Kind.STORE])
# The layouts an error lists as accepted.
ACCEPTED = (
  Kind.DOPAMINE,
  Kind.DOPAMINE_RUN,
  Kind.GAME,
  Kind.STORE,
  Kind.RLU,
  Kind.TFDS,
)


@dataclasses.dataclass(frozen=True)
class Layout:
  """What `detect` found at a path.

  Attributes:
    path: str, the path as given (no trailing slash).
    kind: Kind.
    data_dir: str, where the data's files are: the checkpoint folder of a
      Dopamine run (its replay_logs/ when there is one), else `path`.
    game: str or None, the dataset's game where known.
    runs: tuple of (run name, checkpoint folder), for Kind.GAME; the runs
      of RL Unplugged shards as ('1', path), ... for Kind.RLU.
    problem: str, for PARTIAL, EMPTY, MISSING and UNKNOWN: what is missing,
      or what was found.
    partial_of: Kind or None, for PARTIAL: DOPAMINE or STORE.
  """

  path: str
  kind: Kind
  data_dir: str
  game: str | None = None
  runs: tuple = ()
  problem: str = ''
  partial_of: Kind | None = None

  @property
  def trainable(self) -> bool:
    """Whether the training buffer reads this data as it is."""
    return self.kind in TRAINABLE

  def error(self) -> CheckpointError:
    """The error for a command that cannot use this data as it is."""
    if self.kind in (Kind.RLU, Kind.TFDS):
      return CheckpointError(
        self.path,
        f'{self.kind.value}: convert it first, then train on the store: '
        f'{convert_command(self)}',
      )
    if self.kind is Kind.GAME:
      names = ', '.join(name for name, _ in self.runs)
      return CheckpointError(
        self.path,
        f'{self.kind.value} ({names}): name one run, e.g. '
        f'{storage.join(self.path, self.runs[0][0])}',
      )
    return CheckpointError(self.path, self.problem)

  def require_trainable(self) -> 'Layout':
    """Returns self if trainable.

    Raises:
      CheckpointError: saying what to do with it otherwise.
    """
    if not self.trainable:
      raise self.error()
    return self


def accepted_layouts() -> str:
  """The accepted layouts, for error messages."""
  return '; '.join(kind.value for kind in ACCEPTED)


def convert_command(layout: Layout) -> str:
  """The `fixed-replay convert` command that makes RLU/TFDS data trainable.

  The store goes next to the source (into the working directory for a
  gs:// source): `<name>_store`, or `<name>_run_<r>_store` for one run of
  shards that hold several.
  """
  run_names = [name for name, _ in layout.runs]
  several = layout.kind is Kind.RLU and len(run_names) > 1
  flag = f' --run={run_names[0]}' if several else ''
  store = _basename(layout.path) or 'dataset'
  store += f'_run_{run_names[0]}_store' if several else '_store'
  parent = _parent(layout.path)
  if parent and not storage.is_remote(layout.path):
    store = storage.join(parent, store)
  return f'fixed-replay convert{flag} {layout.path} {store}'


def _basename(path: str) -> str:
  return path.rstrip('/').rsplit('/', 1)[-1]


def _parent(path: str) -> str:
  return path.rstrip('/').rpartition('/')[0]


def _game_name(name: str) -> str | None:
  return name if _GAME_NAME.match(name) else None


def path_game(data_dir: str) -> str | None:
  """The game a run's path names, as `<Game>/<run>/...` (Dopamine's files
  or a store).

  The run directory is the folder's parent when the folder is replay_logs/,
  else the folder itself; the game is the run directory's parent, when it
  is named as Dopamine names games.
  """
  run_dir = data_dir.rstrip('/')
  if _basename(run_dir) == REPLAY_LOGS:
    run_dir = _parent(run_dir)
  return _game_name(_basename(_parent(run_dir)))


def game_of(path: str) -> str | None:
  """The game of the dataset at `path` (its layout's, else its path's)."""
  try:
    found = detect(path).game
  except CheckpointError:
    found = None  # Remote storage did not answer: the path alone.
  return found or path_game(str(path))


def _complete_checkpoints(directory: str) -> tuple[dict, dict] | None:
  try:
    return checkpoints.scan_checkpoints(directory)
  except (CheckpointError, OSError):
    return None  # Not a readable directory.


def run_checkpoint_dir(run_dir: str) -> str | None:
  """Where a run directory's Dopamine checkpoints are: replay_logs/ or itself.

  Returns:
    str, the first of `run_dir/replay_logs` and `run_dir` that holds a
    complete checkpoint, or None.
  """
  for candidate in (storage.join(run_dir, REPLAY_LOGS), run_dir):
    scanned = _complete_checkpoints(candidate)
    if scanned and scanned[0]:
      return candidate
  return None


def find_runs(game_dir: str) -> dict[str, str]:
  """The runs of a game directory: {run name: its checkpoint folder}.

  Each subdirectory holding Dopamine checkpoints itself or in replay_logs/
  (as `gs://atari-replay-datasets/dqn/Pong/1/replay_logs`) is a run; sorted
  by name; empty if there is none.
  """
  try:
    names = sorted(storage.listdir(game_dir))
  except (CheckpointError, OSError):
    return {}
  runs = {n: run_checkpoint_dir(storage.join(game_dir, n)) for n in names}
  return {name: found for name, found in runs.items() if found is not None}


def run_name(path: str) -> str:
  """The name of a run: its directory's name, above replay_logs/."""
  path = str(path).rstrip('/')
  if _basename(path) == REPLAY_LOGS and _parent(path):
    return _basename(_parent(path))
  return _basename(path) or path


def _missing_files(incomplete: dict) -> str:
  return '; '.join(
    f'checkpoint {suffix} lacks {", ".join(names)}'
    for suffix, names in sorted(incomplete.items())
  )


def _store_layout(path: str, names: list[str]) -> Layout | None:
  checkpoint_dirs = [n for n in names if _STORE_CHECKPOINT.match(n)]
  partial_dirs = [n for n in names if _STORE_PARTIAL.match(n)]
  if not checkpoint_dirs and not partial_dirs:
    return None
  complete = [
    n
    for n in checkpoint_dirs
    if storage.exists(storage.join(storage.join(path, n), _STORE_MANIFEST))
  ]
  if complete:
    game = _store_game(path, complete) or path_game(path)
    return Layout(path, Kind.STORE, path, game=game)
  lacking = [f'{n}/{_STORE_MANIFEST}' for n in sorted(checkpoint_dirs)]
  problem = 'a compact store with no complete checkpoint'
  if lacking:
    problem += f': missing {", ".join(lacking[:_SHOWN_NAMES])}'
  if partial_dirs:
    problem += (
      f'; half-written {", ".join(sorted(partial_dirs)[:_SHOWN_NAMES])} '
      '(rerun the `fixed-replay convert` that wrote it)'
    )
  return Layout(
    path, Kind.PARTIAL, path, problem=problem, partial_of=Kind.STORE
  )


def _store_game(path: str, checkpoint_dirs: list[str]) -> str | None:
  """The game a store's manifest records (the first checkpoint's)."""
  manifest_path = storage.join(
    storage.join(path, sorted(checkpoint_dirs)[0]), _STORE_MANIFEST
  )
  try:
    with storage.open_read(manifest_path) as stream:
      game = json.load(stream).get('game')
  except (OSError, ValueError):
    return None  # Reading the store reports a damaged manifest.
  return game if isinstance(game, str) and game else None


def _rlu_layout(path: str) -> Layout | None:
  try:
    runs = rlu_shards.find_runs(path)
  except CheckpointError:
    return None
  return Layout(
    path,
    Kind.RLU,
    path,
    game=_game_name(_basename(path)),
    runs=tuple((str(run), path) for run in sorted(runs)),
  )


def _tfds_layout(path: str) -> Layout | None:
  if not rlu_tfds.is_prepared_dataset(path):
    return None
  location = rlu_tfds.find_dataset_dir(path)
  game = None
  for directory in (location, _parent(location)):
    match = _TFDS_CONFIG.match(_basename(directory))
    if match:
      game = _game_name(match['game'])
      break
  return Layout(path, Kind.TFDS, location, game=game)


def _dopamine_layout(path: str) -> Layout | None:
  scanned = _complete_checkpoints(path)
  if scanned and scanned[0]:
    return Layout(path, Kind.DOPAMINE, path, game=path_game(path))
  nested = storage.join(path, REPLAY_LOGS)
  nested_scan = _complete_checkpoints(nested)
  if nested_scan and nested_scan[0]:
    return Layout(path, Kind.DOPAMINE_RUN, nested, game=path_game(nested))
  for where, found in ((path, scanned), (nested, nested_scan)):
    if found and found[1]:
      return Layout(
        path,
        Kind.PARTIAL,
        where,
        problem='Dopamine replay checkpoints, none complete: '
        + _missing_files(found[1]),
        partial_of=Kind.DOPAMINE,
      )
  return None


def detect(path: str) -> Layout:
  """What is at `path` (local or gs://); see the module docstring.

  Raises:
    CheckpointError: only when remote storage does not answer.
  """
  path = str(path)
  path = path.rstrip('/') or path
  if not storage.isdir(path):
    problem = 'no such directory'
    if storage.exists(path):
      problem = 'a file, not a directory: expected one of ' + accepted_layouts()
    return Layout(path, Kind.MISSING, path, problem=problem)
  # A Layout is always true: `or` moves on only from None.
  found = _dopamine_layout(path) or _rlu_layout(path)
  if found is not None:
    return found
  names = sorted(storage.listdir(path))
  found = _store_layout(path, names) or _tfds_layout(path)
  if found is not None:
    return found
  runs = find_runs(path)
  if runs:
    return Layout(
      path,
      Kind.GAME,
      path,
      game=_game_name(_basename(path)),
      runs=tuple(runs.items()),
    )
  if (
    not names
    or names == [REPLAY_LOGS]
    and not storage.listdir(storage.join(path, REPLAY_LOGS))
  ):
    return Layout(
      path,
      Kind.EMPTY,
      path,
      problem=f'empty directory: expected one of {accepted_layouts()}',
    )
  shown = ', '.join(names[:_SHOWN_NAMES])
  if len(names) > _SHOWN_NAMES:
    shown += f', ... ({len(names)} entries)'
  return Layout(
    path,
    Kind.UNKNOWN,
    path,
    problem=f'no known layout (found {shown}); accepted: '
    f'{accepted_layouts()}',
  )
