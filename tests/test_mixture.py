"""ReplayMixture against Dopamine, over real ALE games.

Each game's runs are played by `generate` (real ALE, random policy, written
by Dopamine's own `save`): Pong, Breakout and MsPacman have minimal action
sets of 6, 4 and 9. The oracle of every transition and segment step is
Dopamine's `OutOfGraphReplayBuffer` loaded from its run's files.
"""

import json
import logging
import os
import shutil

from dopamine.discrete_domains import atari_lib
import dopamine_data
import numpy as np
import pytest
import resumed_loader
from scipy import stats
from test_segments import assert_segments_are_dopamines

from fixed_replay.convert import convert
from fixed_replay.errors import CheckpointError
from fixed_replay.generate import generate
from fixed_replay.mixture import ReplayMixture
from fixed_replay.sources import ale_games

pytestmark = pytest.mark.xdist_group('mixture')

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ATARI_TINY = [
  'FixedReplayRunner.num_iterations = 1',
  'FixedReplayRunner.training_steps = 8',
  'FixedReplayRunner.evaluation_steps = 20',
  'FixedReplayRunner.max_steps_per_episode = 20',
]

GAMES = {'Breakout': ['1'], 'MsPacman': ['1'], 'Pong': ['1', '2']}
ROWS = 300
ELEMENTS = (
  'state',
  'action',
  'reward',
  'next_state',
  'next_action',
  'next_reward',
  'terminal',
  'indices',
)


@pytest.fixture(scope='module')
def roots(tmp_path_factory):
  """{'files': ROOT of Dopamine runs, 'store': the same runs converted}."""
  files = tmp_path_factory.mktemp('games')
  store = tmp_path_factory.mktemp('stores')
  seed = 0
  for game, runs in GAMES.items():
    for run in runs:
      seed += 1
      generate.generate_dataset(
        str(files / game / run),
        game=game,
        num_checkpoints=2,
        checkpoint_rows=ROWS,
        seed=seed,
        max_steps_per_episode=120,  # Episodes that end: segments.
        progress=False,
      )
      convert.convert(
        str(files / game / run), str(store / game / run), workers=0
      )
  return {'files': files, 'store': store}


@pytest.fixture(scope='module')
def oracle(roots):
  """oracle(game, run, suffix): Dopamine's buffer loaded from the files."""
  loaded = {}

  def get(game, run, suffix):
    key = (game, run, suffix)
    if key not in loaded:
      loaded[key] = dopamine_data.load_oracle(
        roots['files'] / game / run, suffix, ROWS
      )
    return loaded[key]

  return get


def assert_transitions_are_dopamines(mixture, batch, oracle):
  """Every element of a full-action-space `batch` of `mixture` is Dopamine's
  for its game, run, checkpoint and row; returns the (game, run)s seen."""
  seen = set()
  for i in range(len(batch['indices'])):
    run = mixture.runs[batch['run'][i]]
    assert mixture.games[batch['game_id'][i]] == run.game
    suffix, row = int(batch['suffix'][i]), int(batch['indices'][i])
    expected = oracle(run.game, run.name, suffix).sample_transition_batch(
      1, indices=[row]
    )
    minimal = ale_games.minimal_action_set(run.game)
    for name, value in zip(ELEMENTS, expected, strict=True):
      if name in ('action', 'next_action'):
        value = minimal[value]  # The full set's index.
      np.testing.assert_array_equal(batch[name][i], value[0], err_msg=name)
    seen.add((run.game, run.name))
  return seen


@pytest.mark.parametrize('kind', ['files', 'store'])
def test_every_transition_is_dopamines_for_its_game_run_and_row(
  roots, oracle, kind
):
  mixture = ReplayMixture(
    str(roots[kind]), action_space='full', batch_size=64, seed=0
  )
  assert mixture.games == ['Breakout', 'MsPacman', 'Pong']
  assert [(r.game, r.name) for r in mixture.runs] == [
    ('Breakout', '1'),
    ('MsPacman', '1'),
    ('Pong', '1'),
    ('Pong', '2'),
  ]
  seen = set()
  for batch in mixture.batches(3):
    seen |= assert_transitions_are_dopamines(mixture, batch, oracle)
  assert len(seen) == 4
  mixture.close()


