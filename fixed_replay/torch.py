"""The buffer's exact minibatches as a PyTorch IterableDataset.

PyTorch offline-RL code (CleanRL-style scripts, d3rlpy, TorchRL loops) reads
data through `torch.utils.data.DataLoader`. `ReplayDataset` puts any
directory the buffers read (Dopamine checkpoints or a compact store) behind
that interface without changing what is sampled: every item is one minibatch
the buffer itself drew, so transitions are Dopamine's bit for bit.

Why it is built the way it is:

* Each item is a whole minibatch (use `DataLoader(dataset, batch_size=None)`):
  the buffer draws and gathers a minibatch in one vectorized pass; letting
  the loader collate single transitions would be ~100x slower.
* The buffer is built once in the training process when the dataset is
  created, so a bad path or argument fails there with the buffer's own
  error, and that buffer serves `num_workers=0`. Each DataLoader worker builds
  its own buffer (threads and file handles do not survive a fork) seeded
  from the dataset seed and its worker id, so workers never repeat each other
  and a seed reproduces the whole stream for a given number of workers.
* A worker that fails raises a `RuntimeError` naming the data, the worker and
  the buffer's own error; DataLoader re-raises it in the training process.

This module imports torch; the rest of the library never imports it.
"""

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils import data

from fixed_replay import batches


def _to_tensors(named, channels_first):
  tensors = {}
  for name, array in named.items():
    if channels_first and name in ('state', 'next_state'):
      # Dopamine stacks frames last (B, H, W, stack); convolutions in
      # PyTorch want the stack as channels (B, stack, H, W).
      array = np.ascontiguousarray(np.moveaxis(array, -1, 1))
    tensors[name] = torch.from_numpy(array)
  return tensors


class ReplayDataset(data.IterableDataset):
  """Minibatches of a replay directory, as dicts of tensors.

  Example:

    dataset = ReplayDataset('/data/Pong/1/replay_logs', batch_size=32,
                            seed=0, channels_first=True)
    loader = DataLoader(dataset, batch_size=None, num_workers=2,
                        pin_memory=True)
    for batch in loader:  # endless unless num_batches is given
      batch['state']  # uint8 (32, 4, 84, 84)

  Items hold Dopamine's elements under its names (`state`, `action`,
  `reward`, `next_state`, `next_action`, `next_reward`, `terminal`,
  `indices`, any extra storage element, then `suffix`: the checkpoint of
  each transition), with the buffer's dtypes.
  """

  def __init__(
    self,
    data_dir: str,
    channels_first: bool = False,
    num_batches: int | None = None,
    reload_every: int | None = None,
    **buffer_arguments: Any,
  ):
    """Builds (and so checks) the buffer in this process.

    Args:
      data_dir: str, Dopamine checkpoints (local or gs://) or a compact
        store.
      channels_first: bool, give `state` and `next_state` as (B, stack,
        *observation_shape) instead of Dopamine's (B, *observation_shape,
        stack).
      num_batches: int or None, minibatches per pass over the loader, shared
        among its workers (None: endless).
      reload_every: int or None, call the buffer's `reload_buffer()` after
        this many minibatches of each stream (FixedReplayBuffer then swaps
        in another set of checkpoints, as Dopamine's runner does once an
        iteration); None never reloads.
      **buffer_arguments: the buffer's arguments (batch_size, stack_size,
        observation_shape, update_horizon, gamma, seed, replay_capacity,
        subsample, ...). With `seed=None` the workers take torch's seeds
        (set by torch.manual_seed).

    Raises:
      CheckpointError, ValueError, TypeError, MemoryError: the buffer's own
        error for a directory it cannot read or arguments it refuses.
    """
    super().__init__()
    if num_batches is not None and num_batches < 0:
      raise ValueError(f'num_batches must be >= 0, got {num_batches}')
    if reload_every is not None and reload_every < 1:
      raise ValueError(f'reload_every must be >= 1, got {reload_every}')
    self.data_dir = str(data_dir)
    self.channels_first = bool(channels_first)
    self.num_batches = num_batches
    self.reload_every = reload_every
    self.buffer_arguments = dict(buffer_arguments)
    self.seed = self.buffer_arguments.get('seed')
    self._buffer = batches.open_buffer(self.data_dir, self.buffer_arguments)

  @property
  def buffer(self):
    """The buffer built in this process (serves num_workers=0)."""
    if self._buffer is None:
      raise RuntimeError(f'ReplayDataset of {self.data_dir} is closed')
    return self._buffer

  def worker_seed(self, worker_id: int, torch_seed: int | None = None):
    """The buffer seed of DataLoader worker `worker_id`.

    Args:
      worker_id: int.
      torch_seed: int or None, the worker's torch seed
        (`get_worker_info().seed`), used when the dataset has no seed.

    Returns:
      int.
    """
    if self.seed is None:
      return int(torch_seed) % 2**63 if torch_seed is not None else None
    return batches.stream_seed(self.seed, worker_id)

  def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
    info = data.get_worker_info()
    if info is None:
      return self._stream(self.buffer, self.num_batches)
    return self._worker_stream(info)

  def _stream(self, buffer, num_batches):
    count = 0
    for named in batches.sample(buffer, num_batches):
      yield _to_tensors(named, self.channels_first)
      count += 1
      if self.reload_every and count % self.reload_every == 0:
        buffer.reload_buffer()

  def _worker_stream(self, info):
    share = batches.stream_share(self.num_batches, info.id, info.num_workers)
    arguments = dict(
      self.buffer_arguments, seed=self.worker_seed(info.id, info.seed)
    )
    buffer = None
    try:
      buffer = batches.open_buffer(self.data_dir, arguments)
      yield from self._stream(buffer, share)
    except Exception as error:
      # DataLoader re-raises this in the training process, where the user
      # needs to know which data failed and why, not only the traceback.
      raise RuntimeError(
        f'DataLoader worker {info.id} of {info.num_workers} reading '
        f'{self.data_dir} failed: {type(error).__name__}: {error}'
      ) from error
    finally:
      if buffer is not None:
        buffer.close()

  def close(self):
    """Releases the buffer built in this process (and its threads)."""
    if self._buffer is not None:
      self._buffer.close()
      self._buffer = None

  def __getstate__(self):
    # A spawned worker builds its own buffer; this one does not travel.
    state = self.__dict__.copy()
    state['_buffer'] = None
    return state
