"""One trial of a sweep: a seeded FixedReplayRunner run in its own directory.

A trial is what `fixed-replay train` runs, for one (game, run, agent, seed),
in `BASE/<game>/<run>/<agent>/seed_<seed>/`. Next to Dopamine's
`checkpoints/` and `logs/` the directory holds

* `trial.log`: everything the trial's process printed, every attempt
  appended (local directories only);
* `sweep_trial.json`: the trial's configuration and one record per attempt
  (host, start iteration, outcome, error), written atomically. A trial is
  done when its status there is "done" for the same configuration.

`run_trial` is what a Ray worker executes; it imports TensorFlow, Dopamine
and the agent only there, never in the process that plans the sweep.
"""

import contextlib
import dataclasses
import datetime
import json
import os
import random
import re
import resource
import socket
import sys
import time

from absl import logging
import numpy as np

from fixed_replay import gin_files as gin_files_lib
from fixed_replay.io import files as storage

STATE_FILE = 'sweep_trial.json'
LOG_FILE = 'trial.log'
_SENTINEL = re.compile(r'^sentinel_checkpoint_complete\.(\d+)$')
# Characters of an error kept in the state file (the log has all of it).
_MAX_ERROR_CHARS = 4000


@dataclasses.dataclass(frozen=True)
class Trial:
  """One FixedReplayRunner run of a sweep, placeholders already filled.

  Attributes:
    game: str, e.g. 'Pong' (the directory name and, for Atari, the game).
    run: str, the dataset run, e.g. '1'.
    agent: str, a key of fixed_replay.agents.AGENTS.
    seed: int.
    base_dir: str, the trial's own directory.
    replay_dir: str, its dataset.
    gin_files: tuple of str.
    gin_bindings: tuple of str, applied after the files.
  """

  game: str
  run: str
  agent: str
  seed: int
  base_dir: str
  replay_dir: str
  gin_files: tuple
  gin_bindings: tuple

  @property
  def key(self) -> str:
    return f'{self.game}/{self.run}/{self.agent}/seed_{self.seed}'

  def config(self) -> dict:
    """What must not change between attempts: the trial and its inputs.

    Gin files count by content, theirs and their includes', so editing a
    config or the base it includes is a change too.
    """
    return {
      'game': self.game,
      'run': self.run,
      'agent': self.agent,
      'seed': self.seed,
      'replay_dir': self.replay_dir,
      'gin_files': list(self.gin_files),
      'gin_file_sha256': [
        gin_files_lib.config_digest(path) for path in self.gin_files
      ],
      'gin_bindings': list(self.gin_bindings),
    }


def _now():
  return datetime.datetime.now().isoformat(timespec='seconds')


def read_state(trial_dir: str) -> dict | None:
  """Returns the trial's state dict, or None if it never started.

  Raises:
    ValueError: if the state file is not valid JSON.
  """
  path = storage.join(trial_dir, STATE_FILE)
  if not storage.exists(path):
    return None
  with storage.open_read(path) as f:
    text = f.read().decode('utf-8')
  try:
    return json.loads(text)
  except json.JSONDecodeError as error:
    raise ValueError(f'{path}: not valid JSON ({error})') from error


def write_state(trial_dir: str, state: dict) -> None:
  """Replaces the state file atomically (write, then rename)."""
  path = storage.join(trial_dir, STATE_FILE)
  temporary = f'{path}.tmp-{os.getpid()}'
  with storage.open_write(temporary) as f:
    f.write(json.dumps(state, indent=1, sort_keys=True).encode('utf-8'))
  storage.rename(temporary, path)


def config_changes(state: dict, config: dict) -> list[str]:
  """Names the config entries that differ from the state's; [] if none."""
  recorded = (state or {}).get('config')
  if recorded is None:
    return []
  return sorted(
    key
    for key in set(recorded) | set(config)
    if recorded.get(key) != config.get(key)
  )


def completed_iterations(trial_dir: str) -> int:
  """Iterations finished and checkpointed (what a resume starts from)."""
  directory = storage.join(trial_dir, 'checkpoints')
  if not storage.isdir(directory):
    return 0
  numbers = [
    int(m.group(1))
    for name in storage.listdir(directory)
    if (m := _SENTINEL.match(name))
  ]
  return max(numbers) + 1 if numbers else 0


def record_failure(trial: 'Trial', error_text: str, will_retry: bool) -> None:
  """Closes the trial's last attempt as failed (driver side, after it ends).

  The attempt's process may have died before writing anything, so a record
  is added when the last one is already closed.
  """
  state = read_state(trial.base_dir) or {'config': trial.config()}
  attempts = state.setdefault('attempts', [])
  if not attempts or 'outcome' in attempts[-1]:
    attempts.append({'started': None})
  attempts[-1].update(
    outcome='failed',
    finished=_now(),
    error=error_text[-_MAX_ERROR_CHARS:],
    completed_iterations=completed_iterations(trial.base_dir),
  )
  state['status'] = 'retrying' if will_retry else 'failed'
  storage.makedirs(trial.base_dir)
  write_state(trial.base_dir, state)


# ------------------------------------------------- inside the Ray worker