def test_each_rank_draws_its_own_exact_stream(roots, oracle):
  """Ranks training one model: distinct streams, each repeating under its
  seed and world size, one process alone unchanged, every element exact."""
  torch = pytest.importorskip('torch')
  from fixed_replay import batches
  from fixed_replay import ranks
  from fixed_replay.torch import MixtureDataset

  root = str(roots['store'])
  arguments = {'batch_size': 16, 'action_space': 'full', 'seed': 3}

  def items(num_workers=0, **place):
    dataset = MixtureDataset(root, num_batches=2, **arguments, **place)
    loader = torch.utils.data.DataLoader(
      dataset, batch_size=None, num_workers=num_workers
    )
    drawn = [{k: v.numpy() for k, v in b.items()} for b in loader]
    dataset.close()
    return drawn

  def same(first, second):
    return all(
      np.array_equal(a[k], b[k])
      for a, b in zip(first, second, strict=True)
      for k in a
    )

  assert same(items(), items(rank=0, world_size=1))
  rank_0, rank_1 = items(rank=0, world_size=2), items(rank=1, world_size=2)
  assert not same(rank_0, rank_1) and not same(rank_0, items())
  assert same(rank_1, items(rank=1, world_size=2))
  expected = ReplayMixture(root, **arguments)  # For its runs and games.
  for batch in rank_0 + rank_1:
    assert_transitions_are_dopamines(expected, batch, oracle)
  # A rank's DataLoader workers: streams of the rank's seed.
  workers = items(num_workers=2, rank=1, world_size=2)
  seed = ranks.rank_seed(3, 1, 2)
  for worker in (0, 1):
    mixture = ReplayMixture(
      root, **dict(arguments, seed=batches.stream_seed(seed, worker))
    )
    assert same(workers[worker::2], list(mixture.batches(1)))
    mixture.close()
  expected.close()
  with pytest.raises(ValueError, match='give both'):
    MixtureDataset(root, rank=1, **arguments)
  with pytest.raises(ValueError, match='not in'):
    MixtureDataset(root, rank=2, world_size=2, **arguments)


def test_ranks_and_workers_keep_each_runs_one_subsample(roots):
  """subsample='random_episodes': every rank of a mixture, and every
  DataLoader worker, draws from the episodes each run keeps alone."""
  torch = pytest.importorskip('torch')
  from fixed_replay.torch import MixtureDataset

  root = str(roots['store'])
  arguments = {
    'batch_size': 64,
    'action_space': 'full',
    'seed': 3,
    'subsample': 'random_episodes',
    'subsample_fraction': 0.5,
  }
  alone = ReplayMixture(root, **arguments)
  for place in ({}, {'rank': 1, 'world_size': 2}):
    dataset = MixtureDataset(root, num_batches=4, **place, **arguments)
    loader = torch.utils.data.DataLoader(
      dataset, batch_size=None, num_workers=2
    )
    for batch in loader:
      for run in np.unique(batch['run'].numpy()):
        drawn = batch['run'].numpy() == run
        # Raises for a row the run's subsample alone does not keep.
        alone._samplers[run].sample_transition_batch(  # noqa: SLF001
          int(drawn.sum()),
          indices=batch['indices'].numpy()[drawn],
          suffixes=batch['suffix'].numpy()[drawn],
        )
    dataset.close()
  alone.close()


@pytest.mark.parametrize('kind', ['files', 'store'])
def test_every_segment_step_is_dopamines(roots, oracle, kind):
  mixture = ReplayMixture(
    str(roots[kind]), segment_length=6, batch_size=24, seed=1
  )
  batch = mixture.sample()
  assert batch['observation'].shape == (24, 6, 84, 84, 4)
  assert batch['game_id'].shape == batch['run'].shape == (24,)
  for r in np.unique(batch['run']):
    run = mixture.runs[r]
    members = batch['run'] == r
    part = {name: array[members] for name, array in batch.items()}
    assert_segments_are_dopamines(
      part, lambda suffix, run=run: oracle(run.game, run.name, suffix)
    )
  mixture.close()


def test_equal_weights_draw_every_game_as_often(roots):
  mixture = ReplayMixture(
    str(roots['store']), batch_size=256, seed=2, games=['Pong', 'Breakout']
  )
  assert mixture.games == ['Breakout', 'Pong']
  counts = np.zeros(2)
  runs = np.zeros(len(mixture.runs))
  for batch in mixture.batches(20):
    counts += np.bincount(batch['game_id'], minlength=2)
    runs += np.bincount(batch['run'], minlength=len(mixture.runs))
  assert stats.chisquare(counts).pvalue > 1e-3, counts
  # Within Pong, runs in proportion to their valid transitions.
  chance = mixture.run_probabilities()
  valid = np.array([s.num_valid_transitions for s in mixture._samplers], float)
  np.testing.assert_allclose(
    chance, [0.5, *(0.5 * valid[1:] / valid[1:].sum())]
  )
  assert stats.chisquare(runs, chance * runs.sum()).pvalue > 1e-3, runs
  mixture.close()


