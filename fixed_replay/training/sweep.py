"""Sweeps: games x runs x agents x seeds trials of offline training, on Ray.

`plan()` expands the grid into Trials, one directory each,
`BASE/<game>/<run>/<agent>/seed_<seed>/`, filling `{game}`, `{run}` and
`{agent}` in the dataset and gin file patterns (and in the bindings).
`run_sweep()` skips trials already done with the same configuration, runs
the others as Ray tasks with declared resources, one fresh process per
attempt (`trial.run_trial`: the runner resumes from its last Dopamine
checkpoint, so an interrupted trial never repeats a finished iteration),
retries failed attempts and returns what happened to each trial. When every
trial is done it returns without starting Ray.
"""

from collections.abc import Sequence
import contextlib
import dataclasses
import fcntl
import itertools
import os
import re
import time

from absl import logging

from fixed_replay import agents as agents_lib
from fixed_replay import gin_files as gin_files_lib
from fixed_replay import progress
from fixed_replay.io import files as storage
from fixed_replay.sources import layout
from fixed_replay.training import trial as trial_lib

PLACEHOLDERS = ('game', 'run', 'agent')
# Evaluation must play the trial's game: Dopamine's Atari environment takes
# it from this binding (configs default to Pong). Other environments ignore
# it. Bindings given by the user come after it and win.
GAME_BINDING = "atari_lib.create_atari_environment.game_name = '{game}'"
LOCK_FILE = '.sweep.lock'
_FIELD = re.compile(r'\{([^{}]*)\}')
_NAME = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.+-]*$')


def fill(pattern: str, game: str, run: str, agent: str) -> str:
  """Replaces {game}, {run} and {agent} in pattern; other text is kept."""
  for name, value in (('game', game), ('run', run), ('agent', agent)):
    pattern = pattern.replace('{' + name + '}', str(value))
  return pattern


def _check_placeholders(flag, pattern):
  """Raises ValueError on a {name} in a path that is not a placeholder."""
  unknown = sorted(set(_FIELD.findall(pattern)) - set(PLACEHOLDERS))
  if unknown:
    raise ValueError(
      f'--{flag}={pattern!r}: unknown placeholder(s) '
      f'{", ".join("{" + u + "}" for u in unknown)}; only {{game}}, {{run}} '
      'and {agent} are filled'
    )


def _check_names(flag, names):
  """Raises ValueError unless names are distinct, safe directory names."""
  if not names:
    raise ValueError(f'--{flag} is empty')
  bad = [n for n in names if not _NAME.match(str(n))]
  if bad:
    raise ValueError(
      f'--{flag}: {bad} cannot name a directory (letters, digits, _ . + -)'
    )
  if len(set(names)) != len(names):
    raise ValueError(f'--{flag} lists a value twice: {list(names)}')


def plan(
  base_dir: str,
  replay_dir: str,
  agents: Sequence[str],
  seeds: Sequence[int],
  games: Sequence[str] | None = None,
  runs: Sequence[str] = ('1',),
  gin_files: Sequence[str] = (),
  gin_bindings: Sequence[str] = (),
) -> list[trial_lib.Trial]:
  """Expands a sweep into its trials, checking every input first.

  Args:
    base_dir: str, the sweep's directory.
    replay_dir: str, pattern of each trial's dataset (run directory or
      replay_logs/), e.g. '/data/{game}/{run}'.
    agents: list of agent names (fixed_replay.agents.AGENTS).
    seeds: list of int.
    games: list of game names, e.g. ['Pong', 'Breakout'], or None for the
      one dataset replay_dir names (see `_one_dataset`).
    runs: list of run names, e.g. ['1', '2'].
    gin_files: list of gin file patterns, e.g. ['configs/{agent}.gin'].
    gin_bindings: list of gin bindings (placeholders filled as well).

  Returns:
    list of trial.Trial, in games, runs, agents, seeds order.

  Raises:
    ValueError: on an unknown agent or placeholder, a missing dataset or
      gin file, or a grid whose trials would share data by mistake.
  """
  if not base_dir:
    raise ValueError('--base_dir is required')
  if not replay_dir:
    raise ValueError('--replay_dir is required')
  # Workers need not share the driver's working directory.
  base_dir, replay_dir = _absolute(base_dir), _absolute(replay_dir)
  bind_game = games is not None
  if not bind_game:
    games, runs = _one_dataset(replay_dir, runs)
  games = [str(g) for g in games]
  runs = [str(r) for r in runs]
  _check_names('games', games)
  _check_names('runs', runs)
  _check_names('agents', list(agents))
  if not seeds or len(set(seeds)) != len(seeds):
    raise ValueError(f'--seeds must list distinct integers, got {seeds}')
  unknown = sorted(set(agents) - set(agents_lib.AGENTS))
  if unknown:
    raise ValueError(
      f'--agents: unknown agent(s) {unknown}; choose from '
      f'{sorted(agents_lib.AGENTS)}'
    )
  _check_placeholders('replay_dir', replay_dir)
  for pattern in gin_files:
    _check_placeholders('gin_files', pattern)
  for name, values in (('game', games), ('run', runs)):
    if len(values) > 1 and '{' + name + '}' not in replay_dir:
      raise ValueError(
        f'--replay_dir={replay_dir!r} has no {{{name}}}: all {len(values)} '
        f'{name}s would train on the same data'
      )
  trials = []
  for game, run, agent, seed in itertools.product(games, runs, agents, seeds):
    values, seed = dict(game=game, run=run, agent=agent), int(seed)
    directory = base_dir
    for part in (game, run, agent, f'seed_{seed}'):
      directory = storage.join(directory, part)
    bindings = [GAME_BINDING.format(game=game)] if bind_game else []
    bindings += [fill(binding, **values) for binding in gin_bindings]
    trials.append(
      trial_lib.Trial(
        **values,
        seed=seed,
        base_dir=directory,
        replay_dir=fill(replay_dir, **values),
        gin_files=tuple(
          _absolute(gin_files_lib.locate(fill(p, **values), missing_ok=True))
          for p in gin_files
        ),
        gin_bindings=tuple(bindings),
      )
    )
  _check_inputs_exist(trials)
  return trials


