"""CartPole learning check: do the offline agents learn from logged data?

Writes (once, then reuses) a CartPole dataset in the DQN Replay Dataset layout
with `fixed_replay.generate.generate.generate_dataset`: Dopamine's CartPole
played by the scripted controller with probability `--epsilon` of a uniform
random action (0.5 by default: the behaviour policy averages about 130 per
episode, so reaching 150 means doing better than the data). Then each agent is
trained on it through `fixed_replay.training.run_experiment.create_runner` with
`configs/cartpole/<agent>.gin` (10 iterations x 2,000 updates, 1,000 evaluation
steps each), one fresh process per agent, and the script reports the average
evaluation return of every iteration with the wall time elapsed since the
agent's process started (data loading and compilation included).

An agent passes when some iteration's average evaluation return reaches
`--target_return` (150) within `--time_limit_s` (600 s).

Usage:
  python benchmarks/cartpole_learning.py \
      --agents=dqn,rem,quantile,jax_dqn,jax_rem,jax_quantile,jax_cql
"""

import os
import shutil
import tempfile
import time

from absl import app
from absl import flags
from absl import logging
import common

_AGENTS = flags.DEFINE_list(
  'agents',
  ['jax_dqn', 'jax_rem', 'jax_quantile', 'jax_cql'],
  'Agents to train (names of fixed_replay.agents.AGENTS with a '
  'configs/cartpole/<name>.gin).',
)
_DATA_DIR = flags.DEFINE_string(
  'data_dir',
  None,
  'Where the dataset lives (default benchmarks/data/cartpole_scripted_'
  'eps<epsilon>); written if missing.',
)
_EPSILON = flags.DEFINE_float(
  'epsilon', 0.5, 'Random-action probability of the behaviour policy.'
)
_NUM_CHECKPOINTS = flags.DEFINE_integer(
  'num_checkpoints', 5, 'Checkpoints in the dataset.'
)
_CHECKPOINT_ROWS = flags.DEFINE_integer(
  'checkpoint_rows', 10_000, 'Rows per checkpoint.'
)
_DATA_SEED = flags.DEFINE_integer('data_seed', 0, 'Seed of the dataset.')
_TARGET_RETURN = flags.DEFINE_float(
  'target_return', 150.0, 'Average evaluation return an agent must reach.'
)
_TIME_LIMIT_S = flags.DEFINE_float(
  'time_limit_s', 600.0, 'Wall time within which it must reach it.'
)
_OUTPUT_DIR = flags.DEFINE_string(
  'output_dir',
  None,
  'Where the runs are written (default: a temporary directory, removed).',
)
_GIN_BINDINGS = flags.DEFINE_multi_string(
  'gin_bindings', [], 'Extra gin bindings for every agent.'
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def dataset_dir():
  if _DATA_DIR.value:
    return _DATA_DIR.value
  return str(common.DATA_DIR / f'cartpole_scripted_eps{_EPSILON.value:g}')


def ensure_dataset(directory):
  """Writes the dataset unless a complete one is there; returns its summary.

  Returns:
    str, a line describing the data.
  """
  from fixed_replay.generate import generate
  from fixed_replay.sources.dopamine import checkpoints

  if os.path.isdir(directory):
    complete, incomplete = checkpoints.scan_checkpoints(directory)
    if len(complete) == _NUM_CHECKPOINTS.value and not incomplete:
      return f'{directory} (reused: {len(complete)} checkpoints)'
    raise RuntimeError(
      f'{directory} exists but does not hold {_NUM_CHECKPOINTS.value} '
      'complete checkpoints; remove it or pass another --data_dir'
    )
  summary = generate.generate_dataset(
    directory,
    environment='cartpole',
    policy='scripted',
    epsilon=_EPSILON.value,
    num_checkpoints=_NUM_CHECKPOINTS.value,
    checkpoint_rows=_CHECKPOINT_ROWS.value,
    seed=_DATA_SEED.value,
  )
  return (
    f'{directory}: {_NUM_CHECKPOINTS.value} x {_CHECKPOINT_ROWS.value:,} '
    f'rows, scripted policy with epsilon {_EPSILON.value:g}, behaviour '
    f'return {summary.mean_return:.1f} over '
    f'{len(summary.episode_returns)} episodes'
  )


def _setup():
  import fixed_replay  # noqa: F401


def train_agent(agent_name, replay_dir, base_dir, bindings):
  """Trains one agent with its CartPole config; returns per-iteration data.

  Returns:
    dict with 'iterations': [(iteration, seconds since start, average
    evaluation return)], 'seconds': total wall time.
  """
  began = time.perf_counter()
  from fixed_replay.training import run_experiment

  runner = run_experiment.create_runner(
    base_dir,
    agent_name=agent_name,
    replay_dir=replay_dir,
    gin_files=[os.path.join(ROOT, 'configs', 'cartpole', f'{agent_name}.gin')],
    gin_bindings=bindings,
  )
  iterations = []
  run_one_iteration = runner._run_one_iteration

  def timed_iteration(iteration):
    statistics = run_one_iteration(iteration)
    iterations.append(
      (
        iteration,
        time.perf_counter() - began,
        float(statistics['eval_average_return'][0]),
      )
    )
    return statistics

  runner._run_one_iteration = timed_iteration
  runner.run_experiment()
  close = getattr(runner.agent, 'close', None)
  if callable(close):
    close()
  return {'iterations': iterations, 'seconds': time.perf_counter() - began}


def _result(value):
  return value


def _verdict(result):
  """(first passing (iteration, seconds, return) or None, passed)."""
  for iteration, seconds, value in result['iterations']:
    if value >= _TARGET_RETURN.value and seconds <= _TIME_LIMIT_S.value:
      return (iteration, seconds, value), True
  return None, False


def main(argv):
  del argv
  logging.set_verbosity(logging.INFO)
  description = ensure_dataset(dataset_dir())
  output_dir = _OUTPUT_DIR.value or tempfile.mkdtemp(prefix='cartpole_check_')
  print(f'\nCartPole learning check on {description}')
  print(f'{os.cpu_count()} CPUs, {common.load_average()} at start')
  results = {}
  try:
    for agent_name in _AGENTS.value:
      logging.info('Training %s', agent_name)
      base_dir = os.path.join(output_dir, agent_name)
      if os.path.exists(base_dir):
        raise RuntimeError(f'{base_dir} exists: pass a fresh --output_dir')
      results[agent_name] = common.measure(
        _setup,
        train_agent,
        (agent_name, dataset_dir(), base_dir, list(_GIN_BINDINGS.value)),
        _result,
      ).digest
      first, passed = _verdict(results[agent_name])
      logging.info('%s: %s', agent_name, 'PASS' if passed else 'FAIL')
  finally:
    if not _OUTPUT_DIR.value:
      shutil.rmtree(output_dir, ignore_errors=True)
  print(f'{common.load_average()} at the end\n')
  target, limit = _TARGET_RETURN.value, _TIME_LIMIT_S.value
  print(
    f'| agent | first iteration >= {target:g} (time) | best | final | '
    f'wall time | result (>= {target:g} within {limit:.0f} s) |'
  )
  print('|---|---|---:|---:|---:|---|')
  for agent_name, result in results.items():
    first, passed = _verdict(result)
    returns = [value for _, _, value in result['iterations']]
    reached = f'{first[0]} ({first[1]:.0f} s)' if first else 'never'
    print(
      f'| {agent_name} | {reached} | {max(returns):.1f} | '
      f'{returns[-1]:.1f} | {result["seconds"]:.0f} s | '
      f'{"PASS" if passed else "FAIL"} |'
    )
  print('\nAverage evaluation return per iteration (seconds since start):')
  for agent_name, result in results.items():
    line = ', '.join(
      f'{value:.0f} ({seconds:.0f} s)'
      for _, seconds, value in result['iterations']
    )
    print(f'  {agent_name}: {line}')
  if not all(_verdict(r)[1] for r in results.values()):
    return 1
  return 0


if __name__ == '__main__':
  app.run(main)