def test_weights_by_transitions_or_given(roots):
  by_size = ReplayMixture(str(roots['store']), weights='transitions', seed=0)
  valid = np.array([s.num_valid_transitions for s in by_size._samplers], float)
  np.testing.assert_allclose(by_size.run_probabilities(), valid / valid.sum())
  by_size.close()
  given = ReplayMixture(
    str(roots['store']),
    weights={'Pong': 2, 'Breakout': 1, 'MsPacman': 1},
    seed=0,
  )
  chance = given.run_probabilities()
  np.testing.assert_allclose(chance[2:].sum(), 0.5)
  np.testing.assert_allclose(chance[:2], [0.25, 0.25])
  given.close()
  with pytest.raises(ValueError, match="missing: \\['MsPacman'\\]"):
    ReplayMixture(str(roots['store']), weights={'Pong': 1, 'Breakout': 1})


@pytest.mark.parametrize('kind', ['files', 'store'])
def test_seeded_mixtures_repeat_their_batches_on_any_threads(roots, kind):
  """The runs sampled side by side on 3 threads give what one thread
  gives, over several stages of batches drawn ahead (8 batches each), the
  staged arrays reused."""
  first, second = (
    ReplayMixture(
      str(roots[kind]), seed=5, batch_size=64, sampling_threads=threads
    )
    for threads in (1, 3)
  )
  for a, b in zip(first.batches(20), second.batches(20), strict=True):
    assert a.keys() == b.keys()
    for name in a:
      np.testing.assert_array_equal(a[name], b[name], err_msg=name)
  first.close()
  second.close()


@pytest.mark.parametrize(
  'kind, arguments',
  [
    ('files', {'num_buffers_to_load': 1, 'reload_every': 3}),
    ('store', {'segment_length': 4}),
  ],
)
def test_a_restarted_mixture_gives_what_the_uninterrupted_one_gives(
  roots, kind, arguments
):
  """Killed after batch 5 (mid-stage, between reloads), resumed from its
  state through JSON: batches 6.. are the uninterrupted mixture's."""
  arguments = dict(arguments, batch_size=8, seed=6)
  with ReplayMixture(str(roots[kind]), **arguments) as uninterrupted:
    expected = [dict(b) for b in uninterrupted.batches(11)]
  with ReplayMixture(str(roots[kind]), **arguments) as first:
    for _ in first.batches(5):
      pass
    saved = json.loads(json.dumps(first.state_dict()))
  with ReplayMixture(str(roots[kind]), **arguments) as restarted:
    restarted.load_state_dict(saved)
    resumed = list(restarted.batches(6))
    with pytest.raises(ValueError, match='a mixture of 4 runs, for one of 2'):
      ReplayMixture(
        str(roots[kind]), games='Pong', **arguments
      ).load_state_dict(saved)
  for got, want in zip(resumed, expected[5:], strict=True):
    for name in want:
      np.testing.assert_array_equal(got[name], want[name], err_msg=name)
  assert len({tuple(b['indices'].ravel()) for b in expected}) == 11


@pytest.mark.parametrize(
  'kind, data, arguments',
  [
    ('mixture', 'files', {'num_buffers_to_load': 1, 'reload_every': 3}),
    ('segments', 'store', {'segment_length': 4}),
  ],
)
def test_a_stateful_loader_resumes_mixtures_and_segments_exactly(
  roots, kind, data, arguments, tmp_path
):
  """Over 2 DataLoader workers, resumed in a fresh process."""
  data = roots[data] if kind == 'mixture' else roots[data] / 'Pong' / '1'
  resumed_loader.assert_resumes_exactly(
    {
      'kind': kind,
      'data': str(data),
      'arguments': dict(arguments, batch_size=8, seed=4),
      'num_workers': 2,
    },
    tmp_path,
  )


