"""Copies a run's RL Unplugged shards from the bucket, resumably.

The shards live at gs://rl_unplugged/atari_episodes_ordered/<Game>/
run_<r>-NNNNN-of-MMMMM (RL Unplugged's public copy of the DQN Replay
Dataset; the original gs://atari-replay-datasets answers 403). They are read
with tf.io.gfile, so any path it reads works as the root (a local directory
laid out like the bucket stands in for it in tests).

Each shard is copied to a temporary name in DST/<Game>/, verified (the size
the bucket lists, then every record read to the end: TF checks each
record's length and CRC-32C and the gzip CRC, rlu_shards the gzip length)
and renamed: a shard under its own name is complete. A rerun skips complete
shards and deletes the temporaries of an interrupted one.

`download_and_convert` (`--convert`) keeps the raw shards (~1 KB a frame,
~50 GB a run) off the disk: it fetches one shard at a time, converts it with
convert/rlu_convert.py (checkpoints verified before they are committed) and
deletes its raw copy once every checkpoint known to draw on it is stored as
planned. A checkpoint whose episodes turn out to span shards is converted
again when the later shard arrives, fetching the earlier one again: a rare
layout pays a second download, the usual one never does. Killed and
restarted, it skips what is stored and indexed, and fetches only what is
still needed.
"""

from collections.abc import Iterable
import dataclasses
import os
import re
import time

from absl import logging

from fixed_replay import progress
from fixed_replay.convert import rlu_convert
from fixed_replay.convert.convert_options import ConvertOptions
from fixed_replay.errors import CheckpointError
from fixed_replay.io import files as storage
from fixed_replay.sources.rlu import rlu_plan
from fixed_replay.sources.rlu import rlu_shards

DEFAULT_ROOT = 'gs://rl_unplugged/atari_episodes_ordered'
COPY_CHUNK_BYTES = 16 << 20
_TEMPORARY = re.compile(r'^\.(?P<name>run_\d+-\d{5}-of-\d{5})\.download-\d+$')


@dataclasses.dataclass(frozen=True)
class RemoteShard:
  """A shard in the bucket: its name, checkpoint number, path and size."""

  name: str
  number: int
  path: str
  num_bytes: int


@dataclasses.dataclass
class DownloadResult:
  """What a download did.

  Attributes:
    downloaded: list of shard names copied now.
    skipped: list of shard names already complete.
    bytes: int, bytes copied now.
    seconds: float.
    conversion: dict of what --convert did (converted checkpoints), or None.
  """

  downloaded: list
  skipped: list
  bytes: int
  seconds: float
  conversion: dict = None


def parse_checkpoints(text: str) -> list[int]:
  """'0-49' or '0,3,10-12' -> sorted list of ints.

  Raises:
    ValueError: for anything else.
  """
  numbers = set()
  for item in str(text).split(','):
    item = item.strip()
    match = re.fullmatch(r'(\d+)(?:-(\d+))?', item)
    if not match:
      raise ValueError(f'bad checkpoint range {item!r} (e.g. 0-49 or 0,3,5-7)')
    first = int(match[1])
    last = int(match[2]) if match[2] else first
    if last < first:
      raise ValueError(f'bad checkpoint range {item!r}: {last} < {first}')
    numbers.update(range(first, last + 1))
  return sorted(numbers)


def list_run(root: str, game: str, run: int) -> dict[int, 'RemoteShard']:
  """The shards of a run in the bucket (or its stand-in), by number.

  Raises:
    CheckpointError: naming the directory if it holds no shard of the run.
  """
  shards = rlu_shards.select_run(storage.join(root, game), run)
  return [
    RemoteShard(s.name, s.number, s.path, storage.size(s.path)) for s in shards
  ]


def _remove_temporaries(directory: str) -> None:
  for name in os.listdir(directory):
    if _TEMPORARY.match(name):
      logging.info('Removing %s, left by an interrupted download', name)
      os.remove(os.path.join(directory, name))


def _copy(shard, temporary):
  """Copies a shard to `temporary` with a progress bar; returns bytes."""
  bar = progress.bar(shard.num_bytes, shard.name, unit='B', unit_scale=True)
  copied = 0
  try:
    with storage.open_read(shard.path) as source:
      with open(temporary, 'wb') as target:
        while chunk := source.read(COPY_CHUNK_BYTES):
          target.write(chunk)
          copied += len(chunk)
          bar.update(len(chunk))
        target.flush()
        os.fsync(target.fileno())
  finally:
    bar.close()
  return copied


def verify_shard(path: str, expected_bytes: int | None = None) -> None:
  """Reads a whole shard (every record, to the gzip trailer).

  Raises:
    CheckpointError: naming the file if it is short or damaged.
  """
  size = storage.size(path)
  if expected_bytes is not None and size != expected_bytes:
    raise CheckpointError(
      path, f'{size} bytes, the source has {expected_bytes}: incomplete copy'
    )
  return sum(1 for _ in rlu_shards.read_records(path))


