"""RL Unplugged's TFDS-prepared form: `rlu_atari_checkpoints_ordered`.

`tfds.builder('rlu_atari_checkpoints_ordered/<Game>_run_<r>')` prepares the
raw shards as one split per checkpoint (`checkpoint_00` ...), episodes in
order, in array_record files. This module reads such a prepared directory
with tensorflow-datasets, from local files, without Beam or network:
`builder_from_directory` and its ArrayRecord data source (random access to
each episode, deserialized by TFDS; images left encoded so that we decode
them in slices). A dataset prepared as tfrecord is refused with a message.

TFDS' preparation (`atari_utils.atari_example_to_rlds`) keeps every action
and reward as stored, sets `is_terminal` on the last step when its raw
discount was 0, and shifts the discounts; so terminal = is_terminal and
the rows are the raw shards' (rlu_shards.py). `reward` is read from the raw
`unclipped_rewards`: kept as it is as the episode's unclipped rewards (the
extra element `unclipped_reward`), and clipped to [-1, 1] as the reward,
as Dopamine's logger did.
"""

from collections.abc import Collection
from collections.abc import Iterator
import dataclasses
import json
import re
from typing import Any

import numpy as np

from fixed_replay import compat
from fixed_replay.errors import CheckpointError
from fixed_replay.io import files as storage
from fixed_replay.sources.rlu import rlu_episodes

DATASET = 'rlu_atari_checkpoints_ordered'
_SPLIT = re.compile(r'^checkpoint_(?P<number>\d+)$')
_INFO = 'dataset_info.json'


@dataclasses.dataclass(frozen=True)
class Split:
  """One split (checkpoint) of a prepared dataset.

  Attributes:
    name: str, e.g. 'checkpoint_07'.
    number: int, the checkpoint it is named after.
    num_episodes: int.
    num_bytes: int, size of its files.
  """

  name: str
  number: int
  num_episodes: int
  num_bytes: int


def _is_version_dir(path: str):
  return storage.exists(storage.join(path, _INFO))


def find_dataset_dir(path: str) -> str:
  """Returns the version directory of a prepared dataset under `path`.

  `path` may be the version directory (holding dataset_info.json), the
  config directory (`<Game>_run_<r>`), the dataset directory or the TFDS
  data_dir; below it exactly one prepared config must be found.

  Raises:
    CheckpointError: if none or several are found.
  """
  path = str(path).rstrip('/')
  if _is_version_dir(path):
    return path
  found = []
  frontier = [path]
  for _ in range(3):
    children = []
    for directory in frontier:
      if not storage.isdir(directory):
        continue
      for name in sorted(storage.listdir(directory)):
        child = storage.join(directory, name)
        if name.startswith('.') or not storage.isdir(child):
          continue
        if _is_version_dir(child):
          found.append(child)
        else:
          children.append(child)
    if found:
      break
    frontier = children
  if not found:
    raise CheckpointError(
      path, f'no prepared TFDS dataset ({_INFO}) in it or below'
    )
  if len(found) > 1:
    raise CheckpointError(
      path, f'holds several prepared datasets: {found}; name one of them'
    )
  return found[0]


def is_prepared_dataset(path: str) -> bool:
  """Whether `path` looks like a TFDS-prepared rlu dataset (cheap check)."""
  try:
    directory = find_dataset_dir(path)
  except CheckpointError:
    return False
  with storage.open_read(storage.join(directory, _INFO)) as stream:
    return json.load(stream).get('name') == DATASET


def _import_tfds():
  return compat.require(
    'tensorflow_datasets',
    'tensorflow-datasets',
    purpose='TFDS-prepared RL Unplugged (--source=tfds)',
    extra='tfds',
  )


def _builder(dataset_dir):
  tfds = _import_tfds()
  builder = tfds.builder_from_directory(dataset_dir)
  if builder.info.name != DATASET:
    raise CheckpointError(
      dataset_dir, f'is {builder.info.name!r}, not {DATASET!r}'
    )
  return builder


