"""The buffer's exact transitions as a TorchRL replay buffer.

TorchRL users sample offline data from a `TensorDictReplayBuffer` (its
`AtariDQNExperienceReplay` reads the DQN Replay Dataset from the closed
bucket) and train with objectives such as `DQNLoss` that read TorchRL's
transition keys. `FixedReplayDataset` gives them any directory the buffers
read, Dopamine's checkpoints or a compact store, in those terms.

It is composed as TorchRL composes its own datasets, each part choosing one
thing:

* `ReplaySampler` decides which transitions: the buffer's own draw
  (`sample_index_batch`), so sampling is uniform over the valid rows of the
  loaded checkpoints exactly as the buffer's, and seeded by its `seed`;
* `ReplayStorage` decides what a transition holds: the buffer's
  `sample_transition_batch(indices=..., suffixes=...)` for each (checkpoint,
  file row), i.e. Dopamine's transition for that row, under TorchRL's keys;
* the writer is TorchRL's `ImmutableDatasetWriter`: the data is read-only.

A sample's keys, for a batch of B (Dopamine's element in brackets):
`observation` [state], `action` [action, as int64, the dtype TorchRL's
losses index with], `("next", "observation")` [next_state],
`("next", "reward")` [reward], `("next", "done")` and
`("next", "terminated")` [terminal, as bool], all with Dopamine's values;
reward, done and terminated are (B, 1) as TorchRL's environments give them.
With `update_horizon` n > 1 the reward is Dopamine's discounted n-step sum
and the next observation n steps on. `indices` and `suffix` say where each
transition came from (file row and checkpoint), and TorchRL adds `index`,
the pair of them.
"""

import json
import pathlib
from typing import Any

import numpy as np
from tensordict import TensorDict
import torch
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.storages import Storage
from torchrl.data.replay_buffers.writers import ImmutableDatasetWriter

from fixed_replay import batches
from fixed_replay import mixture
from fixed_replay import ranks
from fixed_replay import segments
from fixed_replay import torch_batches


def _read_only(data_dir):
  return RuntimeError(
    f'FixedReplayDataset of {data_dir} is read-only: a fixed replay dataset '
    'is sampled, never written'
  )


def transitions_tensordict(
  named: dict[str, np.ndarray], channels_first: bool
) -> TensorDict:
  """A buffer's named batch under TorchRL's transition keys."""
  tensors = torch_batches.to_tensors(named, channels_first)
  size = len(named['indices'])
  terminal = tensors['terminal'].bool().reshape(size, 1)
  return TensorDict(
    {
      'observation': tensors['state'],
      'action': tensors['action'].long(),
      'next': {
        'observation': tensors['next_state'],
        'reward': tensors['reward'].reshape(size, 1),
        'done': terminal,
        'terminated': terminal.clone(),
      },
      'indices': tensors['indices'],
      'suffix': tensors['suffix'],
      **_mixture_keys(tensors, (size,)),
    },
    batch_size=[size],
  )


def _mixture_keys(tensors, size):
  """A mixture's `game_id` and `run` (B,), spread over `size`."""
  return {
    key: tensors[key].reshape(size[:1] + (1,) * (len(size) - 1)).expand(size)
    for key in (mixture.GAME_ID, mixture.RUN)
    if key in tensors
  }


_STREAM_FILE = 'stream.json'


class _NoState:
  """Nothing to save or load: the data is on disk, the draw is the buffer's."""

  def state_dict(self) -> dict[str, Any]:
    return {}

  def load_state_dict(self, state_dict: dict[str, Any]) -> None:
    del state_dict


