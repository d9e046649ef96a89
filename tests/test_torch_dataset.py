"""ReplayDataset: the buffer's exact minibatches through real DataLoaders."""

import gc
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from replay_oracle import assert_equals_oracle
import resumed_loader

torch = pytest.importorskip('torch')

from torch.utils.data import DataLoader  # noqa: E402

from fixed_replay import batches  # noqa: E402
from fixed_replay import torch_batches  # noqa: E402
from fixed_replay.errors import CheckpointError  # noqa: E402
from fixed_replay.torch import ReplayDataset  # noqa: E402

CARTPOLE = dict(
  observation_shape=(4, 1), stack_size=1, observation_dtype=np.float64
)


def _numpy(batch):
  return {name: tensor.numpy() for name, tensor in batch.items()}


def _assert_same(left, right):
  assert list(left) == list(right)
  for name in left:
    assert left[name].dtype == right[name].dtype, name
    np.testing.assert_array_equal(left[name], right[name], err_msg=name)


@pytest.mark.parametrize('layout', ['dopamine', 'store'])
def test_items_are_the_buffers_own_batches(
  layout, dopamine_dir, store, oracles
):
  directory, capacity, _ = dopamine_dir
  data_dir = str(directory if layout == 'dopamine' else store)
  arguments = dict(
    replay_capacity=capacity, batch_size=16, update_horizon=3, seed=5
  )
  dataset = ReplayDataset(data_dir, num_batches=3, **arguments)
  items = [_numpy(b) for b in DataLoader(dataset, batch_size=None)]
  assert len(items) == 3
  reference = batches.open_buffer(data_dir, arguments)
  try:
    for item in items:
      # The same seeded stream as the buffer sampling on its own ...
      _assert_same(
        item, batches.named(reference, reference.sample_transition_batch())
      )
      # ... every transition the buffer's for its (checkpoint, row) ...
      again = batches.named(
        reference,
        reference.sample_transition_batch(
          indices=item['indices'], suffixes=item['suffix']
        ),
      )
      _assert_same(item, again)
      assert len(np.unique(item['suffix'])) > 1
      # ... and Dopamine's own.
      assert_equals_oracle(item, lambda s: oracles(s, update_horizon=3))
  finally:
    reference.close()
    dataset.close()


def test_channels_first_moves_the_stack_to_the_front(store):
  arguments = dict(replay_capacity=1000, batch_size=8, seed=2)
  last = next(iter(ReplayDataset(str(store), **arguments)))
  first = next(
    iter(ReplayDataset(str(store), channels_first=True, **arguments))
  )
  assert first['state'].shape == (8, 4, 84, 84)
  assert first['state'].is_contiguous()
  np.testing.assert_array_equal(
    first['next_state'].numpy(), np.moveaxis(last['next_state'].numpy(), -1, 1)
  )
  np.testing.assert_array_equal(first['action'].numpy(), last['action'].numpy())