def test_held_batches_are_never_overwritten(roots):
  """A batch is a view of staged rows: new stages reuse only free arrays."""
  mixture = ReplayMixture(str(roots['store']), seed=2, batch_size=16)
  held = [mixture.sample() for _ in range(3)]
  copies = [{k: v.copy() for k, v in batch.items()} for batch in held]
  for size in (16, 7, 16) * 10:  # Several stages, and other batch sizes.
    assert len(mixture.sample(size)['indices']) == size
  for batch, copy in zip(held, copies, strict=True):
    for name in batch:
      np.testing.assert_array_equal(batch[name], copy[name], err_msg=name)
  mixture.close()


def test_runs_of_dopamine_files_rotate_their_checkpoints(roots, caplog):
  """Each run holds num_buffers_to_load checkpoints, a new random set every
  reload_every batches; unbound, it holds all it has (here 2), silently."""
  caplog.set_level(logging.INFO)
  with ReplayMixture(str(roots['files']), batch_size=8, seed=0) as mixture:
    assert [s.loaded_suffixes for s in mixture._samplers] == [[0, 1]] * 4
  assert 'num_buffers_to_load' not in caplog.text
  with ReplayMixture(
    str(roots['files']),
    games='Pong',
    num_buffers_to_load=1,
    reload_every=2,
    batch_size=8,
    seed=0,
  ) as mixture:
    # {run: the checkpoint each period of 2 batches drew from}.
    held = {0: [], 1: []}
    for period in range(12):
      drawn = {0: set(), 1: set()}
      for batch in mixture.batches(2):
        for run, suffix in zip(batch['run'], batch['suffix'], strict=True):
          drawn[int(run)].add(int(suffix))
      for run, suffixes in drawn.items():
        assert len(suffixes) == 1, (period, drawn)  # One set at a time.
        held[run] += suffixes
  assert all(set(suffixes) == {0, 1} for suffixes in held.values()), held
  assert (
    '2 of 2 runs hold a random set of their checkpoints at a time '
    '(num_buffers_to_load): a new set every 2 batches (reload_every)'
  ) in caplog.text


def test_arguments_as_a_user_means_them(roots, tmp_path, caplog):
  """One game or run named alone; unknown games listed; empty runs named."""
  store = roots['store']
  with ReplayMixture(str(store), games='Pong', runs=2, seed=0) as mixture:
    assert [(r.game, r.name) for r in mixture.runs] == [('Pong', '2')]
  with pytest.raises(ValueError) as raised:
    ReplayMixture(str(store), games=['pong'])
  assert str(raised.value) == (
    f'{store}: no runs of pong (runs=None); it holds Breakout, MsPacman, Pong'
  )
  root = tmp_path / 'root'
  shutil.copytree(store / 'Breakout', root / 'Breakout')
  (root / 'Breakout' / '2').mkdir()
  with ReplayMixture(str(root), seed=0) as mixture:
    assert [r.name for r in mixture.runs] == ['1']
  assert (
    f'Skipping {root / "Breakout" / "2"}: an empty directory, no run'
  ) in caplog.text


@pytest.mark.parametrize('game', ['Pong', 'Breakout', 'MsPacman', 'Seaquest'])
def test_the_full_action_map_is_ales_minimal_set(game):
  """The map's action names are those Dopamine's environment plays."""
  import ale_py

  environment = atari_lib.create_atari_environment(game)
  meanings = environment.environment.unwrapped.get_action_meanings()
  mapped = ale_games.minimal_action_set(game)
  assert [ale_py.Action(int(a)).name for a in mapped] == meanings
  assert len(set(mapped.tolist())) == len(mapped)
  assert mapped.max() < ale_games.FULL_ACTIONS


def test_legal_actions_and_a_mapping_of_runs(roots):
  files = roots['files']
  mixture = ReplayMixture(
    {
      'Pong': [str(files / 'Pong' / '2')],
      'Breakout': str(files / 'Breakout' / '1'),
    },
    action_space='full',
    seed=0,
  )
  assert [r.name for r in mixture.runs] == ['1', '2']
  assert mixture.legal_actions.shape == (2, 18)
  assert mixture.legal_actions.sum(axis=1).tolist() == [4, 6]
  batch = mixture.sample()
  assert mixture.legal_actions[batch['game_id'], batch['action']].all()
  mixture.close()


