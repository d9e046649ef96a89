"""Shared helpers of the benchmarks: the benchmark checkpoint and measuring.

The benchmark checkpoint is one Dopamine replay checkpoint of real Atari
frames (Breakout unless `--game` says otherwise) written by Dopamine's own
`OutOfGraphReplayBuffer.save`, laid out as the published DQN Replay Dataset is
(a full buffer, cursor at the last row). It is built once under
`benchmarks/data/` and reused.

Every measurement runs in a fresh spawned process so that its peak memory is
its own: the child does its imports, records its resident set size (RSS), runs
the timed call, then reads the kernel's high-water mark (VmHWM) of its RSS.

Run `python benchmarks/common.py [--rows=N] [--game=Breakout]` to build the
data alone.
"""

import dataclasses
import multiprocessing
import os
import pathlib
import resource
import shutil
import time
import zlib

from absl import app
from absl import flags
from absl import logging
import numpy as np

# Imported before anything may import Dopamine or TensorFlow: it sets them up
# (legacy Keras, the `baselines` placeholder; see fixed_replay/compat.py).
import fixed_replay  # noqa: F401
from fixed_replay import progress

BENCHMARK_DIR = pathlib.Path(__file__).resolve().parent
DATA_DIR = BENCHMARK_DIR / 'data'
FULL_ROWS = 1_000_000
OBSERVATION_SHAPE = (84, 84)
STACK_SIZE = 4
DEFAULT_GAME = 'Breakout'
# A random agent that changes its mind every frame makes the screen flicker
# in a way no trained agent does; holding each action a few steps is closer to
# how real replay data looks (and compresses).
MAX_ACTION_REPEAT = 6
# Dopamine's runner caps episodes at 27,000 steps; the dataset stores the cut
# as terminal.
MAX_EPISODE_STEPS = 27_000
GIB = 1 << 30


def checkpoint_dir(rows, data_dir=DATA_DIR, game=DEFAULT_GAME):
  """Returns where the benchmark checkpoint with `rows` rows lives."""
  return pathlib.Path(data_dir) / f'{game.lower()}_{rows}'


def is_complete(directory, rows):
  """True if `directory` holds checkpoint 0 with `rows` rows, cursor last."""
  from fixed_replay.errors import CheckpointError
  from fixed_replay.io import npy_stream
  from fixed_replay.sources.dopamine import checkpoints

  if not os.path.isdir(directory):
    return False
  try:
    complete, _ = checkpoints.scan_checkpoints(str(directory))
    if 0 not in complete:
      return False
    files = complete[0]
    headers = checkpoints.read_store_headers(files)
    add_count = int(npy_stream.read_rows(files.add_count_path))
  except CheckpointError as error:
    logging.warning('Benchmark data in %s is unusable: %s', directory, error)
    return False
  return headers['observation'].shape == (rows,) + OBSERVATION_SHAPE and (
    add_count == rows - 1
  )


def _fill_buffer(buffer, rows, seed, game):
  """Plays `game` at random into `buffer` until add_count == rows - 1.

  Rows are added as Dopamine's runner adds them: (observation, action,
  clipped reward, terminal), with the buffer's own zero padding at each
  episode start. An episode still running when `stack_size` rows remain is
  cut there (stored as terminal, as the dataset stores its 27k-step cuts), so
  that the last episode is padding plus one step and add_count stops exactly
  at the last row.

  Returns (episodes, env_steps); `seed` seeds the game and the policy.
  """
  from dopamine.discrete_domains import atari_lib

  env = atari_lib.create_atari_environment(game)
  env.environment.reset(seed=seed)
  rng = np.random.default_rng(seed)
  num_actions = env.action_space.n
  target = rows - 1
  episodes = env_steps = 0
  with progress.bar(
    target, f'Playing {game}', unit='row', unit_scale=True
  ) as bar:
    while buffer.add_count < target:
      if target - buffer.add_count < STACK_SIZE:
        raise RuntimeError(
          f'{target - buffer.add_count} rows left, too few for an episode '
          'start; an episode ended within its first stack_size steps'
        )
      observation = env.reset()[..., 0]
      episodes += 1
      action, repeat, steps, terminal = 0, 0, 0, False
      while not terminal:
        if repeat == 0:
          action = int(rng.integers(num_actions))
          repeat = int(rng.integers(1, MAX_ACTION_REPEAT + 1))
        repeat -= 1
        next_observation, reward, terminal, _ = env.step(action)
        steps += 1
        before = buffer.add_count
        left_after = target - before - (STACK_SIZE if steps == 1 else 1)
        terminal = (
          terminal or steps >= MAX_EPISODE_STEPS or left_after == STACK_SIZE
        )
        buffer.add(observation, action, np.clip(reward, -1, 1), terminal)
        bar.update(buffer.add_count - before)
        if buffer.add_count == target:
          break
        observation = next_observation[..., 0]
      env_steps += steps
  return episodes, env_steps