class ReplayStorage(Storage):
  """Read-only storage of a buffer's valid transitions.

  An index is a (B, 2) int64 tensor of (checkpoint suffix, file row) pairs,
  as `ReplaySampler` draws them. Its state is the buffer's stream (what the
  sampler draws is the buffer's draw), so `state_dict()` and `dumps` keep
  where the stream is, and a run resumed from them draws what the
  uninterrupted run draws.
  """

  def __init__(self, buffer, channels_first: bool = False):
    """Wraps `buffer`.

    Args:
      buffer: a FixedReplayBuffer (see fixed_replay.batches.open_buffer).
      channels_first: bool, observations as (B, stack, *observation_shape).
    """
    super().__init__(max_size=buffer.num_valid_transitions)
    self.buffer = buffer
    self.channels_first = channels_first

  def get(self, index: Any) -> TensorDict:
    """The transitions at (suffix, row) pairs, Dopamine's for each row.

    Raises:
      ValueError: if a row is not a valid transition of its checkpoint.
    """
    pairs = torch.as_tensor(index, dtype=torch.int64).reshape(-1, 2).numpy()
    batch = self.buffer.sample_transition_batch(
      len(pairs), indices=pairs[:, 1], suffixes=pairs[:, 0]
    )
    named = batches.named(self.buffer, batch)
    return transitions_tensordict(named, self.channels_first)

  def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
    raise _read_only(self.buffer.data_dir)

  def state_dict(self) -> dict[str, Any]:
    return {'stream': self.buffer.state_dict()}

  def load_state_dict(self, state_dict: dict[str, Any]) -> None:
    self.buffer.load_state_dict(state_dict['stream'])

  def dumps(self, path: str) -> None:
    pathlib.Path(path).mkdir(parents=True, exist_ok=True)
    with open(pathlib.Path(path) / _STREAM_FILE, 'w') as f:
      json.dump(self.state_dict(), f)

  def loads(self, path: str) -> None:
    with open(pathlib.Path(path) / _STREAM_FILE) as f:
      self.load_state_dict(json.load(f))

  def __len__(self) -> int:
    return self.buffer.num_valid_transitions

  def _empty(self):
    raise _read_only(self.buffer.data_dir)


class ReplaySampler(_NoState, Sampler):
  """Draws (suffix, row) pairs as the buffer draws its minibatches."""

  def sample(self, storage: ReplayStorage, batch_size: int) -> tuple:
    suffixes, rows = storage.buffer.sample_index_batch(batch_size)
    pairs = np.stack([suffixes.astype(np.int64), rows.astype(np.int64)], -1)
    return torch.from_numpy(pairs), {}

  def _empty(self):
    return

  # Nothing of its own to save: the draw is the buffer's (see its seed).
  def dumps(self, path: str) -> None:
    del path

  def loads(self, path: str) -> None:
    del path


def _as_is(data):
  return data


class _ReadOnlyWriter(ImmutableDatasetWriter):
  def __init__(self, data_dir):
    super().__init__()
    self.WRITING_ERR = str(_read_only(data_dir))


class FixedReplayDataset(TensorDictReplayBuffer):
  """A replay directory as a TorchRL dataset of exact transitions.

  Example:

    dataset = FixedReplayDataset('/data/Pong/1/replay_logs', batch_size=32,
                                 seed=0, channels_first=True)
    td = dataset.sample()  # TensorDict of 32 transitions
    td['observation']      # uint8 (32, 4, 84, 84)
    for td in dataset:     # endless
      ...

  Keys and dtypes: see the module docstring.
  """

  def __init__(
    self,
    data_dir: str,
    batch_size: int = 32,
    channels_first: bool = False,
    rank: int | None = None,
    world_size: int | None = None,
    **buffer_arguments: Any,
  ):
    """Builds (and so checks) the buffer.

    Args:
      data_dir: str, Dopamine checkpoints (local or gs://) or a compact
        store.
      batch_size: int, transitions a sample.
      channels_first: bool, give observations as (B, stack,
        *observation_shape) instead of Dopamine's (B, *observation_shape,
        stack).
      rank, world_size: as fixed_replay.torch.ReplayDataset's: each rank
        of the processes training one model draws its own stream.
      **buffer_arguments: the buffer's arguments (stack_size,
        observation_shape, update_horizon, gamma, seed, replay_capacity,
        subsample, ...).

    Raises:
      CheckpointError, ValueError, TypeError, MemoryError: the buffer's own
        error for a directory it cannot read or arguments it refuses.
    """
    self.data_dir = str(data_dir)
    arguments = dict(buffer_arguments, batch_size=batch_size)
    buffer = batches.open_buffer(
      self.data_dir, ranks.seeded(arguments, rank, world_size)
    )
    super().__init__(
      storage=ReplayStorage(buffer, channels_first),
      sampler=ReplaySampler(),
      writer=_ReadOnlyWriter(self.data_dir),
      # The storage's batches are whole TensorDicts already.
      collate_fn=_as_is,
      batch_size=batch_size,
    )

  @property
  def buffer(self) -> Any:
    """The FixedReplayBuffer sampled."""
    return self._storage.buffer

  def close(self) -> None:
    """Stops the buffer's threads."""
    self.buffer.close()


