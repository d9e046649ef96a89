"""The buffer's exact minibatches as a PyTorch IterableDataset.

PyTorch offline-RL code (CleanRL-style scripts, d3rlpy, TorchRL loops) reads
data through `torch.utils.data.DataLoader`. `ReplayDataset` puts any
directory the buffers read (Dopamine checkpoints or a compact store) behind
that interface without changing what is sampled: every item is one minibatch
the buffer itself drew, so transitions are Dopamine's bit for bit.

Why it is built the way it is:

* Each item is a whole minibatch (use `DataLoader(dataset, batch_size=None)`):
  the buffer draws and gathers a minibatch in one vectorized pass; letting
  the loader collate single transitions would be ~100x slower. A DataLoader
  left to collate items raises a TypeError saying so, instead of adding a
  dimension.
* The buffer is built once in the training process when the dataset is
  created, so a bad path or argument fails there with the buffer's own
  error, and that buffer serves `num_workers=0`. Each DataLoader worker builds
  its own buffer (threads and file handles do not survive a fork) seeded
  from the dataset seed and its worker id, so workers never repeat each other
  and a seed reproduces the whole stream for a given number of workers.
* A worker that fails raises a `RuntimeError` naming the data, the worker and
  the buffer's own error; DataLoader re-raises it in the training process.
* How a worker's batch reaches the training process (shared-memory slots)
  is torch_batches.py's.

This module imports torch; the rest of the library never imports it.
"""

from collections.abc import Iterator
import contextlib
import dataclasses
import os
import tempfile
from typing import Any
import weakref

from absl import logging
import torch
from torch.utils import data

from fixed_replay import batches
from fixed_replay import mixture
from fixed_replay import ranks
from fixed_replay import segments
from fixed_replay import torch_batches
from fixed_replay.replay import fixed_replay_buffer

# Pass-count slots a rank (DataLoader workers of one process at most).
_WORKERS = 4096


def _remove_made_here(pid, path):
  # A forked worker inherits the finalizer: only the maker removes the file.
  if os.getpid() == pid:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(path)


class _PassCounts:
  """How many passes each DataLoader worker of a dataset has begun.

  A worker that is not persistent is a new process every pass, holding the
  dataset as it was built; it learns its pass number here, so that each pass
  draws a new stream of the seed (and a rerun the same ones). One 8-byte
  count a worker, in a file named by its path (the dataset pickles
  anywhere); the process that made it removes it.
  """

  def __init__(self):
    try:
      descriptor, self.path = tempfile.mkstemp(
        '_passes', 'fixed_replay_', torch_batches.SHARED_DIR
      )
    except OSError:  # No /dev/shm to write in: the temporary directory.
      descriptor, self.path = tempfile.mkstemp('_passes', 'fixed_replay_')
    os.close(descriptor)
    weakref.finalize(self, _remove_made_here, os.getpid(), self.path)

  def count(self, worker: int, passes: int | None = None) -> int:
    """The passes `worker` has begun; with `passes`, sets them first."""
    try:
      descriptor = os.open(self.path, os.O_RDWR)
    except FileNotFoundError:  # Another host's copy of the dataset.
      logging.log_first_n(
        logging.WARNING,
        'No pass count at %s (a dataset from another host, or its maker is '
        'gone): new workers draw their first pass again',
        1,
        self.path,
      )
      return passes or 0
    try:  # Past the end of the file, a count reads as 0.
      if passes is not None:
        os.pwrite(descriptor, int(passes).to_bytes(8, 'little'), 8 * worker)
      return int.from_bytes(os.pread(descriptor, 8, 8 * worker), 'little')
    finally:
      os.close(descriptor)