def run_trial(
  trial: 'Trial', num_cpus: float = 1.0, num_gpus: float = 0.0
) -> dict:
  """Runs (or resumes) one trial to its last iteration; returns timings.

  Args:
    trial: Trial.
    num_cpus: float, the CPUs Ray reserved: TensorFlow's thread pools get
      as many threads, so trials sharing a machine do not oversubscribe it.
    num_gpus: float, the GPU share Ray reserved; below 1 TensorFlow and JAX
      allocate GPU memory as needed, so trials can share a GPU.

  Returns:
    dict: seconds in this function, CPU seconds of the process (all its
    threads, imports included), seconds to import and build the runner, the
    iteration it started from and the number of iterations.
  """
  entered = time.monotonic()
  storage.makedirs(trial.base_dir)
  with _output_to(storage.join(trial.base_dir, LOG_FILE)):
    logging.info(
      'Trial %s on %s (pid %d)', trial.key, socket.gethostname(), os.getpid()
    )
    state = _start_attempt(trial)
    attempt = state['attempts'][-1]
    _limit_resources(num_cpus, num_gpus)
    try:
      runner = _build_runner(trial)
      built = time.monotonic()
      attempt['start_iteration'] = runner.start_iteration
      state['num_iterations'] = runner._num_iterations
      write_state(trial.base_dir, state)
      runner.run_experiment()
    except BaseException:
      # The driver records the failure; the log keeps the whole traceback.
      logging.exception('Trial %s failed', trial.key)
      raise
    attempt.update(
      outcome='done',
      finished=_now(),
      completed_iterations=completed_iterations(trial.base_dir),
    )
    state['status'] = 'done'
    write_state(trial.base_dir, state)
    logging.info('Trial %s done', trial.key)
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return {
    'seconds': time.monotonic() - entered,
    'cpu_seconds': usage.ru_utime + usage.ru_stime,
    'setup_seconds': built - entered,
    'start_iteration': attempt['start_iteration'],
    'num_iterations': state['num_iterations'],
  }


def _limit_resources(num_cpus, num_gpus) -> None:
  """Sizes TensorFlow and JAX to the trial's share; before they load."""
  threads = str(max(1, int(num_cpus)))
  os.environ.setdefault('TF_NUM_INTRAOP_THREADS', threads)
  os.environ.setdefault('TF_NUM_INTEROP_THREADS', threads)
  if 0 < num_gpus < 1:
    os.environ.setdefault('TF_FORCE_GPU_ALLOW_GROWTH', 'true')
    os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')


def _start_attempt(trial):
  """Records a new attempt; an unfinished earlier one was interrupted."""
  state = read_state(trial.base_dir) or {}
  state['config'] = trial.config()
  state['trial'] = trial.key
  attempts = state.setdefault('attempts', [])
  if attempts and 'outcome' not in attempts[-1]:
    attempts[-1]['outcome'] = 'interrupted'
  attempts.append(
    {'started': _now(), 'host': socket.gethostname(), 'pid': os.getpid()}
  )
  state['status'] = 'running'
  write_state(trial.base_dir, state)
  return state


def _build_runner(trial):
  """Seeds every source of randomness and creates the runner.

  The seed reaches Python's and NumPy's global generators (TF agents pick
  exploratory actions with `random`), the TF graph (network initialisation,
  in-graph sampling), JAX agents' `seed`, the replay buffers' `seed`
  (checkpoint choice and minibatches) and the evaluation environment.
  """
  from fixed_replay import agents

  # Imported so that both buffers' seed bindings name known gin classes.
  import fixed_replay.replay.compact_replay_buffer  # noqa: F401
  import fixed_replay.replay.fixed_replay_buffer  # noqa: F401
  from fixed_replay.training import run_experiment

  seed = trial.seed
  random.seed(seed)
  np.random.seed(seed)
  bindings = list(trial.gin_bindings) + [
    f'FixedReplayBuffer.seed = {seed}',
    f'CompactReplayBuffer.seed = {seed}',
  ]
  class_name = agents.AGENTS[trial.agent].partition(':')[2]
  if trial.agent.startswith('jax_'):
    bindings.append(f'{class_name}.seed = {seed}')
  else:
    import tensorflow as tf

    # Dopamine's TF agents run in graph mode; its seed is the graph's.
    tf.compat.v1.disable_v2_behavior()
    tf.compat.v1.set_random_seed(seed)
  runner = run_experiment.create_runner(
    trial.base_dir,
    agent_name=trial.agent,
    replay_dir=trial.replay_dir,
    gin_files=trial.gin_files,
    gin_bindings=bindings,
  )
  _seed_environment(runner.environment, seed)
  return runner


def _seed_environment(environment: str, seed) -> None:
  """Seeds the Gym/ALE environment under Dopamine's preprocessing wrapper."""
  inner = getattr(environment, 'environment', None)
  if inner is None or not hasattr(inner, 'reset'):
    logging.warning('Cannot seed %s: no inner Gym environment', environment)
    return
  inner.reset(seed=seed)


@contextlib.contextmanager
def _output_to(path: str):
  """Sends this process's stdout and stderr (C++ logs too) to a file."""
  if storage.is_remote(path):
    yield
    return
  sys.stdout.flush()
  sys.stderr.flush()
  log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
  saved = os.dup(1), os.dup(2)
  os.dup2(log_fd, 1)
  os.dup2(log_fd, 2)
  logging.use_absl_handler()
  logging.set_verbosity(logging.INFO)
  try:
    yield
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
    for fd in (log_fd, *saved):
      os.close(fd)