def _one_dataset(replay_dir, runs):
  """([game], [run]) naming the trials of a sweep without --games.

  The dataset is replay_dir itself (no {game} or {run} to fill). Its
  trials go to BASE/<game>/<run>/...: the data's game and run where its
  path says them (`/data/Pong/1`), else the dataset's directory name and
  the one --runs value. Training then evaluates in the data's own game.

  Raises:
    ValueError: if replay_dir has {game} or {run}, or runs lists several.
  """
  for name in ('game', 'run'):
    if '{' + name + '}' in replay_dir:
      raise ValueError(
        f'--replay_dir={replay_dir!r} has {{{name}}}: list the values with '
        f'--{name}s, or name one dataset'
      )
  runs = [str(r) for r in runs]
  if len(runs) != 1:
    raise ValueError(
      f'--runs={",".join(runs)} without --games: --replay_dir names one '
      'dataset'
    )
  game = layout.game_of(replay_dir)
  if game is None:
    return [layout.run_name(replay_dir)], runs
  return [game], [layout.run_name(replay_dir)]


def _absolute(path: str):
  path = str(path)
  return path if storage.is_remote(path) else os.path.abspath(path)


def _check_inputs_exist(trials):
  """Raises ValueError naming every dataset or gin file that is missing."""
  missing = []
  for path in sorted({t.replay_dir for t in trials}):
    if not storage.isdir(path):
      missing.append(f'dataset {path}: no such directory')
  for path in sorted({p for t in trials for p in t.gin_files}):
    if not storage.exists(path):
      missing.append(f'gin file {path}: no such file')
  if missing:
    raise ValueError('Missing sweep inputs:\n  ' + '\n  '.join(missing))


@dataclasses.dataclass
class SweepResult:
  """What a sweep invocation found and did.

  Attributes:
    trials: list of trial.Trial, the whole grid.
    done_before: list of keys already done when it started.
    finished: dict, key -> run_trial's result, for trials finished now.
    failed: dict, key -> error texts of every attempt, for trials that
      failed all their attempts.
    retried: dict, key -> error texts of failed attempts of trials that
      then finished.
    seconds: dict, key -> wall seconds of a finished trial's last attempt,
      from submission to result (Ray's scheduling and start-up included).
    wall_seconds: float.
  """

  trials: list
  done_before: list
  finished: dict = dataclasses.field(default_factory=dict)
  failed: dict = dataclasses.field(default_factory=dict)
  retried: dict = dataclasses.field(default_factory=dict)
  seconds: dict = dataclasses.field(default_factory=dict)
  wall_seconds: float = 0.0


def pending(
  trials: Sequence[trial_lib.Trial], allow_changed_config: bool = False
) -> tuple[list[trial_lib.Trial], list[trial_lib.Trial]]:
  """Splits trials into (done, to_run).

  Raises:
    ValueError: if a trial directory holds a run of another configuration.
  """
  done, to_run, changed = [], [], []
  for trial in trials:
    state = trial_lib.read_state(trial.base_dir)
    changes = trial_lib.config_changes(state, trial.config())
    if changes and not allow_changed_config:
      changed.append(f'{trial.base_dir}: {", ".join(changes)} differ')
    elif state and state.get('status') == 'done' and not changes:
      done.append(trial)
    else:
      to_run.append(trial)
  if changed:
    raise ValueError(
      'These trials were run with another configuration; use another '
      '--base_dir, or --allow_changed_config to resume them with this one:\n'
      '  ' + '\n  '.join(changed)
    )
  return done, to_run