def find_splits(dataset_dir: str) -> list[Any]:
  """Returns the checkpoint splits of a prepared dataset, in order.

  Raises:
    CheckpointError: if it is not rlu_atari_checkpoints_ordered or has no
      checkpoint split.
  """
  builder = _builder(dataset_dir)
  splits = []
  for name, info in builder.info.splits.items():
    match = _SPLIT.match(name)
    if not match:
      continue
    paths = [str(p) for p in info.filepaths]
    missing = [p for p in paths if not storage.exists(p)]
    if missing:
      raise CheckpointError(missing[0], f'missing: a file of split {name}')
    splits.append(
      Split(
        name=name,
        number=int(match['number']),
        num_episodes=info.num_examples,
        num_bytes=sum(storage.size(p) for p in paths),
      )
    )
  if not splits:
    raise CheckpointError(dataset_dir, 'has no checkpoint_NN split')
  return sorted(splits, key=lambda s: s.number)


def _flat(example, key, kind: str, label, record):
  features = example.features.feature
  if key not in features:
    raise CheckpointError(label, f'episode record {record} has no {key}')
  feature = features[key]
  if feature.WhichOneof('kind') not in (kind, None):
    raise CheckpointError(
      label, f'episode record {record}: {key} is not a {kind}'
    )
  return getattr(feature, kind).value


def episode_from_example(
  example: Any, label: str, record: int
) -> rlu_episodes.Episode:
  """Validates one deserialized (not decoded) TFDS episode.

  Args:
    example: tf.train.Example as TFDS stores it (nested features flattened
      into 'steps/<name>' keys).
    label: str, names the split for messages.
    record: int, the episode's position in the split.

  Returns:
    rlu_episodes.Episode.

  Raises:
    CheckpointError: as rlu_episodes.parse_episode does.
  """
  checkpoint_idx, episode_idx = (
    int(_flat(example, key, 'int64_list', label, record)[0])
    for key in ('checkpoint_id', 'episode_id')
  )
  rlu_episodes.check_checkpoint_idx(label, record, checkpoint_idx, episode_idx)
  kinds = {
    'observation': 'bytes_list',
    'action': 'int64_list',
    'reward': 'float_list',
    'is_terminal': 'int64_list',
    'is_last': 'int64_list',
  }
  steps = {
    key: _flat(example, f'steps/{key}', kind, label, record)
    for key, kind in kinds.items()
  }
  where = f'episode {episode_idx} of checkpoint {checkpoint_idx} (record '
  where += f'{record})'
  lengths = {key: len(values) for key, values in steps.items()}
  if len(set(lengths.values())) > 1:
    raise CheckpointError(label, f'{where}: steps of unequal length {lengths}')
  is_terminal = np.asarray(steps['is_terminal'], bool)
  unclipped = np.asarray(steps['reward'], np.float32)
  episode = rlu_episodes.Episode(
    shard=label,
    record=record,
    checkpoint_idx=checkpoint_idx,
    episode_idx=episode_idx,
    frames=steps['observation'],
    actions=rlu_episodes.check_actions(label, where, steps['action']),
    rewards=np.clip(unclipped, -1, 1),
    terminal=bool(len(is_terminal)) and bool(is_terminal[-1]),
    unclipped_rewards=unclipped,
  )
  rlu_episodes.check_steps(episode, is_terminal)
  return episode


def iter_episodes(
  dataset_dir: str, split: str, wanted: Collection[int] | None = None
) -> Iterator[rlu_episodes.Episode]:
  """Yields the validated Episodes of one split, in order.

  Args:
    dataset_dir: str, the prepared dataset's version directory.
    split: str, e.g. 'checkpoint_07'.
    wanted: optional set of record positions to yield (others skipped).
  """
  tfds = _import_tfds()
  builder = _builder(dataset_dir)
  label = f'{dataset_dir}[{split}]'
  file_format = builder.info.file_format
  file_format = str(getattr(file_format, 'value', file_format))
  if file_format != 'array_record':
    raise CheckpointError(
      dataset_dir,
      f'prepared as {file_format}: fixed-replay reads the array_record form '
      "TFDS publishes (prepare with file_format='array_record'), or convert "
      'the raw shards with --source=rlu',
    )
  source = builder.as_data_source(
    split=split,
    deserialize_method=tfds.decode.DeserializeMethod.DESERIALIZE_NO_DECODE,
  )
  records = range(len(source))
  if wanted is not None:
    records = sorted(set(wanted) & set(records))
  for record in records:
    yield episode_from_example(source[record], label, record)
