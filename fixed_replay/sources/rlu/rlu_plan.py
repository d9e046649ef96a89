"""Which episodes make each checkpoint of an RL Unplugged run.

Every record names its checkpoint (`checkpoint_idx`). Normally shard NNNNN
holds exactly checkpoint NNNNN's episodes, in order, but the format does not
promise it. So each part (a shard, or a TFDS split) is indexed when it is
first read in full: part, record, checkpoint, episode and steps of each
record. The index is kept in the store (`.fixed_replay/rlu_index/<part>.json`,
valid while the part keeps its size), and every checkpoint is planned from
the indexes of all parts: its episodes in episode_idx order, wherever they
are. A converted checkpoint's manifest records what it was made from
(`describe`), so a rerun can tell a finished checkpoint from one converted
before all its parts were known.
"""

from collections.abc import Iterable
from collections.abc import Sequence
import dataclasses
import json
import os
import zlib

import numpy as np

from fixed_replay.errors import CheckpointError
from fixed_replay.io import files as storage
from fixed_replay.sources.rlu import rlu_episodes

INDEX_DIR = os.path.join('.fixed_replay', 'rlu_index')
_FORMAT = 'fixed_replay.rlu_index'
_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Part:
  """A unit read as a whole: a shard file or a TFDS split.

  Attributes:
    name: str, file or split name.
    number: int, the checkpoint it is named after (NNNNN, checkpoint_NN).
    num_bytes: int, its size.
  """

  name: str
  number: int
  num_bytes: int


@dataclasses.dataclass(frozen=True)
class Entry:
  """One record of a part, as indexed."""

  part: str
  record: int
  checkpoint_idx: int
  episode_idx: int
  num_steps: int


def entry_of(part: Part, episode: rlu_episodes.Episode) -> Entry:
  """The index entry of an rlu_episodes.Episode read from `part` (a Part)."""
  return Entry(
    part.name,
    episode.record,
    episode.checkpoint_idx,
    episode.episode_idx,
    episode.num_steps,
  )


def index_path(store_dir: str, part: Part) -> str:
  return os.path.join(store_dir, INDEX_DIR, f'{part.name}.json')


def write_index(store_dir: str, part: Part, entries: Sequence[Entry]) -> None:
  """Writes a part's index atomically (temporary name, then rename)."""
  path = index_path(store_dir, part)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  data = {
    'format': _FORMAT,
    'version': _VERSION,
    'part': part.name,
    'bytes': part.num_bytes,
    'records': [
      [e.record, e.checkpoint_idx, e.episode_idx, e.num_steps] for e in entries
    ],
  }
  temporary = f'{path}.tmp-{os.getpid()}'
  with open(temporary, 'w') as stream:
    json.dump(data, stream, separators=(',', ':'))
    stream.flush()
    os.fsync(stream.fileno())
  os.replace(temporary, path)


def remove_temporaries(store_dir: str) -> None:
  """Deletes index files an interrupted conversion left half written."""
  directory = os.path.join(store_dir, INDEX_DIR)
  if os.path.isdir(directory):
    for name in os.listdir(directory):
      if '.json.tmp-' in name:
        os.remove(os.path.join(directory, name))


def read_index(store_dir: str, part: Part) -> list[Entry] | None:
  """Returns a part's index entries, or None if not indexed at this size."""
  path = index_path(store_dir, part)
  try:
    with open(path) as stream:
      data = json.load(stream)
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as error:
    raise CheckpointError(path, f'unreadable index: {error}') from error
  if data.get('format') != _FORMAT or data.get('version') != _VERSION:
    raise CheckpointError(path, 'not an index this version writes')
  if data['part'] != part.name or data['bytes'] != part.num_bytes:
    return None
  return [Entry(part.name, *record) for record in data['records']]


def check_unique(entries: Iterable[Entry], location: str) -> None:
  """Raises if an episode_idx appears twice among `entries`."""
  seen = {}
  for entry in entries:
    first = seen.setdefault(entry.episode_idx, entry)
    if first is not entry:
      raise CheckpointError(
        storage.join(location, entry.part),
        f'episode {entry.episode_idx} of checkpoint {entry.checkpoint_idx} '
        f'(record {entry.record}) duplicates episode_idx '
        f'{first.episode_idx} of record {first.record} of {first.part}',
      )


def checkpoints_of(
  indexes: dict[str, list[Entry]], location: str
) -> dict[int, list[Entry]]:
  """Groups indexed episodes by checkpoint, in episode_idx order.

  Args:
    indexes: dict of part name to its entries.
    location: str, where the parts are (for messages).

  Returns:
    dict of checkpoint_idx to its entries sorted by episode_idx, in
    checkpoint order.

  Raises:
    CheckpointError: naming a part and the episode if an episode_idx
      appears twice in the run.
  """
  entries = [e for part in sorted(indexes) for e in indexes[part]]
  check_unique(entries, location)
  grouped = {}
  for entry in sorted(entries, key=lambda e: e.episode_idx):
    grouped.setdefault(entry.checkpoint_idx, []).append(entry)
  return dict(sorted(grouped.items()))


def describe(entries: Sequence[Entry], part_bytes: dict[str, int]) -> dict:
  """What a checkpoint is made of, as its manifest records it.

  Args:
    entries: its Entries in episode_idx order.
    part_bytes: dict of part name to size (at least those of the entries).

  Returns:
    dict: the parts read with their sizes, the number of episodes, the
    first and last episode_idx, a CRC-32 of all of them, and the steps.
  """
  ids = np.array([e.episode_idx for e in entries], dtype='<i8')
  parts = sorted({e.part for e in entries})
  return {
    'files': {name: part_bytes[name] for name in parts},
    'episodes': len(entries),
    'first_episode': int(ids[0]) if len(ids) else None,
    'last_episode': int(ids[-1]) if len(ids) else None,
    'episodes_crc32': zlib.crc32(ids.tobytes()),
    'steps': int(sum(e.num_steps for e in entries)),
  }


def expected_rows(entries: Sequence[Entry], stack_size: int) -> int:
  """Rows of the converted checkpoint: padding, steps, one zero row."""
  return sum(e.num_steps + stack_size - 1 for e in entries) + 1


def superseded(stored: dict | None, wanted: dict) -> bool:
  """Whether a stored checkpoint was made from a subset of today's parts.

  That happens when a checkpoint was converted from its own shard before
  another shard turned out to hold some of its episodes: the same files,
  still the same sizes, but not all of them. Then it is converted again;
  any other difference (a part of another size) is an error for the caller.
  """
  if stored == wanted or 'files' not in stored:
    return False
  return all(
    wanted['files'].get(name) == size for name, size in stored['files'].items()
  )