def test_a_damaged_run_fails_the_batch_from_a_sampling_thread(roots, tmp_path):
  """A unit damaged in one run of a store: the run's sampling thread finds
  it, the caller gets its CheckpointError naming the file, and the stream's
  place is the one before the failed batch."""
  shutil.copytree(roots['store'], tmp_path / 'store')
  units = tmp_path / 'store' / 'MsPacman' / '1' / 'checkpoint_1'
  units = units / 'observation.units'
  data = bytearray(units.read_bytes())
  for at in range(len(data) // 8, len(data), len(data) // 8):
    data[at] ^= 0x10  # A bit in every eighth of the file's units.
  units.write_bytes(bytes(data))
  mixture = ReplayMixture(
    str(tmp_path / 'store'), batch_size=64, seed=0, sampling_threads=2
  )
  with pytest.raises(CheckpointError) as raised:
    for _ in range(50):
      before = mixture.state_dict()
      mixture.sample()
  assert raised.value.path.endswith('MsPacman/1/checkpoint_1/observation.units')
  # The stream is back where it stood before the failed batch.
  assert mixture.state_dict() == before
  mixture.close()


def test_bad_mixtures_name_their_directories(roots, tmp_path):
  files = roots['files']
  with pytest.raises(ValueError, match='no runs of Seaquest'):
    ReplayMixture(str(files), games=['Seaquest'])
  with pytest.raises(ValueError, match='holds Pong, listed as Breakout'):
    ReplayMixture({'Breakout': str(files / 'Pong' / '1')})
  # A folder named like no ALE game.
  shutil.copytree(files / 'Pong' / '1', tmp_path / 'unknown' / 'Pongg' / '1')
  with pytest.raises(ValueError, match="'Pongg' is not a game ALE knows"):
    ReplayMixture(str(tmp_path / 'unknown'))
  # Pong's 6 actions filed as Breakout, which has 4.
  shutil.copytree(
    files / 'Pong' / '1', tmp_path / 'misfiled' / 'Breakout' / '1'
  )
  mixture = ReplayMixture(
    str(tmp_path / 'misfiled'), action_space='full', batch_size=256, seed=0
  )
  with pytest.raises(CheckpointError, match='Breakout has 4 actions') as raised:
    mixture.sample()
  assert raised.value.path.endswith('misfiled/Breakout/1')
  mixture.close()
  # Observations of another shape: CartPole filed under an ALE game's name.
  (tmp_path / 'shapes' / 'Asterix' / '1').mkdir(parents=True)
  dopamine_data.write_cartpole_run(tmp_path / 'shapes' / 'Asterix' / '1', 300)
  shutil.copytree(files / 'Pong' / '1', tmp_path / 'shapes' / 'Pong' / '1')
  with pytest.raises(ValueError, match='different observations') as raised:
    ReplayMixture(str(tmp_path / 'shapes'))
  assert 'shapes/Asterix/1' in str(raised.value)


def test_dataloader_workers_stream_the_mixtures_of_their_seeds(roots):
  """Each worker samples the mixture seeded with its own stream."""
  torch = pytest.importorskip('torch')
  from fixed_replay import batches
  from fixed_replay.torch import MixtureDataset

  root = str(roots['store'])
  arguments = {'batch_size': 16, 'action_space': 'full'}
  dataset = MixtureDataset(root, num_batches=4, seed=3, **arguments)
  loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
  items = [{k: v.numpy() for k, v in b.items()} for b in loader]
  assert len(items) == 4
  for worker in (0, 1):
    expected = ReplayMixture(
      root, seed=batches.stream_seed(3, worker), **arguments
    )
    for item, want in zip(items[worker::2], expected.batches(2), strict=True):
      assert item.keys() == want.keys()
      for name in want:
        np.testing.assert_array_equal(item[name], want[name], err_msg=name)
    expected.close()
  dataset.close()


def test_every_pass_over_a_mixture_is_new_and_repeats_under_its_seed(roots):
  """MixtureDataset (2 workers, new ones each pass) and ReplayBatches:
  a second pass draws other batches, and the same seed both passes again."""
  torch = pytest.importorskip('torch')
  from fixed_replay.jax_batches import ReplayBatches
  from fixed_replay.torch import MixtureDataset

  def passes(make, passes=2):
    dataset = make()
    if isinstance(dataset, MixtureDataset):
      loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=2
      )
    else:
      loader = dataset
    drawn = [
      np.stack([np.asarray(b['indices']) for b in loader])
      for _ in range(passes)
    ]
    dataset.close()
    return drawn

  for make in (
    lambda: MixtureDataset(
      str(roots['store']), num_batches=4, batch_size=8, seed=2
    ),
    lambda: ReplayBatches(
      str(roots['store'] / 'Pong' / '1'), num_batches=3, batch_size=8, seed=2
    ),
  ):
    first, second = passes(make)
    assert not np.array_equal(first, second)
    again = passes(make)
    np.testing.assert_array_equal(again[0], first)
    np.testing.assert_array_equal(again[1], second)


