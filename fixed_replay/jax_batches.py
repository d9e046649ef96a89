"""The buffer's exact minibatches on a JAX device, placed ahead of use.

For Flax/Optax training loops that are not Dopamine agents. A jitted update
step returns before it has finished computing, so the loop can already send
the next minibatch to the device: `jax.device_put` is asynchronous, and with
`depth` batches in flight the transfer of batch t+1 overlaps the update on
batch t. `ReplayBatches` does that over any directory the buffers read;
`prefetch_to_device` does it over any iterator of numpy dicts.

Batches are the buffer's own (`sample_transition_batch`), so a seed gives
the stream the buffer gives, transition for transition Dopamine's.
"""

import collections
from collections.abc import Iterable
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from fixed_replay import batches
from fixed_replay import ranks


def prefetch_to_device(
  iterable: Iterable[dict[str, np.ndarray]],
  depth: int = 2,
  device: Any = None,
) -> Iterator[dict[str, jax.Array]]:
  """Yields the items of `iterable` placed on `device`, `depth` ahead.

  Args:
    iterable: dicts of numpy arrays.
    depth: int >= 1, batches sent to the device before the one in use is
      handed out (2 double-buffers).
    device: jax.Device or Sharding (None: the default device).

  Yields:
    dict of jax.Array, in the order of `iterable`.

  Raises:
    ValueError: if depth < 1.
  """
  if depth < 1:
    raise ValueError(f'depth must be at least 1, got {depth}')
  in_flight = collections.deque()
  for batch in iterable:
    placed = jax.device_put(batch, device)
    # device_put returns a dict sorted by key; keep Dopamine's order.
    in_flight.append({name: placed[name] for name in batch})
    if len(in_flight) > depth:
      yield in_flight.popleft()
  while in_flight:
    yield in_flight.popleft()


class ReplayBatches:
  """Minibatches of a replay directory as dicts of jax.Arrays on a device.

  Example:

    replay = ReplayBatches('/data/Pong/1/replay_logs', batch_size=32, seed=0)
    for step, batch in zip(range(num_updates), replay):
      state = train_step(state, batch['state'], batch['action'], ...)

  Keys are Dopamine's element names, as in fixed_replay.torch.ReplayDataset.
  """

  def __init__(
    self,
    data_dir: str,
    depth: int = 2,
    device: Any = None,
    num_batches: int | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    **buffer_arguments: Any,
  ):
    """Builds the buffer (so a bad path or argument fails here).

    Args:
      data_dir: str, Dopamine checkpoints (local or gs://) or a compact
        store.
      depth: int >= 1, batches placed on the device ahead of use.
      device: jax.Device or Sharding (None: the default device).
      num_batches: int or None, minibatches per iteration (None: endless).
      rank, world_size: ints or None, this process's place among those
        training one model (None: `jax.process_index()` and
        `jax.process_count()` once jax.distributed is initialised, else 0
        of 1); each rank draws its own stream of the seed, batch_size
        transitions of the global batch (ranks.py).
      **buffer_arguments: the buffer's arguments (batch_size, stack_size,
        seed, ...).

    Raises:
      CheckpointError, ValueError, TypeError, MemoryError: the buffer's own
        error.
    """
    if depth < 1:
      raise ValueError(f'depth must be at least 1, got {depth}')
    self.data_dir = str(data_dir)
    self.depth = depth
    self.device = device
    self.num_batches = num_batches
    self.buffer = batches.open_buffer(
      self.data_dir, ranks.seeded(buffer_arguments, rank, world_size)
    )
    self._place = None  # The stream's after the last batch handed out.

  def __iter__(self) -> Iterator[dict[str, jax.Array]]:
    # Batches go to the device `depth` ahead: the stream's place is the one
    # after the batch handed out, not after the last one drawn.
    places = collections.deque()

    ordered = self.buffer.sampling_threads <= 1  # Else it has no place.

    def drawn():
      for named in batches.sample(self.buffer, self.num_batches):
        places.append(self.buffer.state_dict() if ordered else None)
        yield named

    for batch in prefetch_to_device(drawn(), self.depth, self.device):
      self._place = places.popleft()
      yield batch

  def state_dict(self) -> dict[str, Any]:
    """The stream's place after the last batch handed out, as plain numbers
    (lists of ints an Orbax checkpoint holds); see ReplayCore.state_dict."""
    return self._place or self.buffer.state_dict()

  def load_state_dict(self, state: dict[str, Any]) -> None:
    """Goes on from the place `state_dict()` gave (before iterating)."""
    self.buffer.load_state_dict(state)
    self._place = None

  def close(self) -> None:
    """Stops the buffer's threads."""
    self.buffer.close()