def _build(rows, seed, game, directory):
  """Writes the checkpoint into `directory` (a child process's job)."""
  from dopamine.tf.replay_memory import circular_replay_buffer

  buffer = circular_replay_buffer.OutOfGraphReplayBuffer(
    OBSERVATION_SHAPE,
    STACK_SIZE,
    rows,
    32,
    checkpoint_duration=10**9,  # save() must not delete older suffixes.
  )
  start = time.time()
  episodes, env_steps = _fill_buffer(buffer, rows, seed, game)
  logging.info(
    'Played %d episodes, %d steps in %.0f s; add_count %d, invalid_range %s',
    episodes,
    env_steps,
    time.time() - start,
    buffer.add_count,
    buffer.invalid_range,
  )
  start = time.time()
  logging.info('Saving with Dopamine (gzip level 9) to %s', directory)
  buffer.save(str(directory), 0)
  logging.info('Saved in %.0f s', time.time() - start)


def build_checkpoint(
  rows=FULL_ROWS, seed=0, data_dir=DATA_DIR, game=DEFAULT_GAME
):
  """Returns the directory of the benchmark checkpoint, writing it if needed.

  The checkpoint is written into a staging directory by a child process and
  renamed into place only once Dopamine's save() has returned, so an
  interrupted run never leaves a directory that looks complete.

  Returns:
    pathlib.Path of the directory holding checkpoint suffix 0, of `rows`
    rows (its capacity) of `game` played at random.

  Raises:
    RuntimeError: if a directory of that name exists but is not complete
      (it is left alone: remove it by hand).
  """
  directory = checkpoint_dir(rows, data_dir, game)
  if is_complete(directory, rows):
    logging.info('Reusing benchmark checkpoint %s', directory)
    return directory
  if directory.exists():
    raise RuntimeError(
      f'{directory} exists but is not a complete {rows}-row checkpoint; '
      'remove it to rebuild'
    )
  needed = rows * int(np.prod(OBSERVATION_SHAPE)) * 1.1 + GIB
  require_memory(needed)
  os.makedirs(data_dir, exist_ok=True)
  staging = directory.with_name(f'.{directory.name}.staging-{os.getpid()}')
  staging.mkdir()
  logging.info('Writing a %d-row %s checkpoint in %s', rows, game, staging)
  try:
    run_in_subprocess(_build, rows, seed, game, staging)
    if not is_complete(staging, rows):
      raise RuntimeError(f'{staging} is incomplete after writing')
    staging.rename(directory)
  finally:
    if staging.exists():
      shutil.rmtree(staging)
  logging.info('Benchmark checkpoint ready: %s', directory)
  return directory


def require_memory(num_bytes):
  """Raises RuntimeError unless the machine has `num_bytes` available."""
  import psutil

  available = psutil.virtual_memory().available
  if available < num_bytes:
    raise RuntimeError(
      f'needs {num_bytes / GIB:.1f} GiB free, only '
      f'{available / GIB:.1f} GiB available'
    )


def link_checkpoints(origin, store, suffixes, **fields):
  """store/checkpoint_<s>/ for each suffix: hard links of the stored
  checkpoint `origin`, each with its own manifest (`fields` changed)."""
  from fixed_replay.store import manifest as manifest_lib

  manifest = manifest_lib.read_manifest(origin)
  for suffix in suffixes:
    target = os.path.join(store, manifest_lib.checkpoint_dirname(suffix))
    if os.path.exists(target):
      continue
    os.makedirs(target)
    for name in os.listdir(origin):
      if name != manifest_lib.MANIFEST:
        os.link(os.path.join(origin, name), os.path.join(target, name))
    copy = dict(manifest, suffix=suffix, **fields)
    copy['source'] = dict(manifest['source'])
    copy['source']['files'] = {
      name.replace('.0.gz', f'.{suffix}.gz'): size
      for name, size in manifest['source']['files'].items()
    }
    manifest_lib.write_manifest(target, copy)


def load_average():
  """Returns the 1, 5 and 15 minute load averages as a short string."""
  one, five, fifteen = os.getloadavg()
  return f'load average {one:.2f} {five:.2f} {fifteen:.2f}'


def _status_bytes(field):
  """Returns a `Vm...` or `Rss...` field of /proc/self/status in bytes."""
  with open('/proc/self/status') as status:
    for line in status:
      if line.startswith(field + ':'):
        return int(line.split()[1]) * 1024
  raise RuntimeError(f'{field} not in /proc/self/status')


