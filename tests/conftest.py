"""Shared fixtures: checkpoints written by Dopamine itself, and oracles."""

import atexit
import multiprocessing
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(__file__))

# One JAX compilation cache for the session's processes: the xdist workers
# and every fresh process a test starts inherit these variables (JAX reads
# them at import), so the same network is compiled once per session rather
# than once per process. Set here, in the process that starts the workers,
# before they start; a cache the user set is kept.
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  _JAX_CACHE = tempfile.mkdtemp(prefix='fixed_replay_tests_jax_cache_')
  atexit.register(shutil.rmtree, _JAX_CACHE, ignore_errors=True)
  os.environ['JAX_COMPILATION_CACHE_DIR'] = _JAX_CACHE
  # Tiny budgets compile in well under JAX's 1 s threshold for caching.
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
  # Without a size limit JAX takes no lock, and writes an entry in place
  # (jax/_src/lru_cache.py): a process reading it mid-write loads a cut
  # executable and crashes (one JAX training run died of SIGSEGV at its
  # first train step so). A limit makes every read and write take the
  # cache's file lock; this one is never reached.
  os.environ.setdefault('JAX_COMPILATION_CACHE_MAX_SIZE', str(8 << 30))

# A fresh process that crashes prints every thread's Python stack.
os.environ.setdefault('PYTHONFAULTHANDLER', '1')

# Importing torchrl sets the default start method to spawn where none is
# set: after a TorchRL test, every DataLoader worker an xdist worker starts
# would import torch anew, seconds each (a 0.5 s test took 32 s in the
# suite). The suite keeps Linux's default, as a program does that does not
# import torchrl; tests that need spawn ask for it.
if multiprocessing.get_start_method(allow_none=True) is None:
  multiprocessing.set_start_method('fork')

# Sets up what TensorFlow must see before a test module imports it (legacy
# Keras, quiet logs). Not dopamine_data: it imports TensorFlow (4-5 CPU-s),
# which the xdist master, running no test, does not need; the fixtures and
# test modules import it.
import fixed_replay  # noqa: E402, F401
from fixed_replay import heavy_imports  # noqa: E402

# The workers import TensorFlow and JAX once each, as the commands do: with
# the collector paused, and what they left frozen (heavy_imports.py).
heavy_imports.install()


_WARM_KERNELS = pytest.StashKey()


def pytest_configure(config):
  """The session's process (not an xdist worker) compiles numba's kernels.

  In a process of its own, while the workers start: tests/warm_kernels.py.
  """
  if hasattr(config, 'workerinput'):
    return
  scratch = tempfile.mkdtemp(prefix='fixed_replay_tests_warm_kernels_')
  log = open(os.path.join(scratch, 'log'), 'w+')  # noqa: SIM115
  process = subprocess.Popen(
    [
      sys.executable,
      os.path.join(os.path.dirname(__file__), 'warm_kernels.py'),
      os.path.join(scratch, 'data'),
    ],
    stdout=log,
    stderr=subprocess.STDOUT,
  )
  config.stash[_WARM_KERNELS] = (process, log, scratch)


def pytest_unconfigure(config):
  process, log, scratch = config.stash.get(_WARM_KERNELS, (None, None, None))
  if process is None:
    return
  code = process.wait()
  if code:  # Only slower: the tests compile the kernels themselves.
    log.seek(0)
    sys.stderr.write(
      f'tests/warm_kernels.py exited {code}; its output:\n{log.read()[-3000:]}'
    )
  log.close()
  shutil.rmtree(scratch, ignore_errors=True)