def _expected_worker_stream(data_dir, dataset, num_workers, per_worker):
  """What each worker's buffer, seeded as the dataset says, samples."""
  streams = []
  for worker in range(num_workers):
    buffer = batches.open_buffer(data_dir, dataset.worker_arguments(worker))
    streams.append(list(batches.sample(buffer, per_worker)))
    buffer.close()
  # DataLoader hands out the workers' items in turn.
  return [
    streams[i % num_workers][i // num_workers]
    for i in range(num_workers * per_worker)
  ]


def test_workers_draw_distinct_seeded_streams(cartpole_dir):
  dataset = ReplayDataset(
    cartpole_dir, num_batches=6, batch_size=32, seed=11, **CARTPOLE
  )
  loader = DataLoader(dataset, batch_size=None, num_workers=2)
  first = [_numpy(b) for b in loader]
  assert len(first) == 6
  expected = _expected_worker_stream(cartpole_dir, dataset, 2, 3)
  for item, want in zip(first, expected, strict=True):
    _assert_same(item, want)
  worker_rows = [
    np.concatenate([b['indices'] for b in first[w::2]]) for w in (0, 1)
  ]
  assert not np.array_equal(worker_rows[0], worker_rows[1])
  # Neither worker repeats the main process's stream either.
  main = _numpy(next(iter(dataset)))
  assert not np.array_equal(main['indices'], first[0]['indices'])
  dataset.close()


def _passes(data_dir, num_workers, persistent, passes=2, **arguments):
  """Each pass's `indices`, over one loader, as a training loop makes them."""
  dataset = ReplayDataset(data_dir, **arguments)
  loader = DataLoader(
    dataset,
    batch_size=None,
    num_workers=num_workers,
    persistent_workers=persistent,
  )
  try:
    return [[b['indices'].numpy() for b in loader] for _ in range(passes)]
  finally:
    del loader
    dataset.close()


@pytest.mark.parametrize(
  'num_workers, persistent', [(0, False), (2, False), (2, True)]
)
def test_every_pass_draws_new_batches_and_a_rerun_repeats_them(
  cartpole_dir, num_workers, persistent
):
  arguments = dict(num_batches=4, batch_size=32, seed=7, **CARTPOLE)
  run = _passes(cartpole_dir, num_workers, persistent, 3, **arguments)
  assert [len(p) for p in run] == [4, 4, 4]
  batches_drawn = [tuple(b) for p in run for b in p]
  assert len(set(batches_drawn)) == 12  # No pass repeats another's batches.
  again = _passes(cartpole_dir, num_workers, persistent, 3, **arguments)
  for left, right in zip(run, again, strict=True):
    np.testing.assert_array_equal(np.stack(left), np.stack(right))


@pytest.mark.parametrize(
  'layout, num_workers, arguments',
  [
    ('store', 0, {}),
    ('store', 2, {}),
    (
      'dopamine',
      2,
      {'num_buffers_to_load': 2, 'reload_every': 3, 'replay_capacity': 1000},
    ),
  ],
)
def test_a_stateful_loader_resumes_exactly_in_a_fresh_process(
  layout, num_workers, arguments, dopamine_dir, store, tmp_path
):
  data = store if layout == 'store' else dopamine_dir[0]
  resumed_loader.assert_resumes_exactly(
    {
      'kind': 'replay',
      'data': str(data),
      'arguments': dict(arguments, batch_size=8, seed=9),
      'num_workers': num_workers,
    },
    tmp_path,
  )


def test_unseeded_datasets_follow_torch_manual_seed(cartpole_dir):
  runs = []
  for seed, workers in ((3, 0), (3, 0), (4, 0), (3, 2), (3, 2)):
    torch.manual_seed(seed)
    runs.append(
      np.concatenate(
        _passes(
          cartpole_dir,
          workers,
          False,
          1,
          num_batches=2,
          batch_size=32,
          **CARTPOLE,
        )[0]
      )
    )
  np.testing.assert_array_equal(runs[0], runs[1])
  assert not np.array_equal(runs[0], runs[2])
  np.testing.assert_array_equal(runs[3], runs[4])


def test_a_failing_worker_raises_in_the_main_process_naming_the_data(
  dopamine_dir, tmp_path
):
  directory, capacity, _ = dopamine_dir
  copy = tmp_path / 'replay'
  shutil.copytree(directory, copy)
  dataset = ReplayDataset(
    str(copy), replay_capacity=capacity, batch_size=8, seed=0
  )
  dataset.close()
  # The data changes under the loader: a checkpoint file is cut short.
  damaged = copy / '$store$_observation_ckpt.1.gz'
  damaged.write_bytes(damaged.read_bytes()[:500])
  loader = DataLoader(dataset, batch_size=None, num_workers=2, timeout=120)
  iterator = iter(loader)
  began = time.monotonic()
  with pytest.raises(RuntimeError) as raised:
    next(iterator)
  message = str(raised.value)
  assert 'DataLoader worker' in message
  assert str(copy) in message
  assert 'CheckpointError' in message
  assert '$store$_observation_ckpt.1.gz' in message
  assert time.monotonic() - began < 120
  # The shutdown is DataLoader's own, when the iterator is dropped: it tells
  # each worker to stop, joins it, and only then unregisters its pid from
  # the SIGCHLD handler. A worker that had to be terminated (-15) would mean
  # the error left it unable to stop. One still starting when the error
  # came may exit with 1 instead: its queues were gone when it unpickled
  # them (DataLoader's own shutdown, seen once in 740 runs of the suite).
  workers = list(iterator._workers)  # noqa: SLF001
  del iterator, raised  # The error's traceback holds the iterator too.
  gc.collect()
  exit_codes = [w.exitcode for w in workers]
  assert all(code in (0, 1) for code in exit_codes), exit_codes


def test_construction_errors_come_from_the_buffer_in_the_main_process(
  tmp_path, store
):
  with pytest.raises(CheckpointError) as raised:
    ReplayDataset(str(tmp_path))
  assert str(tmp_path) in str(raised.value)
  with pytest.raises(CheckpointError, match='observation'):
    ReplayDataset(str(store), observation_shape=(4, 1))
  with pytest.raises(ValueError, match='stack_size'):
    ReplayDataset(str(store), stack_size=0)
  with pytest.raises(TypeError):
    ReplayDataset(str(store), no_such_argument=1)


def test_pin_memory(cartpole_dir):
  arguments = dict(num_batches=4, batch_size=16, seed=1, **CARTPOLE)
  plain = _passes(cartpole_dir, 1, False, 1, **arguments)[0]
  dataset = ReplayDataset(cartpole_dir, **arguments)  # The same stream.
  if torch.cuda.is_available():
    loader = DataLoader(
      dataset, batch_size=None, num_workers=1, pin_memory=True
    )
    pinned = list(loader)
    assert all(t.is_pinned() for b in pinned for t in b.values())
  else:
    # Without an accelerator DataLoader warns and hands out the same tensors.
    with pytest.warns(UserWarning, match='no accelerator'):
      loader = DataLoader(
        dataset, batch_size=None, num_workers=1, pin_memory=True
      )
      pinned = list(loader)
  for a, b in zip(plain, pinned, strict=True):
    np.testing.assert_array_equal(a, b['indices'].numpy())
  dataset.close()


def test_workers_stop_when_the_loader_is_dropped(cartpole_dir):
  dataset = ReplayDataset(cartpole_dir, batch_size=16, seed=1, **CARTPOLE)
  iterator = iter(DataLoader(dataset, batch_size=None, num_workers=2))
  next(iterator)  # Endless: the workers are mid-stream.
  workers = list(iterator._workers)
  assert all(w.is_alive() for w in workers)
  del iterator
  gc.collect()
  deadline = time.monotonic() + 30
  while any(w.is_alive() for w in workers) and time.monotonic() < deadline:
    time.sleep(0.1)
  assert not any(w.is_alive() for w in workers)
  assert all(w.exitcode == 0 for w in workers)
  dataset.close()


def test_the_dopamine_path_does_not_import_torch(cartpole_dir):
  code = (
    'import sys, fixed_replay\n'
    'from fixed_replay import batches, jax_batches\n'
    'from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer\n'
    'import numpy as np\n'
    f'b = FixedReplayBuffer({cartpole_dir!r}, observation_shape=(4, 1),'
    ' stack_size=1, observation_dtype=np.float64)\n'
    'b.sample_transition_batch()\n'
    'assert "torch" not in sys.modules, "torch imported"\n'
  )
  subprocess.run(
    [sys.executable, '-c', code], check=True, env=dict(os.environ), timeout=300
  )


def test_workers_forked_as_the_dataset_is_built_sample(cartpole_dir):
  # Building the dataset starts the kernels' warm-up thread, which holds
  # numba's compiler lock while it loads them; a DataLoader that forks its
  # worker at that moment once left the worker's first batch waiting on that
  # lock forever. A fresh process, so that the kernels are not yet loaded.
  code = (
    'import numpy as np\n'
    'from torch.utils.data import DataLoader\n'
    'from fixed_replay.torch import ReplayDataset\n'
    f'dataset = ReplayDataset({cartpole_dir!r}, num_batches=2, batch_size=8,'
    ' observation_shape=(4, 1), stack_size=1, observation_dtype=np.float64)\n'
    'batches = list(DataLoader(dataset, batch_size=None, num_workers=1))\n'
    'assert len(batches) == 2, len(batches)\n'
    'dataset.close()\n'
  )
  subprocess.run(
    [sys.executable, '-c', code], check=True, env=dict(os.environ), timeout=120
  )


@pytest.mark.parametrize('num_workers', [1, 2])
def test_a_worker_terminated_at_exit_leaves_no_ring(
  cartpole_dir, tmp_path, num_workers
):
  """A collating loader's error leaves its iterator unclosed: the process
  then exits with its workers alive and terminates them (SIGTERM). Each
  worker's ring, which the training process never mapped, goes with it,
  and no worker is reported killed."""
  code = (
    'import numpy as np\n'
    'from torch.utils.data import DataLoader\n'
    'from fixed_replay import torch_batches\n'
    'from fixed_replay.torch import ReplayDataset\n'
    f'torch_batches.SHARED_DIR = {str(tmp_path)!r}\n'
    f'dataset = ReplayDataset({cartpole_dir!r}, batch_size=8, seed=0,'
    ' observation_shape=(4, 1), stack_size=1, observation_dtype=np.float64)\n'
    f'iterator = iter(DataLoader(dataset, num_workers={num_workers}))\n'
    'try:\n'
    '  next(iterator)\n'
    'except TypeError as error:\n'
    '  kept = error  # Its traceback keeps the iterator and its workers.\n'
    'assert all(p.is_alive() for p in iterator._workers)\n'
    'dataset.close()\n'
  )
  completed = subprocess.run(
    [sys.executable, '-c', code],
    env=dict(os.environ),
    timeout=120,
    capture_output=True,
    text=True,
  )
  assert completed.returncode == 0, completed.stderr[-3000:]
  assert 'killed by signal' not in completed.stderr
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize('channels_first', [False, True])
def test_worker_batches_travel_in_shared_slots_exactly(store, channels_first):
  arguments = dict(replay_capacity=1000, batch_size=8, seed=6)
  # More batches than a worker has slots, all held: the later ones find
  # every slot taken and travel DataLoader's own way, with the same data.
  count = 3 * torch_batches._SLOTS  # noqa: SLF001
  dataset = ReplayDataset(
    str(store), num_batches=count, channels_first=channels_first, **arguments
  )
  mapped_before = set(torch_batches._mapped_rings)
  held = list(DataLoader(dataset, batch_size=None, num_workers=1))
  assert len(held) == count
  # The first batches are views of the worker's ring, mapped here once and
  # already unlinked: nothing of it is left in /dev/shm. (Only this test's
  # ring is looked for: other test processes make and remove their own.)
  assert held[0]['state'].numpy().base is not None
  mapped = set(torch_batches._mapped_rings) - mapped_before
  assert len(mapped) == 1
  assert not [r for r in mapped if os.path.exists(os.path.join('/dev/shm', r))]
  expected = _expected_worker_stream(str(store), dataset, 1, count)
  for item, want in zip(held, expected, strict=True):
    want = torch_batches.to_tensors(want, channels_first)
    _assert_same(_numpy(item), _numpy(want))
  dataset.close()


def test_a_slot_is_free_again_once_its_tensors_are_collected(store):
  slots = torch_batches._SLOTS  # noqa: SLF001
  dataset = ReplayDataset(
    str(store), replay_capacity=1000, batch_size=8, seed=6
  )
  iterator = iter(DataLoader(dataset, batch_size=None, num_workers=1))
  for _ in range(3 * slots):  # Slots are reused: more batches than slots.
    batch = next(iterator)
  time.sleep(1)  # The worker fills the batches it was asked for, then waits.
  rings = torch_batches._mapped_rings  # noqa: SLF001
  ring = rings[list(rings)[-1]]

  def held():
    return sum(ring[slot] for slot in range(slots))

  # The batch in hand and those DataLoader asked for ahead (2), no more.
  assert held() == 3
  views = [batch['state'][1:], batch['action']]
  del batch
  gc.collect()
  assert held() == 3  # Views of its tensors still hold the slot ...
  del views
  gc.collect()
  assert held() == 2  # ... and it is free once they are gone.
  del iterator
  dataset.close()


def test_reload_every_counts_the_loaders_batches_whatever_the_workers(
  dopamine_dir,
):
  """One checkpoint held at a time, a new one every 3 batches of the loader:
  with 2 workers, each worker's batches in a block of 3 come from one
  checkpoint, and the checkpoints change at blocks' ends that a reload every
  3 batches of each worker (every 6 of the loader) would not reach."""
  arguments = dict(
    num_batches=18,
    reload_every=3,
    num_buffers_to_load=1,
    replay_capacity=1000,
    batch_size=4,
    seed=1,
  )
  dataset = ReplayDataset(str(dopamine_dir[0]), **arguments)
  loader = DataLoader(dataset, batch_size=None, num_workers=2)
  held = [int(b['suffix'][0]) for b in loader]  # One checkpoint each batch.
  dataset.close()
  blocks_changed = set()
  for worker in (0, 1):
    mine = list(range(worker, 18, 2))  # The loader's batches of this worker.
    for before, after in zip(mine, mine[1:], strict=False):
      if held[before] != held[after]:
        # Only across a block's end: never inside a block of 3.
        assert before // 3 != after // 3, (worker, held)
        blocks_changed.add(after // 3)
  # Reloads every 6 loader batches would change only at blocks 2 and 4.
  assert blocks_changed & {1, 3, 5}, held
