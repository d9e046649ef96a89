"""Processes training one model: each rank its own stream (ranks.py).

The streams themselves are exact to Dopamine (test_mixture's rank test);
here every front door draws rank r's stream, and the place is found where
a user's launcher puts it. The launchers themselves run in test_mixture
(torchrun).
"""

import socket

import numpy as np
import pytest

from fixed_replay import batches
from fixed_replay import ranks


def _first_indices(front_door, store, **place):
  """The first batch's indices of `front_door` over `store`, seed 5."""
  arguments = {'batch_size': 8, 'seed': 5, 'sampling_threads': 0}
  if front_door == 'torch':
    from fixed_replay.torch import ReplayDataset

    dataset = ReplayDataset(str(store), **arguments, **place)
    indices = next(iter(dataset))['indices'].numpy()
  elif front_door == 'torchrl':
    from fixed_replay.torchrl import FixedReplayDataset

    dataset = FixedReplayDataset(str(store), **arguments, **place)
    indices = dataset.sample()['indices'].numpy()
  else:
    from fixed_replay import jax_batches

    dataset = jax_batches.ReplayBatches(str(store), **arguments, **place)
    indices = np.asarray(next(iter(dataset))['indices'])
  dataset.close()
  return indices


@pytest.mark.parametrize('front_door', ['torch', 'torchrl', 'jax'])
def test_every_front_door_draws_each_ranks_stream(store, front_door):
  pytest.importorskip(
    {'torch': 'torch', 'torchrl': 'torchrl'}.get(front_door, 'jax')
  )
  alone = _first_indices(front_door, store)
  np.testing.assert_array_equal(
    alone, _first_indices(front_door, store, rank=0, world_size=1)
  )
  drawn = [
    _first_indices(front_door, store, rank=r, world_size=2) for r in (0, 1)
  ]
  for rank, indices in enumerate(drawn):
    buffer = batches.open_buffer(
      str(store),
      {
        'batch_size': 8,
        'seed': ranks.rank_seed(5, rank, 2),
        'sampling_threads': 0,
      },
    )
    np.testing.assert_array_equal(
      indices,
      batches.named(buffer, buffer.sample_transition_batch())['indices'],
    )
    buffer.close()
  assert not np.array_equal(drawn[0], drawn[1])
  assert not np.array_equal(drawn[0], alone)


def test_the_place_is_found_where_launchers_put_it(monkeypatch):
  monkeypatch.delenv('RANK', raising=False)
  monkeypatch.delenv('WORLD_SIZE', raising=False)
  assert ranks.current() == (0, 1)
  monkeypatch.setenv('RANK', '3')  # torchrun's, before init_process_group.
  monkeypatch.setenv('WORLD_SIZE', '4')
  assert ranks.current() == (3, 4)
  assert ranks.current(1, 2) == (1, 2)  # Given: as given.
  assert ranks.current(np.int64(1), 2) == (1, 2)
  for rank, world_size in ((1.0, 2), (2, 2), (0, None)):
    with pytest.raises(ValueError, match=f'rank={rank}'):
      ranks.current(rank, world_size)
  assert ranks.rank_seed(None, 3, 4) is None  # torch's worker seeds then.
  assert ranks.rank_seed(7, 0, 1) == 7
  seeds = {ranks.rank_seed(7, r, 4) for r in range(4)}
  assert len(seeds) == 4 and 7 not in seeds
  assert ranks.rank_seed(7, 1, 4) != ranks.rank_seed(7, 1, 2)


def test_ranks_and_their_workers_keep_one_subsample(store):
  """subsample='random_episodes': every rank, and every DataLoader worker
  of a rank, draws from the episodes the seed keeps (subsample_seed)."""
  torch = pytest.importorskip('torch')
  from fixed_replay.torch import ReplayDataset

  arguments = {
    'batch_size': 64,
    'seed': 5,
    'subsample': 'random_episodes',
    'subsample_fraction': 0.3,
  }
  alone = batches.open_buffer(str(store), dict(arguments, sampling_threads=0))
  for rank in (0, 1):
    dataset = ReplayDataset(
      str(store), num_batches=4, rank=rank, world_size=2, **arguments
    )
    loader = torch.utils.data.DataLoader(
      dataset, batch_size=None, num_workers=2
    )
    for batch in loader:
      # Raises for a row the seed's subsample does not keep.
      alone.sample_transition_batch(
        64, indices=batch['indices'].numpy(), suffixes=batch['suffix'].numpy()
      )
    dataset.close()
  alone.close()