# The slow tier (`-m slow`) beyond the tests marked where they are defined
# (test_dropin, test_demo, test_sweep, test_ray_convert): tests, or whole
# modules, whose fresh processes or waits cost tens of seconds each, and why.
# `./test.sh -m "not slow"` leaves them out; the full suite runs them.
SLOW = {
  'test_rlu_cli.py::test_run_all_converts_each_run_as_alone': (
    'converts every RL Unplugged run in fresh processes with worker pools'
  ),
  'test_rlu_cli.py::test_killed_dopamine_conversion_resumes_identical': (
    'kills a conversion mid-way and reruns it, two fresh processes'
  ),
  'test_rlu_cli.py::test_inspect_shards_verify': (
    'verifies every shard in a fresh process'
  ),
  'test_rlu_convert.py': (
    'its fixtures convert two RL Unplugged runs into both formats'
  ),
  'test_rlu_tfds.py': 'prepares a TFDS directory in a fresh process',
  'test_remote.py::test_every_tool_names_the_cause_in_bounded_time': (
    "waits out each tool's network timeout"
  ),
  'test_remote.py::test_cli_names_the_closed_bucket': (
    'fresh TensorFlow processes that wait on a closed bucket'
  ),
  'test_module_aliases.py::'
  'test_every_old_path_is_the_new_module_in_a_fresh_process': (
    'imports every module, TF and JAX, afresh'
  ),
  'test_generate.py::test_agent_policy_round_trip': (
    'trains and restores an agent in a fresh TensorFlow process'
  ),
  'test_jax_agents.py::test_atari_config_builds_and_trains': (
    'jits the Atari networks of every JAX config'
  ),
  'test_integrity.py::test_train_cli_names_the_damaged_file': (
    'a fresh TF process builds the Atari DQN before it reads the data'
  ),
  # Beyond what the core tier covers (the buffers against Dopamine's
  # oracle, the store, integrity, configs, every CLI command once):
  'test_examples.py': (
    'the single-file examples, each a fresh TensorFlow/JAX/PyTorch process'
  ),
  'test_train_on_store.py::test_batch_rl_config_trains_on_a_store': (
    'a second training run on a store, in a fresh process'
  ),
  'test_train_on_store.py::test_our_configs_train_on_a_store[jax_dqn]': (
    'a JAX training run on a store, in a fresh process (the TF one is core)'
  ),
  'test_quiet.py::test_generate_prints_no_third_party_noise': (
    'three fresh TensorFlow processes, quiet and verbose'
  ),
  'test_torch_dataset.py::test_the_dopamine_path_does_not_import_torch': (
    'a fresh TensorFlow process'
  ),
  'test_rlu_fields.py::test_inspect_shows_game_score_returns': (
    'seven inspect runs in fresh processes, two of them TensorFlow'
  ),
  'test_convert_robust.py::'
  'test_a_full_disk_fails_cleanly_and_the_rerun_completes': (
    'a conversion onto a small tmpfs and its rerun, fresh processes (the '
    'file size limit test, core, fails and reruns the same way)'
  ),
  'test_download.py::test_interrupted_download_resumes': (
    'kills a download mid-way and reruns it, two fresh processes'
  ),
  # Conversions on Ray (the [ray] extra): the local cluster and its workers.
  # The core tier keeps the sweep command's one run and `convert` without
  # Ray.
  'test_ray_convert.py::'
  'test_ray_store_is_the_local_store_and_a_rerun_skips_it': (
    'conversion tasks on the local Ray cluster'
  ),
  'test_ray_convert.py::test_a_failed_task_is_retried': (
    'conversion tasks on the local Ray cluster'
  ),
  'test_ray_convert.py::'
  'test_a_lasting_failure_names_the_file_and_keeps_the_rest': (
    'conversion tasks on the local Ray cluster'
  ),
  'test_ray_convert.py::test_cli_converts_a_game_directory_on_ray': (
    'starts a Ray cluster of its own'
  ),
}


# Modules whose module-scoped fixtures start fresh processes for all of the
# module's tests at once (training runs, conversions, a wheel build): one
# xdist worker runs each, since on two workers both would start them all.
WHOLE_MODULES = {
  'test_train_on_store.py': 'three Atari training runs on a store',
  'test_rlu_convert.py': 'two RL Unplugged runs converted both ways',
  'test_rlu_tfds.py': 'a TFDS directory prepared in a fresh process',
  'test_extras.py': 'the wheel, built once',
}