def segments_tensordict(
  named: dict[str, np.ndarray], channels_first: bool = False
) -> TensorDict:
  """A SegmentSampler batch as a TensorDict of batch size (B, K).

  Keys follow TorchRL's trajectories (time as the second dimension):
  `observation`, `action` (int64), `return_to_go` (B, K, 1), `timestep`
  (int64), `("next", "reward")`, `("next", "done")` and `("next",
  "terminated")` (B, K, 1), `("collector", "mask")` (False on padding, where
  TorchRL's split_trajectories puts its mask), and `indices` and `suffix`,
  where each step came from (and a mixture's `game_id` and `run`).
  """
  tensors = torch_batches.to_tensors(named, channels_first)
  size = tuple(tensors['mask'].shape)
  terminal = tensors['terminal'].bool().unsqueeze(-1)
  return TensorDict(
    {
      'observation': tensors['observation'],
      'action': tensors['action'].long(),
      'return_to_go': tensors['return_to_go'].unsqueeze(-1),
      'timestep': tensors['timestep'].long(),
      'next': {
        'reward': tensors['reward'].unsqueeze(-1),
        'done': terminal,
        'terminated': terminal.clone(),
      },
      'collector': {'mask': tensors['mask']},
      'indices': tensors['indices'],
      'suffix': tensors['suffix'][:, None].expand(size),
      **_mixture_keys(tensors, size),
    },
    batch_size=size,
  )


class _StreamDataset:
  """What the segment and mixture datasets share: a sampler of named arrays
  turned into TensorDicts, its stream's place, and closing it."""

  def __init__(self, sampler, channels_first: bool):
    self.sampler = sampler
    self.channels_first = channels_first

  def state_dict(self) -> dict[str, Any]:
    """The stream's place (the sampler's state_dict), to resume it."""
    return self.sampler.state_dict()

  def load_state_dict(self, state_dict: dict[str, Any]) -> None:
    self.sampler.load_state_dict(state_dict)

  def __iter__(self):
    while True:
      yield self.sample()

  def close(self) -> None:
    self.sampler.close()


class FixedSegmentDataset(_StreamDataset):
  """Segments of a replay directory as TensorDicts with a time dimension.

  Example:
    dataset = FixedSegmentDataset('/data/Pong/1/replay_logs',
                                  segment_length=30, batch_size=128, seed=0)
    td = dataset.sample()  # TensorDict of batch size (128, 30)
    td['return_to_go']     # float32 (128, 30, 1)

  Keys: see segments_tensordict.
  """

  def __init__(
    self,
    data_dir: str,
    channels_first: bool = False,
    rank: int | None = None,
    world_size: int | None = None,
    **sampler_arguments,
  ):
    """Builds the replay.segments.SegmentSampler (its arguments); each rank
    its own stream (as fixed_replay.torch.ReplayDataset's)."""
    super().__init__(
      segments.SegmentSampler(
        data_dir, **ranks.seeded(sampler_arguments, rank, world_size)
      ),
      channels_first,
    )

  def sample(self) -> TensorDict:
    return segments_tensordict(self.sampler.sample(), self.channels_first)


class FixedMixtureDataset(_StreamDataset):
  """Many games and runs (fixed_replay.ReplayMixture) as TensorDicts.

  Example:
    dataset = FixedMixtureDataset('/data', games=['Pong', 'Breakout'],
                                  action_space='full', seed=0)
    td = dataset.sample()  # transitions_tensordict's keys, plus:
    td['game_id']          # int32 (32,), an index into dataset.mixture.games

  With `segment_length`, segments_tensordict's keys instead. Both add
  `game_id` and `run`.
  """

  def __init__(
    self,
    data,
    channels_first: bool = False,
    rank: int | None = None,
    world_size: int | None = None,
    **mixture_arguments,
  ):
    """Builds the ReplayMixture (its arguments); each rank its own stream
    (as fixed_replay.torch.ReplayDataset's)."""
    super().__init__(
      mixture.ReplayMixture(
        data, **ranks.seeded(mixture_arguments, rank, world_size)
      ),
      channels_first,
    )

  @property
  def mixture(self):
    """The ReplayMixture sampled."""
    return self.sampler

  def sample(self) -> TensorDict:
    named = self.sampler.sample()
    if 'mask' in named:
      return segments_tensordict(named, self.channels_first)
    return transitions_tensordict(named, self.channels_first)