@pytest.mark.parametrize('segment_length', [None, 5])
def test_torchrl_tensordicts_carry_the_game(roots, segment_length):
  pytest.importorskip('torchrl')
  from fixed_replay.torchrl import FixedMixtureDataset

  dataset = FixedMixtureDataset(
    str(roots['store']), segment_length=segment_length, batch_size=8, seed=4
  )
  expected = ReplayMixture(
    str(roots['store']), segment_length=segment_length, batch_size=8, seed=4
  ).sample()
  td = dataset.sample()
  size = (8,) if segment_length is None else (8, segment_length)
  assert tuple(td.batch_size) == size
  for key in ('game_id', 'run'):
    assert tuple(td[key].shape) == size
    np.testing.assert_array_equal(
      td[key].numpy().reshape(8, -1)[:, 0], expected[key]
    )
  dataset.close()


def test_plain_jax_batches_carry_the_game(roots):
  pytest.importorskip('jax')
  from fixed_replay import jax_batches

  mixture = ReplayMixture(str(roots['store']), batch_size=8, seed=6)
  expected = ReplayMixture(str(roots['store']), batch_size=8, seed=6)
  placed = list(jax_batches.prefetch_to_device(mixture.batches(2)))
  for batch, want in zip(placed, expected.batches(2), strict=True):
    assert list(batch) == list(want)
    for name in want:
      np.testing.assert_array_equal(np.asarray(batch[name]), want[name])
  mixture.close()
  expected.close()