# First: xdist's worker reads the xdist_group markers in this same hook.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
  for item in items:
    name = item.path.name
    function = getattr(item, 'originalname', item.name)
    test = f'{name}::{item.name}'  # With its parameters, if any.
    if name in SLOW or f'{name}::{function}' in SLOW or test in SLOW:
      item.add_marker(pytest.mark.slow)
    if name in WHOLE_MODULES:
      item.add_marker(pytest.mark.xdist_group(name.removesuffix('.py')))
  # Modules with slow tests first, and in them xdist groups first (every test
  # of a module that has groups is in one, so modules stay whole and their
  # fixtures are set up once): xdist hands out the groups largest first, then
  # the other tests in this order, so a one-test group (the killed sweep) and
  # the slow tests start early instead of ending the run on one worker while
  # the other idles.
  slow = {item.path for item in items if item.get_closest_marker('slow')}
  items.sort(
    key=lambda item: (
      item.path not in slow,
      item.get_closest_marker('xdist_group') is None,
    )
  )


@pytest.fixture(scope='session')
def dopamine_dir(tmp_path_factory):
  """Four Dopamine-written Pong checkpoints and the buffers that wrote them.

  Suffix 0: not full (cursor in the middle); suffix 1: full, cursor inside
  the file; suffix 3: the published layout (full, cursor at the last row);
  suffix 7: full with the cursor inside the file and episode_end_indices
  holding cuts without a terminal.
  """
  import dopamine_data

  directory = tmp_path_factory.mktemp('dopamine')
  capacity = 1000
  writers = {
    0: dopamine_data.write_checkpoint(directory, 0, capacity, 600, seed=0),
    1: dopamine_data.write_checkpoint(directory, 1, capacity, 1400, seed=1),
    3: dopamine_data.write_published_checkpoint(
      directory, 3, capacity, index=1, seed=3
    ),
    7: dopamine_data.write_checkpoint(
      directory,
      7,
      capacity,
      2317,
      seed=2,
      terminal_prob=0.02,
      episode_end_prob=0.01,
    ),
  }
  return directory, capacity, writers


@pytest.fixture(scope='session')
def store(dopamine_dir, tmp_path_factory):
  """dopamine_dir's checkpoints converted once into a compact store.

  Shared: a test that damages files damages a copy.
  """
  from fixed_replay.convert import convert

  directory = tmp_path_factory.mktemp('compact')
  convert.convert(dopamine_dir[0], directory, workers=0)
  return directory


def _written_by_an_earlier_version(name, tmp_path_factory):
  """A copy of tests/data/NAME: dopamine_dir's checkpoints as an earlier
  fixed_replay converted them (they hold the same rows: dopamine_dir's
  writers are seeded)."""
  directory = tmp_path_factory.mktemp(name) / 'store'
  shutil.copytree(pathlib.Path(__file__).parent / 'data' / name, directory)
  return directory


@pytest.fixture(scope='session')
def blocks_store(tmp_path_factory):
  """Format version 1: blosc2 blocks of 16 frames (zstd, clevel 5).

  Written by `convert.convert(dopamine_dir, ConvertOptions(layout='blocks',
  block_rows=16))` at commit c9aed51, the last to write it; upgraded by
  `fixed-replay convert`.
  """
  return _written_by_an_earlier_version('compact_store_v1', tmp_path_factory)


@pytest.fixture(scope='session')
def units_v2_store(tmp_path_factory):
  """Format version 2: units as now, the rest unpacked.

  Written by `convert.convert(dopamine_dir)` at commit 502fd75.
  """
  return _written_by_an_earlier_version('compact_store_v2', tmp_path_factory)


@pytest.fixture(scope='session')
def packed_v3_store(tmp_path_factory):
  """Format version 3: a dictionary a checkpoint, the rest as now.

  Written by `convert.convert(dopamine_dir)` at commit adc5a91.
  """
  return _written_by_an_earlier_version('compact_store_v3', tmp_path_factory)


@pytest.fixture(scope='session')
def run_dictionary_v4_store(tmp_path_factory):
  """Format version 4: the run's dictionary, the other files packed.

  Written by `convert.convert(dopamine_dir)` at commit 7b7a8de.
  """
  return _written_by_an_earlier_version('compact_store_v4', tmp_path_factory)


@pytest.fixture(scope='session')
def plain_v5_store(tmp_path_factory):
  """Format version 5: every file plain, a file a table.

  Written by `convert.convert(dopamine_dir)` at commit ef1f0b1.
  """
  return _written_by_an_earlier_version('compact_store_v5', tmp_path_factory)