def fetch(shard: 'RemoteShard', directory: str) -> tuple[str, int]:
  """Copies, verifies and renames one shard into `directory`.

  Returns:
    (path, bytes copied): 0 bytes when a complete copy was already there.
  """
  final = os.path.join(directory, shard.name)
  if os.path.exists(final) and os.path.getsize(final) == shard.num_bytes:
    return final, 0
  temporary = os.path.join(directory, f'.{shard.name}.download-{os.getpid()}')
  began = time.perf_counter()
  try:
    copied = _copy(shard, temporary)
    records = verify_shard(temporary, shard.num_bytes)
    os.replace(temporary, final)
  except CheckpointError as error:
    raise CheckpointError(
      shard.path, f'the copy failed its check: {error.problem}'
    ) from error
  finally:
    if os.path.exists(temporary):
      os.remove(temporary)
  seconds = time.perf_counter() - began
  logging.info(
    'Downloaded %s: %d bytes, %d episodes, verified, in %.1f s (%.1f MB/s)',
    shard.name,
    copied,
    records,
    seconds,
    copied / max(seconds, 1e-9) / 1e6,
  )
  return final, copied


def _prepare(root, game, run, checkpoints, destination):
  """(selected shards, destination/<game>/), created, temporaries removed."""
  shards = select(list_run(root, game, run), checkpoints, root, game)
  directory = os.path.join(str(destination), game)
  os.makedirs(directory, exist_ok=True)
  _remove_temporaries(directory)
  return shards, directory


def download_run(
  game: str,
  run: int,
  destination: str,
  checkpoints: Iterable[int] | None = None,
  root: str = DEFAULT_ROOT,
) -> tuple['DownloadResult', list['RemoteShard'], str]:
  """Downloads (the selected checkpoints of) a run; see the module docstring.

  Args:
    game: str, e.g. 'Pong'.
    run: int, 1..5.
    destination: str, local directory; shards go to destination/<game>/.
    checkpoints: optional iterable of shard numbers (default: all).
    root: str, the bucket directory (or a local stand-in).

  Returns:
    (DownloadResult, list of RemoteShard selected, local directory).
  """
  began = time.perf_counter()
  shards, directory = _prepare(root, game, run, checkpoints, destination)
  result = DownloadResult([], [], 0, 0.0)
  for shard in shards:
    _, copied = fetch(shard, directory)
    if copied:
      result.downloaded.append(shard.name)
      result.bytes += copied
    else:
      result.skipped.append(shard.name)
  result.seconds = time.perf_counter() - began
  return result, shards, directory


def select(
  shards: dict[int, 'RemoteShard'],
  checkpoints: Iterable[int] | None,
  root: str,
  game: str,
) -> list['RemoteShard']:
  """The shards numbered in `checkpoints` (all when None)."""
  if checkpoints is None:
    return shards
  by_number = {s.number: s for s in shards}
  missing = sorted(set(checkpoints) - set(by_number))
  if missing:
    raise CheckpointError(
      storage.join(root, game),
      f'has no shard for checkpoint(s) {missing} (it has '
      f'{min(by_number)}..{max(by_number)})',
    )
  return [by_number[n] for n in sorted(set(checkpoints))]


def download_and_convert(
  game: str,
  run: int,
  destination: str,
  store_dir: str,
  checkpoints: Iterable[int] | None = None,
  root: str = DEFAULT_ROOT,
  options: ConvertOptions | None = None,
) -> 'DownloadResult':
  """Fetches, converts and drops the raw shards of a run one by one.

  Args:
    game: str.
    run: int.
    destination: str, raw shards go to destination/<game>/ (temporarily).
    store_dir: str, the converted output.
    checkpoints: optional iterable of shard numbers.
    root: str, the bucket directory or a local stand-in.
    options: ConvertOptions (ConvertOptions() when None).

  Returns:
    DownloadResult with `conversion` set.
  """
  began = time.perf_counter()
  options = options or ConvertOptions()
  shards, directory = _prepare(root, game, run, checkpoints, destination)
  by_name = {shard.name: shard for shard in shards}
  os.makedirs(store_dir, exist_ok=True)
  result = DownloadResult([], [], 0, 0.0, {'converted': []})

  def fetch_all(names) -> None:
    for name in sorted(names):
      _, copied = fetch(by_name[name], directory)
      if copied:
        result.downloaded.append(name)
        result.bytes += copied

  def convert_parts(parts, **kwargs) -> None:
    converted = rlu_convert.convert_rlu(
      directory,
      store_dir,
      kind='rlu',
      options=options,
      workers=0,
      parts=list(parts),
      **kwargs,
    )
    result.conversion['converted'] += converted.converted

  parts = []
  for shard in shards:
    parts.append(rlu_plan.Part(shard.name, shard.number, shard.num_bytes))
    unindexed, _ = rlu_convert.unfinished(directory, store_dir, parts, options)
    if unindexed:  # Converted as its own checkpoint and indexed, one read.
      fetch_all(p.name for p in unindexed)
      convert_parts(unindexed, recheck=False, plan=False)
    _, todo = rlu_convert.unfinished(directory, store_dir, parts, options)
    if todo:  # Checkpoints drawing on several shards.
      fetch_all(set().union(*todo.values()))
      convert_parts(parts, recheck=False)
    if shard.name not in result.downloaded:
      result.skipped.append(shard.name)
    for part in parts:
      path = os.path.join(directory, part.name)
      if os.path.exists(path):
        logging.info('Deleting %s: its checkpoints are converted', part.name)
        os.remove(path)
  # Every stored checkpoint checked once more, against the whole plan.
  convert_parts(parts, recheck=True)
  result.conversion['converted'] = sorted(set(result.conversion['converted']))
  result.seconds = time.perf_counter() - began
  return result
