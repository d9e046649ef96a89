"""The process's place among the processes that train one model.

Dopamine's buffers draw each minibatch i.i.d., with replacement, from every
loaded transition, so processes that train one model together (torchrun
and DDP, Ray Train, multi-process JAX) need no shard of the data: each
draws from all of it. What they need is a stream each. Given one seed,
every rank would draw the same batches, and the model would see one rank's
data once per rank. The front doors (fixed_replay.torch's and
fixed_replay.torchrl's datasets, jax_batches) therefore take the rank and
world size, as arguments or from torch.distributed or JAX when initialised,
and seed each rank with its own stream of the seed: the same seed and world
size repeat every rank's batches, and one process alone keeps the seed as
it is (its batches are those of before).
"""

import operator
import os
import sys

from absl import logging
import numpy as np


def current(
  rank: int | None = None,
  world_size: int | None = None,
  otherwise: tuple[int, int] | None = None,
) -> tuple[int, int]:
  """(rank, world_size) of this process among those training one model.

  That is the data-parallel place: under tensor or pipeline parallelism,
  pass the rank and size of this process's data-parallel group (e.g.
  `torch.distributed.get_rank(group)`), not the global ones found here.

  As given; else torch.distributed's, or JAX's (`jax.process_index()`),
  when initialised; else torchrun's environment (RANK, WORLD_SIZE: a
  dataset built before `init_process_group`); else `otherwise`; else
  (0, 1), with a warning under SLURM or MPI, whose launchers set neither.

  Args:
    rank: int or None, given with world_size.
    world_size: int or None, the processes training one model.
    otherwise: (rank, world_size) or None, the place when nothing says one
      (a DataLoader worker's: its parent's).

  Returns:
    (rank, world_size), ints.

  Raises:
    ValueError: if only one of them is given, either is not an integer, or
      the rank is not in [0, world_size).
  """
  if (rank is None) != (world_size is None):
    raise ValueError(
      f'rank={rank} and world_size={world_size}: give both, or neither to '
      'take them from torch.distributed or JAX'
    )
  if rank is None:
    rank, world_size = _detected() or otherwise or _alone()
  try:  # Integers of any kind (numpy's too); not 1.5.
    rank, world_size = operator.index(rank), operator.index(world_size)
  except TypeError:
    raise ValueError(
      f'rank={rank!r} and world_size={world_size!r} must be integers'
    ) from None
  if not 0 <= rank < world_size:
    raise ValueError(f'rank={rank} is not in [0, world_size={world_size})')
  return rank, world_size


def _detected() -> tuple[int, int] | None:
  # Looked up, not imported: only a process that uses them initialised them.
  torch = sys.modules.get('torch')
  if torch is not None and torch.distributed.is_available():
    if torch.distributed.is_initialized():
      return torch.distributed.get_rank(), torch.distributed.get_world_size()
  if 'jax' in sys.modules:
    # Only once jax.distributed is initialised: asking JAX for its process
    # index otherwise starts its backends (and on a GPU, takes its memory).
    try:
      from jax._src import distributed  # No public test in JAX 0.4.

      initialised = distributed.global_state.client is not None
    except (ImportError, AttributeError):  # Another JAX: the public one.
      initialised = sys.modules['jax'].distributed.is_initialized()
    if initialised:
      jax = sys.modules['jax']
      return jax.process_index(), jax.process_count()
  if 'RANK' in os.environ and 'WORLD_SIZE' in os.environ:
    return int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
  return None


def _alone() -> tuple[int, int]:
  for launcher in ('SLURM_NTASKS', 'OMPI_COMM_WORLD_SIZE', 'PMI_SIZE'):
    if int(os.environ.get(launcher, '1')) > 1:
      logging.warning(
        '%s=%s, but neither torch.distributed nor JAX is initialised, nor '
        'RANK and WORLD_SIZE set: this process samples as 0 of 1, like its '
        'siblings. Initialise them first, or pass rank and world_size.',
        launcher,
        os.environ[launcher],
      )
  return 0, 1


def rank_seed(seed: int | None, rank: int, world_size: int) -> int | None:
  """The seed of rank `rank` of `world_size`: `seed` itself for a process
  alone (or None), else a stream spawned from it, statistically independent
  of every other rank's (and of DataLoader workers' streams,
  batches.stream_seed)."""
  if seed is None or world_size == 1:
    return seed
  sequence = np.random.SeedSequence(seed, spawn_key=(rank, world_size))
  return int(sequence.generate_state(1, np.uint64)[0])


def require_seed(seed: int | None, rank: int, world_size: int) -> None:
  """Raises a ValueError for no seed on one of several ranks: each would
  draw its own, and keep other episodes of a subsample."""
  if seed is None and world_size > 1:
    raise ValueError(
      f'seed=None on rank {rank} of {world_size}: every rank would draw a '
      'seed of its own (streams that may repeat each other, and other '
      'episodes of a subsample). Pass the same seed on every rank, e.g. '
      "seed=0, or one agreed over the process group (rank 0's, broadcast)"
    )


def seeded(
  arguments: dict, rank: int | None = None, world_size: int | None = None
) -> dict:
  """A sampler's `arguments`, their seed made this rank's (current()).

  The episodes a subsample keeps stay the seed's (`subsample_seed`, unless
  given): the ranks, and their DataLoader workers, train on one subsample,
  each drawing its own stream from it.

  Raises:
    ValueError: with no seed on one of several ranks: each would draw its
      own, and keep other episodes of a subsample.
  """
  rank, world_size = current(rank, world_size)
  seed = arguments.get('seed')
  require_seed(seed, rank, world_size)
  if seed is None:
    return dict(arguments)
  subsample_seed = arguments.get('subsample_seed')
  return {
    **arguments,
    'subsample_seed': seed if subsample_seed is None else subsample_seed,
    'seed': rank_seed(seed, rank, world_size),
  }