@pytest.fixture(scope='session')
def oracles(dopamine_dir):
  """get(suffix, update_horizon=1, gamma=0.99): Dopamine's own buffer.

  Each is loaded from dopamine_dir's files with Dopamine's `load`, once.
  """
  import dopamine_data

  directory, capacity, _ = dopamine_dir
  loaded = {}

  def get(suffix, update_horizon=1, gamma=0.99):
    key = (suffix, update_horizon, gamma)
    if key not in loaded:
      loaded[key] = dopamine_data.load_oracle(
        directory, suffix, capacity, update_horizon=update_horizon, gamma=gamma
      )
    return loaded[key]

  return get


@pytest.fixture(scope='session')
def local_ray():
  """The local Ray cluster (127.0.0.1, 2 CPUs) the in-process Ray tests share.

  Started once, on the xdist worker of the 'ray' group (tests using it must
  be in xdist_group('ray')); none of its processes may outlive it.
  """
  import ray_cluster

  with ray_cluster.running(num_cpus=2) as info:
    yield info


# Rows per CartPole checkpoint of cartpole_dir.
CARTPOLE_ROWS = 700


@pytest.fixture(scope='session')
def cartpole_dir(tmp_path_factory):
  """Two CartPole checkpoints written by Dopamine's buffer (random play)."""
  import dopamine_data

  directory = tmp_path_factory.mktemp('cartpole')
  dopamine_data.write_cartpole_run(directory, CARTPOLE_ROWS)
  return str(directory)


@pytest.fixture
def mixed_store(store, cartpole_dir, tmp_path):
  """The store with its checkpoint 1 replaced by a CartPole one."""
  import shutil

  from fixed_replay.convert import convert

  # CartPole's checkpoint 1 alone, converted into the Pong store (against
  # its run's dictionary) in place of Pong's.
  alone = tmp_path / 'cartpole_1'
  alone.mkdir()
  for name in os.listdir(cartpole_dir):
    if name.endswith('_ckpt.1.gz'):
      os.link(os.path.join(cartpole_dir, name), alone / name)
  mixed = tmp_path / 'mixed'
  shutil.copytree(store, mixed)
  shutil.rmtree(mixed / 'checkpoint_1')
  convert.convert(alone, mixed, workers=0)
  return mixed


# RL Unplugged runs for the conversion tests: (checkpoint, episode) per record
# of each shard. Run 1 is laid out as published (shard N = checkpoint N, in
# order); run 2 is not: shard 0 ends with checkpoint 1's first episode, shard
# 1 ends with checkpoint 2's first, and shard 2 holds its two in reverse.
RLU_LAYOUTS = {
  1: [[(0, 0), (0, 1), (0, 2)], [(1, 3), (1, 4)], [(2, 5), (2, 6), (2, 7)]],
  2: [[(0, 0), (0, 1), (1, 2)], [(1, 3), (1, 4), (2, 5)], [(2, 7), (2, 6)]],
}


@pytest.fixture(scope='session')
def rlu_dir(tmp_path_factory):
  """A directory of RL Unplugged shards of real Breakout play (two runs).

  Returns:
    (directory, episodes): episodes maps (run, checkpoint) to its
    rlu_data.PlayedEpisode list in episode_idx order (the oracle's input).
  """
  import rlu_data

  directory = tmp_path_factory.mktemp('rlu') / 'Breakout'
  directory.mkdir()
  played = rlu_data.play(8, max_steps=200, seed=0)
  episodes = {}
  for run, shards in RLU_LAYOUTS.items():
    for number, records in enumerate(shards):
      labelled = []
      for checkpoint, episode_idx in records:
        episode = rlu_data.relabel(played[episode_idx], checkpoint, episode_idx)
        labelled.append(episode)
        episodes.setdefault((run, checkpoint), []).append(episode)
      rlu_data.write_shard(
        rlu_data.shard_path(directory, run, number, len(shards)), labelled
      )
  for key in episodes:
    episodes[key].sort(key=lambda e: e.episode_idx)
  return directory, episodes
