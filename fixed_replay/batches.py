"""Minibatches as named numpy arrays, for training loops outside Dopamine.

PyTorch (fixed_replay/torch.py) and plain JAX (fixed_replay/jax_batches.py)
loops both want the same thing from the library: the buffer that reads a
directory, its exact minibatches as `{element name: array}`, and one seed per
parallel stream. Those three decisions live here, once, with no framework
imported, so the framework modules only convert arrays.
"""

from collections.abc import Iterator
from typing import Any

import numpy as np


def open_buffer(data_dir: str, arguments: dict[str, Any]) -> Any:
  """The buffer that reads `data_dir`, built with `arguments`.

  FixedReplayBuffer reads whatever `data_dir` holds (Dopamine's gzip
  checkpoints, local or gs://, or a compact store). On a store it gets one
  sampling thread unless `sampling_threads` is given: with several, batches
  come out in whichever order the threads finish, so a seed would no longer
  reproduce the stream.

  Args:
    data_dir: str, a directory of Dopamine checkpoints or a compact store.
    arguments: dict of the buffer's keyword arguments.

  Returns:
    The buffer (a FixedReplayBufferBase, built outside gin).

  Raises:
    CheckpointError, ValueError, TypeError, MemoryError: whatever the buffer
      raises for this directory and these arguments.
  """
  # Imported here: it pulls gin and the replay core, and a caller that only
  # derives seeds should not pay for them.
  from fixed_replay.replay import fixed_replay_buffer

  class SeededOrderBuffer(fixed_replay_buffer.FixedReplayBufferBase):
    store_sampling_threads = 1

  # The buffer alone decides what data_dir holds (once).
  return SeededOrderBuffer(data_dir, **arguments)


def named(buffer: Any, batch: tuple) -> dict[str, np.ndarray]:
  """A buffer's batch tuple as {element name: array}, in Dopamine's order."""
  elements = buffer.get_transition_elements(len(batch[0]))
  return {e.name: array for e, array in zip(elements, batch, strict=True)}


def repeated(sample, num_batches: int | None = None) -> Iterator[dict]:
  """Yields `num_batches` (None: endless) results of `sample()`."""
  count = 0
  while num_batches is None or count < num_batches:
    yield sample()
    count += 1


def sample(buffer, num_batches: int | None = None) -> Iterator[dict]:
  """Yields `num_batches` (None: endless) minibatches of `buffer`, named."""
  return repeated(
    lambda: named(buffer, buffer.sample_transition_batch()), num_batches
  )


def stream_seed(seed: int, *stream: int) -> int:
  """The buffer seed of parallel stream `stream` of a run seeded `seed`.

  Spawned from one SeedSequence, so streams are statistically independent
  (no two repeat each other) and stream k is the same whatever the number
  of streams. A stream is one number or several (a worker and its pass).
  """
  sequence = np.random.SeedSequence(seed, spawn_key=tuple(map(int, stream)))
  return int(sequence.generate_state(1, np.uint64)[0])


def stream_share(num_batches: int | None, stream: int, num_streams: int):
  """Batches stream `stream` of `num_streams` yields out of `num_batches`."""
  if num_batches is None:
    return None
  return num_batches // num_streams + (stream < num_batches % num_streams)