def run_sweep(
  trials: Sequence[trial_lib.Trial],
  ray_address: str | None = None,
  cpus_per_trial: float = 1.0,
  gpus_per_trial: float = 0.0,
  max_attempts: int = 3,
  allow_changed_config: bool = False,
) -> 'SweepResult':
  """Runs every trial not done yet; see the module docstring.

  Args:
    trials: list of trial.Trial (from plan()).
    ray_address: str or None, a Ray cluster; None runs a local one.
    cpus_per_trial: float, CPUs Ray reserves per trial.
    gpus_per_trial: float, GPUs Ray reserves per trial (fractions share).
    max_attempts: int, attempts per trial in this invocation.
    allow_changed_config: bool, resume trials whose configuration changed.

  Returns:
    SweepResult.
  """
  began = time.monotonic()
  done, to_run = pending(trials, allow_changed_config)
  result = SweepResult(trials, [t.key for t in done])
  if not to_run:
    logging.info('All %d trials are done; nothing to run', len(trials))
    return result
  logging.info(
    'Sweep: %s, %d done before, %d to run',
    progress.count(len(trials), 'trial'),
    len(done),
    len(to_run),
  )
  # Imported here: a finished sweep never pays for importing Ray.
  from fixed_replay import distributed

  by_key = {trial.key: trial for trial in to_run}
  tasks = [
    distributed.Task(
      trial.key,
      trial_lib.run_trial,
      (trial, cpus_per_trial, gpus_per_trial),
      num_cpus=cpus_per_trial,
      num_gpus=gpus_per_trial,
    )
    for trial in to_run
  ]
  with _exclusive(_common_root(trials)):
    with distributed.cluster(ray_address) as info:
      distributed.check_feasible(info, tasks)
      outcome = distributed.run_tasks(
        tasks,
        max_attempts=max_attempts,
        desc='sweep',
        unit='trial',
        already_done=len(done),
        progress_of=lambda task: _fraction_done(by_key[task.key]),
        on_failed_attempt=lambda task, attempt, error, retry: (
          trial_lib.record_failure(by_key[task.key], error, retry)
        ),
        poll_seconds=10.0,
      )
  result.finished = outcome.results
  result.failed = outcome.failures
  result.retried = outcome.retried
  result.seconds = outcome.seconds
  result.wall_seconds = time.monotonic() - began
  return result


def _fraction_done(trial):
  """Share of a trial's iterations checkpointed, or None before it knows."""
  state = trial_lib.read_state(trial.base_dir) or {}
  total = state.get('num_iterations')
  if not total:
    return None
  return trial_lib.completed_iterations(trial.base_dir) / total


def _common_root(trials):
  """The sweep's base directory (the trials' common ancestor)."""
  parts = {t.base_dir.rsplit('/', 4)[0] for t in trials}
  return parts.pop() if len(parts) == 1 else None


@contextlib.contextmanager
def _exclusive(base_dir: str):
  """Holds a lock on a local sweep directory so two drivers never share it.

  The kernel drops the lock when the process ends, however it ends.
  """
  if base_dir is None or storage.is_remote(base_dir):
    yield
    return
  storage.makedirs(base_dir)
  path = os.path.join(base_dir, LOCK_FILE)
  with open(path, 'a') as lock:
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as error:
      raise RuntimeError(
        f'Another fixed-replay sweep is running in {base_dir} ({path} is '
        'locked); wait for it or stop it first'
      ) from error
    yield


def format_summary(result: 'SweepResult') -> str:
  """A few lines for people: counts, failures with their logs, what next."""
  finished = len(result.done_before) + len(result.finished)
  lines = [
    f'{progress.count(len(result.trials), "trial")}: {finished} done, '
    f'{len(result.failed)} failed, '
    f'{len(result.trials) - finished - len(result.failed)} not run '
    f'({len(result.done_before)} were done before; this run took '
    f'{progress.format_duration(result.wall_seconds)})'
  ]
  for key, seconds in sorted(result.seconds.items()):
    info = result.finished[key]
    lines.append(
      f'  {key}: iterations {info["start_iteration"]}-'
      f'{info["num_iterations"] - 1} in {seconds:.1f} s'
      + (
        f' after {len(result.retried[key])} failed attempt(s)'
        if key in result.retried
        else ''
      )
    )
  by_key = {t.key: t for t in result.trials}
  for key, errors in sorted(result.failed.items()):
    log = storage.join(by_key[key].base_dir, trial_lib.LOG_FILE)
    lines.append(
      f'  FAILED {key} after {len(errors)} attempt(s): '
      f'{errors[-1].splitlines()[0]} (log: {log})'
    )
  if result.failed:
    lines.append('Rerun the same command to retry the failed trials.')
  return '\n'.join(lines)