def test_the_multi_game_example_trains_one_network_on_three_games(roots):
  """examples/multi_game_dqn.py as a user runs it, in a fresh process."""
  pytest.importorskip('torch')
  import os
  import subprocess
  import sys

  example = os.path.join(
    os.path.dirname(os.path.dirname(__file__)), 'examples', 'multi_game_dqn.py'
  )
  completed = subprocess.run(
    [
      sys.executable,
      example,
      f'--data={roots["store"]}',
      '--num_updates=200',
      '--log_every=100',
      '--batch_size=16',
    ],
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert completed.returncode == 0, completed.stderr[-3000:]
  assert 'update 200/200' in completed.stderr
  lines = completed.stdout.strip().splitlines()[-3:]
  assert [line.split(':')[0] for line in lines] == [
    'loss Breakout',
    'loss MsPacman',
    'loss Pong',
  ]
  assert all(0 <= float(line.split(':')[1]) < 10 for line in lines), lines


def _assert_one_model_from_each_ranks_stream(store, places):
  """The example's 'rank r of 2: first rows [...], parameter checksum c'
  lines: one checksum (one model), and each rank's first rows its own
  stream's (ranks.rank_seed of the seed, 0)."""
  from fixed_replay import ranks

  assert [p.split(':')[0] for p in places] == ['rank 0 of 2', 'rank 1 of 2']
  checksums = {p.split('parameter checksum ')[1] for p in places}
  assert len(checksums) == 1, places  # One model: DDP kept them equal.
  for rank, place in enumerate(places):
    mixture = ReplayMixture(
      str(store),
      action_space='full',
      batch_size=8,
      update_horizon=1,
      gamma=0.99,
      seed=ranks.rank_seed(0, rank, 2),
    )
    rows = next(mixture.batches(1))['indices'][:4].tolist()
    assert f'first rows {rows},' in place, (rank, place)
    mixture.close()


def _torchrun_multi_game(*flags):
  """examples/multi_game_dqn.py under torchrun, 2 CPU processes (gloo, on
  127.0.0.1); its standard output's lines."""
  pytest.importorskip('torch')
  import socket
  import subprocess
  import sys

  with socket.socket() as probe:  # A free port for the rendezvous.
    probe.bind(('127.0.0.1', 0))
    port = probe.getsockname()[1]
  completed = subprocess.run(
    [
      sys.executable,
      '-m',
      'torch.distributed.run',
      '--nnodes=1',
      '--nproc_per_node=2',
      '--master_addr=127.0.0.1',
      f'--master_port={port}',
      os.path.join(ROOT, 'examples', 'multi_game_dqn.py'),
      *flags,
    ],
    capture_output=True,
    text=True,
    timeout=300,
    env=dict(os.environ, GLOO_SOCKET_IFNAME='lo', OMP_NUM_THREADS='1'),
  )
  # Where a rank crashed, Python's report of it, not only the launcher's.
  fatal = completed.stderr.find('Fatal Python error')
  failure = completed.stderr[max(fatal, 0) :][:3000] + completed.stderr[-2000:]
  assert completed.returncode == 0, failure
  return completed.stdout.splitlines(), completed.stderr


def test_the_multi_game_example_trains_one_network_under_torchrun(roots):
  """Each rank draws its rank's stream into one DDP network."""
  lines, _ = _torchrun_multi_game(
    f'--data={roots["store"]}',
    '--num_updates=20',
    '--log_every=10',
    '--batch_size=8',
  )
  places = sorted(line for line in lines if line.startswith('rank '))
  _assert_one_model_from_each_ranks_stream(roots['store'], places)
  assert [line.split(':')[0] for line in lines if line.startswith('loss')] == [
    'loss Breakout',
    'loss MsPacman',
    'loss Pong',
  ]


def test_the_multi_game_example_resumes_exactly_under_torchrun(roots, tmp_path):
  """Saved at update 6 and resumed under torchrun (2 ranks, a DataLoader
  worker each), every rank ends (update 12) with the uninterrupted run's
  network and loader state: it drew the same batches."""
  torch = pytest.importorskip('torch')
  flags = [
    f'--data={roots["store"]}',
    '--num_updates=12',
    '--log_every=6',
    '--batch_size=8',
    '--num_workers=1',
    '--save_every=6',
  ]
  whole, resumed = tmp_path / 'whole', tmp_path / 'resumed'
  _torchrun_multi_game(*flags, f'--checkpoint_dir={whole}')
  resumed.mkdir()
  for rank in (0, 1):
    shutil.copy(whole / f'update_6.rank_{rank}.pt', resumed)
  _, log = _torchrun_multi_game(
    *flags, f'--checkpoint_dir={resumed}', '--resume'
  )
  assert 'Rank 1 resumed from' in log
  for rank in (0, 1):
    want, got = (
      torch.load(run / f'update_12.rank_{rank}.pt') for run in (whole, resumed)
    )
    assert str(got['loader']) == str(want['loader'])
    for key, value in want['q_network'].items():
      assert torch.equal(got['q_network'][key], value), key
  start = torch.load(whole / 'update_6.rank_0.pt')['q_network']
  assert any(not torch.equal(start[k], v) for k, v in want['q_network'].items())


@pytest.mark.slow
def test_the_multi_game_example_trains_one_network_on_ray_train(
  roots, tmp_path
):
  """examples/multi_game_dqn.py --ray_workers=2: a TorchTrainer of 2 CPU
  workers on a private Ray on 127.0.0.1, each drawing its rank's stream."""
  pytest.importorskip('ray.train')
  import subprocess
  import sys

  completed = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, 'examples', 'multi_game_dqn.py'),
      f'--data={roots["store"]}',
      '--num_updates=20',
      '--batch_size=8',
      '--ray_workers=2',
      f'--ray_storage={tmp_path}',
    ],
    capture_output=True,
    text=True,
    timeout=300,
    env=dict(os.environ, GLOO_SOCKET_IFNAME='lo'),
  )
  assert completed.returncode == 0, completed.stderr[-3000:]
  lines = completed.stdout.splitlines()
  places = [line for line in lines if line.startswith('rank ')]
  _assert_one_model_from_each_ranks_stream(roots['store'], places)