@pytest.mark.parametrize('subsample_seed', ['unset', None])
def test_without_a_seed_the_workers_keep_one_subsample(store, subsample_seed):
  """seed=None (and subsample_seed=None, as a config may pass it): the seed
  is drawn once, where the dataset is built, and every worker keeps its
  episodes; several ranks without a seed are refused."""
  torch = pytest.importorskip('torch')
  from fixed_replay.torch import ReplayDataset

  arguments = {
    'batch_size': 64,
    'subsample': 'random_episodes',
    'subsample_fraction': 0.3,
  }
  if subsample_seed is None:
    arguments['subsample_seed'] = None
  dataset = ReplayDataset(str(store), num_batches=6, **arguments)
  kept = batches.open_buffer(
    str(store), dict(dataset.buffer_arguments, sampling_threads=0)
  )
  loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
  suffixes = set()
  for batch in loader:
    # Raises for a row the drawn seed's subsample does not keep.
    kept.sample_transition_batch(
      64, indices=batch['indices'].numpy(), suffixes=batch['suffix'].numpy()
    )
    suffixes.update(batch['suffix'].tolist())
  assert len(suffixes) > 1
  kept.close()
  dataset.close()
  with pytest.raises(ValueError, match='Pass the same seed on every rank'):
    ReplayDataset(str(store), rank=1, world_size=2, **arguments)


def _built_before_the_group(rank, store, port, out):
  """A spawned rank: its dataset is built before init_process_group, then
  a spawned DataLoader worker's first batch, then its own."""
  import torch

  from fixed_replay.torch import ReplayDataset

  dataset = ReplayDataset(store, batch_size=8, seed=5, sampling_threads=0)
  torch.distributed.init_process_group(
    'gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank, world_size=2
  )
  loader = torch.utils.data.DataLoader(
    dataset, batch_size=None, num_workers=1, multiprocessing_context='spawn'
  )
  try:
    batch = next(iter(loader))['indices'].numpy()
    np.save(f'{out}/{rank}_worker.npy', batch)
    np.save(f'{out}/{rank}.npy', next(iter(dataset))['indices'].numpy())
  finally:
    del loader
    torch.distributed.destroy_process_group()
    dataset.close()


def test_a_dataset_built_before_the_process_group_takes_its_rank(
  store, tmp_path
):
  """torch.multiprocessing.spawn sets no RANK: each rank's dataset, built
  before init_process_group, samples as its rank once a pass starts, and
  so do its DataLoader workers, spawned too."""
  torch = pytest.importorskip('torch')
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  torch.multiprocessing.spawn(
    _built_before_the_group,
    args=(str(store), port, str(tmp_path)),
    nprocs=2,
    join=True,
  )
  from fixed_replay.torch import ReplayDataset

  for rank in (0, 1):
    np.testing.assert_array_equal(
      np.load(tmp_path / f'{rank}.npy'),
      _first_indices('torch', store, rank=rank, world_size=2),
    )
    # The worker, spawned where nothing says the rank, draws its rank's too.
    dataset = ReplayDataset(
      str(store), batch_size=8, seed=5, rank=rank, world_size=2
    )
    worker = batches.open_buffer(str(store), dataset.worker_arguments(0))
    np.testing.assert_array_equal(
      np.load(tmp_path / f'{rank}_worker.npy'),
      batches.named(worker, worker.sample_transition_batch())['indices'],
    )
    worker.close()
    dataset.close()
  for name in ('{}.npy', '{}_worker.npy'):
    assert not np.array_equal(
      np.load(tmp_path / name.format(0)), np.load(tmp_path / name.format(1))
    )