@dataclasses.dataclass
class _Source:
  """What samples one process's stream of a dataset, and how far it is."""

  sampler: Any
  worker: int | None  # None: the training process's own.
  num_workers: int = 1
  pass_number: int = 0
  yielded: int = 0  # Batches of this pass.
  drawn: int = 0  # Batches drawn, every pass.


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

  Every pass over a loader draws new batches: with no workers or persistent
  ones, each stream goes on where the last pass left it; a worker that is
  not persistent draws pass p's own stream of the seed. A rerun with the
  same seed repeats every pass. Under torchdata's StatefulDataLoader the
  loader's `state_dict()` holds each stream's place, and a run resumed from
  it draws exactly what the uninterrupted run draws.
  """

  def __init__(
    self,
    data_dir: str,
    channels_first: bool = False,
    num_batches: int | None = None,
    reload_every: int | None = None,
    rank: int | None = None,
    world_size: int | None = None,
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
        every this many minibatches of the loader, whatever its workers
        (FixedReplayBuffer then swaps in another set of checkpoints, as
        Dopamine's runner does once an iteration); None never reloads.
      rank, world_size: ints or None, this process's data-parallel place
        among those training one model (under tensor or pipeline
        parallelism, its data-parallel group's rank and size). None: found
        when each pass starts (ranks.current: torch.distributed's or JAX's
        once initialised, else torchrun's RANK and WORLD_SIZE), so a
        dataset built before `init_process_group` still takes its rank.
        Each rank, and each of its workers, draws its own stream of the
        seed (ranks.rank_seed); batch_size is the rank's share of the
        global batch.
      **buffer_arguments: the buffer's arguments (batch_size, stack_size,
        observation_shape, update_horizon, gamma, seed, replay_capacity,
        subsample, ...). With `seed=None` the seed is drawn once, here, from
        torch's generator (`torch.manual_seed(s)` before building the
        dataset repeats the run, with or without workers); several ranks
        must pass one.

    Raises:
      CheckpointError, ValueError, TypeError, MemoryError: the buffer's own
        error for a directory it cannot read or arguments it refuses.
      ValueError: for seed=None on one of several ranks.
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
    self._given_place = None if rank is None else (rank, world_size)
    self._found_place = None  # Where the loader started a spawned worker.
    self.rank, self.world_size = ranks.current(rank, world_size)
    self._seed_given = buffer_arguments.get('seed') is not None
    if not self._seed_given:
      ranks.require_seed(None, self.rank, self.world_size)
      seed = int(torch.randint(2**62, ()).item())
      buffer_arguments = {**buffer_arguments, 'seed': seed}
    self._arguments = buffer_arguments
    self._seed_for_place()
    self._passes = _PassCounts()
    self._closed = False
    self._resumed = None  # A state to go on from (load_state_dict).
    self._source = _Source(self._open(self.buffer_arguments), None)
    buffer = getattr(self._source.sampler, 'buffer', self._source.sampler)
    if getattr(buffer, 'kind', None) == fixed_replay_buffer.DOPAMINE:
      # Checked; its checkpoints, in RAM, go: workers load their own, and
      # this process loads them again only if it samples itself.
      buffer.close()
      self._source = None

  def _seed_for_place(self):
    self.buffer_arguments = ranks.seeded(
      self._arguments, self.rank, self.world_size
    )
    self.seed = self.buffer_arguments['seed']

  def _open(self, arguments):
    """What samples the batches, built with `arguments`."""
    return batches.open_buffer(self.data_dir, arguments)

  def _sample(self, buffer):
    """One named batch of `buffer`."""
    return batches.named(buffer, buffer.sample_transition_batch())

  def _take_place(self) -> bool:
    """Takes the place found now; whether it moved since the last."""
    given = self._given_place or (None, None)
    built = self._found_place or (self.rank, self.world_size)
    place = ranks.current(*given, otherwise=built)
    if place == (self.rank, self.world_size):
      return False
    logging.warning(
      'The dataset of %s was built as rank %d of %d and samples as rank %d '
      'of %d, the place found now (pass rank and world_size to choose it)',
      self.data_dir,
      self.rank,
      self.world_size,
      *place,
    )
    self.rank, self.world_size = place
    if not self._seed_given and self.world_size > 1:
      ranks.require_seed(None, *place)  # Each rank drew a seed of its own.
    self._seed_for_place()
    return True

  @property
  def buffer(self) -> Any:
    """The buffer of this process's stream (serves num_workers=0)."""
    return self._own_source().sampler

  def _own_source(self, moved=False):
    """The training process's stream (its buffer built again where the
    place moved, or where it was let go)."""
    if self._closed:
      raise RuntimeError(f'ReplayDataset of {self.data_dir} is closed')
    if self._source is None or moved:
      return self._new_source()
    return self._source

  def _new_source(self, worker=None, pass_number=0):
    """This process's new stream, in place of its last (a forked worker
    leaves its parent's, worker None, alone)."""
    if self._source is not None and self._source.worker == worker:
      self._source.sampler.close()
    arguments = self.buffer_arguments
    if worker is not None:
      arguments = self.worker_arguments(worker, pass_number)
    self._source = _Source(
      self._open(arguments), worker, pass_number=pass_number
    )
    return self._source

  def worker_arguments(
    self, worker_id: int, pass_number: int = 0
  ) -> dict[str, Any]:
    """The buffer arguments of DataLoader worker `worker_id`'s pass.

    Its seed is the rank's seed's stream `worker_id` (and `pass_number`,
    after the first pass). It has no sampling thread: the workers are the
    parallelism, and a thread in each only adds a hand-off per batch. The
    subsample stays the dataset seed's (ranks.seeded): every worker's.
    """
    stream = (worker_id, pass_number) if pass_number else (worker_id,)
    seed = batches.stream_seed(self.seed, *stream)
    return {'sampling_threads': 0, **self.buffer_arguments, 'seed': seed}

  def __iter__(self) -> Iterator[torch_batches.Minibatch]:
    moved = self._take_place()
    info = data.get_worker_info()
    if info is None:
      source, send = self._own_source(moved), torch_batches.to_tensors
    else:
      slot = self.rank * _WORKERS + info.id
      pass_number = self._passes.count(slot)
      self._passes.count(slot, pass_number + 1)
      source = self._source
      if source is None or source.worker is None or moved:
        # A new worker (every pass, unless persistent): its own buffer.
        source = self._new_source(info.id, pass_number)
      source.pass_number, source.num_workers = pass_number, info.num_workers
      send = torch_batches.sender(source.sampler, self.channels_first)
    source.yielded = 0
    if self._resumed is not None:
      state, self._resumed = self._resumed, None
      source.sampler.load_state_dict(state['sampler'])
      source.pass_number = int(state['pass'])
      source.yielded, source.drawn = int(state['yielded']), int(state['drawn'])
      if source.worker is not None:
        slot = self.rank * _WORKERS + source.worker
        self._passes.count(slot, source.pass_number + 1)
    return self._stream(source, send)

  def _stream(self, source, send):
    """The batches of a pass (set up already: a generator runs late)."""
    workers, every = source.num_workers, self.reload_every
    share = batches.stream_share(self.num_batches, source.worker or 0, workers)
    try:
      while share is None or source.yielded < share:
        # Every `reload_every` batches of the loader: its workers take
        # turns, so worker w's j-th batch is about the loader's j * n + w-th.
        at = source.drawn * workers + (source.worker or 0)
        if every and source.drawn and at // every > (at - workers) // every:
          source.sampler.reload_buffer()
        named = self._sample(source.sampler)
        source.drawn += 1
        source.yielded += 1
        yield send(named, self.channels_first)
    except Exception as error:
      if source.worker is None:
        raise
      # DataLoader re-raises this in the training process, where the user
      # needs to know which data failed and why, not only the traceback.
      raise RuntimeError(
        f'DataLoader worker {source.worker} of {workers} reading '
        f'{self.data_dir} failed: {type(error).__name__}: {error}'
      ) from error

  def state_dict(self) -> dict:
    """This process's stream after its last batch, as plain numbers.

    torchdata's Stateful protocol: a StatefulDataLoader saves it (each
    worker's, with every batch) and gives it back to `load_state_dict`,
    after which the next pass goes on from the batch after the saved one.
    """
    source = self._source if data.get_worker_info() else self._own_source()
    return {
      'pass': source.pass_number,
      'yielded': source.yielded,
      'drawn': source.drawn,
      'sampler': source.sampler.state_dict(),
    }

  def load_state_dict(self, state: dict) -> None:
    """Makes the next pass go on from the place `state_dict()` gave."""
    self._resumed = state

  def close(self) -> None:
    """Releases the buffer built in this process (and its threads)."""
    self._closed = True
    if self._source is not None:
      self._source.sampler.close()
      self._source = None

  def __getstate__(self):
    # A spawned worker builds its own buffer; this one does not travel. The
    # place travels as found now, when the loader starts its workers.
    state = self.__dict__.copy()
    state['_source'], state['_closed'] = None, False
    if self._given_place is None:  # A spawned worker finds no place itself.
      state['_found_place'] = ranks.current(
        otherwise=(self.rank, self.world_size)
      )
    return state