@dataclasses.dataclass
class Measurement:
  """One timed call in a fresh process.

  Attributes:
    wall_s: float, wall time of the call.
    rss_after_setup: int, bytes resident after the imports (setup).
    peak_rss: int, the process's peak resident bytes over its whole life.
    digest: whatever the `digest` function returned for the call's result.
    user_s: float, CPU seconds the call spent in user mode.
    system_s: float, CPU seconds in the kernel (mostly page faults: first
      touches of freshly allocated memory).
    page_faults: int, minor page faults during the call.
    anonymous: int, growth of the anonymous resident bytes (RssAnon: what
      the process allocated, not the file pages it maps) over the call.
  """

  wall_s: float
  rss_after_setup: int
  peak_rss: int
  digest: object
  user_s: float = 0.0
  system_s: float = 0.0
  page_faults: int = 0
  anonymous: int = 0

  @property
  def peak_increase(self):
    """Peak RSS above the RSS after imports: what the call itself costs."""
    return self.peak_rss - self.rss_after_setup


def _child(connection, verbosity, setup, function, args, digest):
  logging.set_verbosity(verbosity)
  try:
    setup()
    rss_after_setup = _status_bytes('VmRSS')
    anonymous = _status_bytes('RssAnon')
    usage = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    result = function(*args)
    wall_s = time.perf_counter() - start
    peak_rss = _status_bytes('VmHWM')
    anonymous = _status_bytes('RssAnon') - anonymous
    after = resource.getrusage(resource.RUSAGE_SELF)
    summary = digest(result) if digest else None
    connection.send(
      Measurement(
        wall_s,
        rss_after_setup,
        peak_rss,
        summary,
        user_s=after.ru_utime - usage.ru_utime,
        system_s=after.ru_stime - usage.ru_stime,
        page_faults=after.ru_minflt - usage.ru_minflt,
        anonymous=anonymous,
      )
    )
  except BaseException as error:  # Reported to the parent, then re-raised.
    connection.send(error)
    raise


def measure(setup, function, args=(), digest=None):
  """Runs `function(*args)` in a fresh process and measures it.

  Args:
    setup: picklable callable run first (its imports are not measured).
    function: picklable (module-level) callable to time.
    args: its arguments.
    digest: optional picklable callable mapping the result to a small
      picklable summary, computed after the timing.

  Returns:
    Measurement.

  Raises:
    RuntimeError: if the child fails or dies.
  """
  context = multiprocessing.get_context('spawn')
  receiver, sender = context.Pipe(duplex=False)
  process = context.Process(
    target=_child,
    args=(sender, logging.get_verbosity(), setup, function, args, digest),
  )
  process.start()
  sender.close()
  try:
    outcome = receiver.recv()
  except EOFError:
    outcome = None
  process.join()
  if isinstance(outcome, BaseException):
    raise RuntimeError(f'{function.__name__} failed: {outcome!r}') from outcome
  if outcome is None:
    raise RuntimeError(
      f'{function.__name__} died with exit code {process.exitcode}'
    )
  return outcome


def _no_setup():
  pass


def run_in_subprocess(function, *args):
  """Runs `function(*args)` in a fresh process; returns its Measurement."""
  return measure(_no_setup, function, args)


def array_digest(arrays, num_samples=64):
  """Summarises a dict of arrays so two results can be compared cheaply.

  Args:
    arrays: dict of name to np.ndarray (rows on the first axis).
    num_samples: rows to keep verbatim, evenly spaced, first and last included.

  Returns:
    dict of name to (dtype str, shape, crc32 of all bytes, sampled rows).
  """
  summary = {}
  for name, array in arrays.items():
    array = np.ascontiguousarray(array)
    rows = np.unique(np.linspace(0, len(array) - 1, num_samples).astype(int))
    samples = array[rows].copy() if len(array) else array.copy()
    summary[name] = (str(array.dtype), array.shape, zlib.crc32(array), samples)
  return summary


def assert_same_digest(expected, actual, what):
  """Raises AssertionError unless two array_digest results are equal."""
  if sorted(expected) != sorted(actual):
    raise AssertionError(
      f'{what}: arrays {sorted(actual)} != expected {sorted(expected)}'
    )
  for name, (dtype, shape, crc, samples) in expected.items():
    got_dtype, got_shape, got_crc, got_samples = actual[name]
    if (dtype, shape) != (got_dtype, got_shape):
      raise AssertionError(
        f'{what}: {name} is {got_dtype}{got_shape}, expected {dtype}{shape}'
      )
    np.testing.assert_array_equal(got_samples, samples, err_msg=what)
    if crc != got_crc:
      raise AssertionError(f'{what}: {name} differs (crc32)')


def format_bytes(num_bytes):
  return f'{num_bytes / GIB:.3f} GiB'


ROWS = flags.DEFINE_integer(
  'rows',
  FULL_ROWS,
  'Rows of the benchmark checkpoint (smaller for a quick trial; the README '
  'figures use 1,000,000).',
)
SEED = flags.DEFINE_integer('seed', 0, 'Seed of the game and the policy.')
GAME = flags.DEFINE_string(
  'game',
  DEFAULT_GAME,
  'Atari game of the benchmark checkpoint (the README figures use Breakout).',
)


def main(argv):
  del argv
  print(build_checkpoint(ROWS.value, SEED.value, game=GAME.value))


if __name__ == '__main__':
  app.run(main)