def test_inspect_lists_a_roots_games_and_what_is_missing(roots, tmp_path):
  import subprocess
  import sys

  def inspect(root, *flags):
    return subprocess.run(
      [sys.executable, '-m', 'fixed_replay.cli', 'inspect', str(root), *flags],
      capture_output=True,
      text=True,
    )

  listed = inspect(roots['files'])
  assert listed.returncode == 0, listed.stderr[-2000:]
  assert '3 game(s), 4 run(s)' in listed.stdout
  assert listed.stdout.count('Dopamine') == 4
  assert 'missing: Breakout lacks run(s) 2' in listed.stdout
  # A store root with one checkpoint gone and a game lacking a run.
  root = tmp_path / 'stores'
  shutil.copytree(roots['store'], root)
  shutil.rmtree(root / 'Pong' / '2' / 'checkpoint_1')
  shutil.copytree(root / 'Pong' / '1', root / 'Pong' / '3')
  damaged = inspect(root)
  assert damaged.returncode == 0, damaged.stderr[-2000:]
  assert damaged.stdout.count('compact store') == 5
  assert 'missing: Breakout lacks run(s) 2, 3' in damaged.stdout
  assert 'differs: Pong/2 has 1 checkpoints' in damaged.stdout
  assert 'Checkpoints counted, not read: --verify checks' in damaged.stdout
  # --verify reads every run: a truncated unit file fails it, named.
  units = root / 'Pong' / '1' / 'checkpoint_1' / 'observation.units'
  units.write_bytes(units.read_bytes()[:-100])
  (root / 'MsPacman' / '2').mkdir()  # A run folder with no data.
  verified = inspect(root, '--verify')
  assert verified.returncode == 1, verified.stderr[-2000:]
  assert verified.stdout.count(', verified') == 4, verified.stdout
  assert 'Pong             1                2  compact store, DAMAGED' in (
    verified.stdout
  )
  assert f'{units}: damaged: ' in verified.stderr
  assert f'Skipping {root / "MsPacman" / "2"}: an empty directory' in (
    verified.stderr
  )
  # Not a root of runs: the unknown layout, as before.
  (tmp_path / 'empty' / 'x').mkdir(parents=True)
  unknown = inspect(tmp_path / 'empty')
  assert unknown.returncode == 1
  assert 'no known layout' in unknown.stderr


def test_convert_a_root_of_games_into_the_same_layout(roots, tmp_path):
  import subprocess
  import sys

  def convert_cli(*args):
    return subprocess.run(
      [sys.executable, '-m', 'fixed_replay.cli', 'convert', *map(str, args)],
      capture_output=True,
      text=True,
    )

  destination = tmp_path / 'games'
  done = convert_cli(
    roots['files'],
    destination,
    '--games=Pong,Breakout',
    '--runs=1',
    '--workers=1',
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert sorted(os.listdir(destination)) == ['Breakout', 'Pong']
  assert os.listdir(destination / 'Pong') == ['1']
  # Each store records its own game, and each line its own figures.
  for game in ('Breakout', 'Pong'):
    for checkpoint in ('checkpoint_0', 'checkpoint_1'):
      manifest = destination / game / '1' / checkpoint / 'manifest.json'
      assert json.loads(manifest.read_text())['game'] == game
  assert done.stdout.count(f'; {ROWS * 2:,} frames\n') == 2, done.stdout
  assert f'2 runs: {ROWS * 4:,} frames in ' in done.stdout
  with ReplayMixture(str(destination), batch_size=8, seed=0) as mixture:
    assert [(r.game, r.name) for r in mixture.runs] == [
      ('Breakout', '1'),
      ('Pong', '1'),
    ]
    mixture.sample()
  with pytest.raises(ValueError, match='holds Pong, listed as Breakout'):
    ReplayMixture({'Breakout': str(destination / 'Pong' / '1')})
  # Training on one of them evaluates in its game, not the config's Pong.
  trained = subprocess.run(
    [
      sys.executable,
      '-m',
      'fixed_replay.cli',
      'train',
      f'--replay_dir={destination / "Breakout" / "1"}',
      f'--base_dir={tmp_path / "train"}',
      f'--gin_files={os.path.join(ROOT, "configs", "dqn.gin")}',
      *(f'--gin_bindings={b}' for b in ATARI_TINY),
    ],
    capture_output=True,
    text=True,
  )
  assert trained.returncode == 0, trained.stderr[-3000:]
  assert "Evaluating in Breakout, the data's game" in trained.stderr
  refused = convert_cli(
    roots['files'] / 'Pong' / '1', tmp_path / 'one', '--games=Pong'
  )
  assert refused.returncode != 0
  assert '--games and --runs select runs under a ROOT' in refused.stderr
  # A usage error is its one line and where the help is, not the help.
  unknown = convert_cli(roots['files'], tmp_path / 'none', '--games=Tetris')
  assert unknown.returncode == 1
  assert unknown.stderr.splitlines()[-2:] == [
    f'fixed-replay convert: {roots["files"]}: no runs of Tetris (runs=None); '
    'it holds Breakout, MsPacman, Pong',
    '(fixed-replay convert --help lists its flags)',
  ]
  assert 'USAGE' not in unknown.stdout + unknown.stderr