class SegmentDataset(ReplayDataset):
  """Batches of segments for sequence models, as dicts of tensors.

  Example:

    dataset = SegmentDataset('/data/Pong/1/replay_logs', segment_length=30,
                             batch_size=128, seed=0, channels_first=True)
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    for batch in loader:
      batch['observation']   # uint8 (128, 30, 4, 84, 84)
      batch['return_to_go']  # float32 (128, 30)

  Items hold fixed_replay.segments.SegmentSampler's elements; its
  `**buffer_arguments` are the sampler's arguments (segment_length,
  batch_size, pad_short, ..., and the buffer's). Workers, seeds, reloads and
  errors follow ReplayDataset's rules.
  """

  def _open(self, arguments):
    return segments.SegmentSampler(self.data_dir, **arguments)

  def _sample(self, sampler):
    return sampler.sample()


class MixtureDataset(ReplayDataset):
  """Batches of many games and runs (fixed_replay.ReplayMixture), as tensors.

  Example:

    dataset = MixtureDataset('/data', games=['Pong', 'Breakout'],
                             action_space='full', batch_size=32, seed=0)
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    for batch in loader:
      batch['state'], batch['action'], batch['game_id']

  `data` and `**buffer_arguments` are ReplayMixture's (a root or a mapping
  {game: runs}, games, runs, weights, action_space, segment_length,
  batch_size, and every run's buffer arguments). Workers, seeds, reloads
  and errors follow ReplayDataset's rules: `reload_every` reloads every
  run of each worker's mixture, which otherwise reloads on its own
  schedule (ReplayMixture's `reload_every`).
  """

  def __init__(self, data, *args, **kwargs):
    self.data = data  # A mapping of runs, kept as it is for the workers.
    super().__init__(str(data), *args, **kwargs)

  def _open(self, arguments):
    return mixture.ReplayMixture(self.data, **arguments)

  def _sample(self, sampler):
    return sampler.sample()
