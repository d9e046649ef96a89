"""Dopamine's replay checkpoint file names: `{name}_ckpt.{suffix}.gz`.

`OutOfGraphReplayBuffer.save` writes one file per array: the `$store$_`
arrays (observation, action, reward, terminal, plus any extra storage
elements), `add_count`, `invalid_range` and, from newer Dopamine,
`episode_end_indices`. Every module that lists, reads or writes such files
takes the names from here.
"""

import dataclasses
import re

from fixed_replay.io import files as storage

STORE_PREFIX = '$store$_'
REQUIRED_STORE_ELEMENTS = ('observation', 'action', 'reward', 'terminal')
REQUIRED_EXTRA_FILES = ('add_count', 'invalid_range')
EPISODE_END_INDICES = 'episode_end_indices'
# Extra storage elements that conversions of RL Unplugged data write
# (episode_rows.py): the game's reward before clipping, and the episode of
# each row. An agent asks for one as Dopamine does, with
# `extra_storage_types=[ReplayElement('unclipped_reward', (), np.float32)]`.
UNCLIPPED_REWARD = 'unclipped_reward'
EPISODE_IDX = 'episode_idx'
# `name` is the array ('$store$_observation', 'add_count', ...).
FILE_PATTERN = re.compile(r'^(?P<name>.+)_ckpt\.(?P<suffix>\d+)\.gz$')


def file_name(name: str, suffix: int) -> str:
  """Returns Dopamine's file name of array `name` of checkpoint `suffix`."""
  return f'{name}_ckpt.{suffix}.gz'


def checkpoint_filename(directory: str, name: str, suffix: int) -> str:
  """Returns the path Dopamine uses for array `name` of checkpoint suffix."""
  return storage.join(directory, file_name(name, suffix))


def parse(entry: str) -> tuple[str, int] | None:
  """Returns (name, suffix) of a checkpoint file name, or None."""
  match = FILE_PATTERN.match(entry)
  return (match['name'], int(match['suffix'])) if match else None


@dataclasses.dataclass(frozen=True)
class CheckpointFiles:
  """The files of one checkpoint suffix.

  Attributes:
    directory: str, where the files are.
    suffix: int.
    store_paths: dict of storage element name ('observation', ...) to path.
    add_count_path: str.
    invalid_range_path: str.
    episode_end_indices_path: str or None when absent (published dataset).
  """

  directory: str
  suffix: int
  store_paths: dict
  add_count_path: str
  invalid_range_path: str
  episode_end_indices_path: str = None

  def all_paths(self) -> list[str]:
    """Returns every file path of this checkpoint."""
    paths = list(self.store_paths.values())
    paths += [self.add_count_path, self.invalid_range_path]
    if self.episode_end_indices_path:
      paths.append(self.episode_end_indices_path)
    return paths
