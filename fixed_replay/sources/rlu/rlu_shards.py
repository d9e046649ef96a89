"""RL Unplugged's copy of the DQN Replay Dataset: its shards and records.

RL Unplugged publishes each run as GZIP TFRecord shards
`<Game>/run_<r>-<NNNNN>-of-<MMMMM>` (local or gs://), one `tf.train.Example`
per episode (see rlu_episodes.py). This module finds the shards of a run,
reads their records (io/tfrecord.py checks every record's length and data
CRC and the gzip trailer) and yields the validated episodes. Every problem
is a CheckpointError naming the shard and the episode.
"""

from collections.abc import Callable
from collections.abc import Collection
from collections.abc import Iterator
from collections.abc import Sequence
import dataclasses
import re

from absl import logging

from fixed_replay.errors import CheckpointError
from fixed_replay.errors import RemoteError
from fixed_replay.io import files as storage
from fixed_replay.io import tfrecord
from fixed_replay.io.gzip_stream import GzipStream
from fixed_replay.sources.rlu import rlu_episodes

SHARD_NAME = re.compile(
  r'^run_(?P<run>\d+)-(?P<shard>\d{5})-of-(?P<total>\d{5})$'
)


@dataclasses.dataclass(frozen=True)
class Shard:
  """One shard file of a run.

  Attributes:
    path: str, local path or gs:// URL.
    run: int, the run (1..5).
    number: int, NNNNN in the name; normally the checkpoint it holds.
    total: int, MMMMM in the name.
  """

  path: str
  run: int
  number: int
  total: int

  @property
  def name(self) -> str:
    return shard_name(self.run, self.number, self.total)


def shard_name(run: int, number: int, total: int) -> str:
  """The file name RL Unplugged gives shard `number` of `total` of a run."""
  return f'run_{run}-{number:05d}-of-{total:05d}'


def find_runs(directory: str) -> dict[int, list['Shard']]:
  """Returns {run: [Shard, ...] in shard order} for a directory.

  Raises:
    CheckpointError: if the directory does not exist or holds no shard.
  """
  directory = str(directory)
  if not storage.isdir(directory):
    raise CheckpointError(directory, 'directory does not exist')
  runs = {}
  for name in storage.listdir(directory):
    match = SHARD_NAME.match(name)
    if match:
      shard = Shard(
        storage.join(directory, name),
        int(match['run']),
        int(match['shard']),
        int(match['total']),
      )
      runs.setdefault(shard.run, []).append(shard)
  if not runs:
    raise CheckpointError(
      directory,
      'no RL Unplugged shard (run_<r>-<NNNNN>-of-<MMMMM> files) in it',
    )
  return {run: sorted(s, key=lambda s: s.number) for run, s in runs.items()}


def select_run(directory: str, run: int | None = None) -> list['Shard']:
  """Returns the shards of one run of a directory.

  Args:
    directory: str.
    run: int or None; None is allowed when the directory holds one run.

  Raises:
    CheckpointError: if the run is absent, several runs are there and none
      was chosen, or the run's shards disagree on their total.
  """
  runs = find_runs(directory)
  if run is None:
    if len(runs) > 1:
      raise CheckpointError(
        str(directory),
        f'holds shards of runs {sorted(runs)}: choose one with --run',
      )
    run = next(iter(runs))
  if run not in runs:
    raise CheckpointError(
      str(directory), f'holds no shard of run {run} (runs: {sorted(runs)})'
    )
  shards = runs[run]
  totals = sorted({s.total for s in shards})
  if len(totals) > 1:
    raise CheckpointError(
      str(directory), f'run {run} has shards named -of- {totals}: mixed sets'
    )
  return shards


def read_records(
  path: str, describe: Callable[[], str] | None = None
) -> Iterator[tuple[int, bytes]]:
  """Yields (record number, serialized bytes) of a GZIP TFRecord file.

  Reads to the end: every record's length and data CRC-32C, and the gzip
  CRC-32 and length of the whole file, are checked (io/tfrecord.py).

  Args:
    path: str, local or gs://.
    describe: optional callable returning a text naming the last record
      consumed (its episode), for messages.

  Raises:
    CheckpointError: naming the file, for any damage.
  """
  count = 0
  with GzipStream(path) as stream:
    try:
      for _, record in tfrecord.read_records(path, stream):
        yield count, record
        count += 1
    except RemoteError:
      raise
    except CheckpointError as error:
      after = f'after {count} good record(s)'
      last = describe() if describe else None
      if last is not None:
        after += f', the last {last}'
      raise CheckpointError(
        path, f'damaged GZIP TFRecord ({error.problem}), {after}'
      ) from error


def iter_episodes(
  path: str, wanted: Collection[int] | None = None
) -> Iterator[rlu_episodes.Episode]:
  """Yields the validated Episodes of a shard, in file order.

  Args:
    path: str, the shard.
    wanted: optional set of record numbers; other records are skipped
      unparsed (and the file is still read, and checked, to the end).

  Raises:
    CheckpointError: naming the shard and the episode.
  """
  last = [None]
  for number, data in read_records(path, lambda: last[0]):
    if wanted is not None and number not in wanted:
      continue
    episode = rlu_episodes.parse_episode(data, path, number)
    last[0] = episode.where()
    yield episode


def log_shards(shards: Sequence['Shard']) -> None:
  logging.info(
    'Run %d: %d shard(s) %s ... %s',
    shards[0].run,
    len(shards),
    shards[0].name,
    shards[-1].name,
  )
