"""Training: how fast the offline agents step, and whether they learn.

Three parts (`--parts`), each agent or example in a fresh process:

* speed: training steps per second of the TF and JAX versions of DQN and
  REM with their published Atari configs (`configs/<agent>.gin`: Nature
  network, batch 32, REM 200 heads, an update every 4 steps), trained from
  common.py's Breakout checkpoint (`--rows`), after `--warmup_steps` steps of
  graph / XLA compilation; and, as the same-run ratio, the share of the
  timed wall time the step waited on the replay: the time TF agents spent
  in `FixedReplayBuffer.sample_transition_batch` (inside `sess.run`), the
  time JAX agents blocked on their background batches
  (`agent.replay_wait_seconds`; ':inline' samples in the step instead, to
  show what the thread saves). The replay must not be what training waits
  on: a GPU step is far shorter than these CPU steps.
* learning: Dopamine's agents trained with `fixed-replay train` and
  `configs/cartpole/<agent>.gin` on a CartPole dataset; the best average
  evaluation return against the return of the policy that logged the data
  (the baseline: offline RL must do better than its data).
* examples: examples/torch_offline_dqn.py, jax_offline_dqn.py and
  torchrl_offline_dqn.py on the same data as Dopamine files and as a compact
  store; the final return (the last line a user reads) against the
  behaviour policy's.

The CartPole data (`--cartpole_checkpoints` x 10,000 rows, the scripted
controller taking a random action with probability `--epsilon`, so that its
return of about 130 leaves room above it) is written once under
benchmarks/data/ with its store and the behaviour return.

Usage:
  python benchmarks/training_benchmark.py [--parts=speed,learning,examples]
    [--rows=100000] [--train_steps=400] [--agents=jax_dqn,jax_rem,...]
    [--seeds=0]
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
from absl import logging
import common
import numpy as np

_PARTS = flags.DEFINE_list(
  'parts', ['speed', 'learning', 'examples'], 'Parts to run.'
)
_SPEED_AGENTS = flags.DEFINE_list(
  'speed_agents',
  ['dqn', 'jax_dqn', 'jax_dqn:inline', 'rem', 'jax_rem', 'jax_rem:inline'],
  'speed: agents; ":inline" runs a JAX agent with prefetch_batches=0.',
)
_TRAIN_STEPS = flags.DEFINE_integer(
  'train_steps', 400, 'speed: training steps timed per agent.'
)
_WARMUP_STEPS = flags.DEFINE_integer(
  'warmup_steps', 40, 'speed: training steps run before timing.'
)
_AGENTS = flags.DEFINE_list(
  'agents',
  ['jax_dqn', 'jax_rem', 'jax_quantile', 'jax_cql'],
  'learning: agents with a configs/cartpole/<name>.gin.',
)
_GIN_BINDINGS = flags.DEFINE_multi_string(
  'gin_bindings', [], 'learning: extra gin bindings for every agent.'
)
_NUM_UPDATES = flags.DEFINE_integer('num_updates', 4000, 'examples: updates.')
_EVAL_EVERY = flags.DEFINE_integer(
  'eval_every', 1000, 'examples: updates between evaluations.'
)
_LAYOUTS = flags.DEFINE_list(
  'layouts', ['dopamine', 'store'], 'examples: data layouts to read.'
)
_SEEDS = flags.DEFINE_list('seeds', ['0'], 'learning, examples: seeds.')
_EPSILON = flags.DEFINE_float(
  'epsilon', 0.5, 'Random-action probability of the CartPole data.'
)
_CARTPOLE_CHECKPOINTS = flags.DEFINE_integer(
  'cartpole_checkpoints', 5, 'Checkpoints of the CartPole data.'
)

ROOT = common.BENCHMARK_DIR.parent
EXAMPLES = (
  'torch_offline_dqn.py',
  'jax_offline_dqn.py',
  'torchrl_offline_dqn.py',
)


def _setup():
  import fixed_replay  # noqa: F401


def _same(value):
  return value


def _python(argv):
  """Runs `python argv` in a fresh process; (completed, wall seconds)."""
  began = time.perf_counter()
  done = subprocess.run(
    [sys.executable, *argv], capture_output=True, text=True, check=False
  )
  if done.returncode:
    raise RuntimeError(
      f'{argv} exited {done.returncode}:\n{done.stderr[-3000:]}'
    )
  return done, time.perf_counter() - began


# ---------------------------------------------------------------- speed


def time_agent(spec, directory, rows, warmup_steps, train_steps):
  """Times one agent's training steps; returns (seconds, waited, updates)."""
  from dopamine.discrete_domains import atari_lib
  import gin
  import jax

  from fixed_replay import agents
  from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer

  name, _, mode = spec.partition(':')
  is_jax = name.startswith('jax_')
  bindings = [
    f'FixedReplayBuffer.replay_capacity = {rows}',
    'FixedReplayBuffer.num_buffers_to_load = 1',
    'FixedReplayBuffer.prefetch = False',
    'FixedReplayBuffer.seed = 0',
  ]
  cls = agents.agent_class(name).__name__  # Registers it with gin.
  if is_jax:
    prefetch = 0 if mode == 'inline' else 2
    bindings.append(f'{cls}.prefetch_batches = {prefetch}')
  else:
    bindings.append(f'WrappedFixedReplayBuffer.replay_capacity = {rows}')
  gin.parse_config_files_and_bindings(
    [str(ROOT / 'configs' / f'{name}.gin')], bindings
  )
  sampled = [0.0, 0]  # TF agents sample in sess.run: seconds, calls.
  original = FixedReplayBuffer.sample_transition_batch

  def timed_sample(buffer, *args, **kwargs):
    began = time.perf_counter()
    try:
      return original(buffer, *args, **kwargs)
    finally:
      sampled[0] += time.perf_counter() - began
      sampled[1] += 1

  FixedReplayBuffer.sample_transition_batch = timed_sample
  environment = atari_lib.create_atari_environment(common.DEFAULT_GAME)
  agent = agents.create_agent(None, environment, name, str(directory))

  def finish():  # Waits for the JAX updates dispatched so far.
    if is_jax:
      jax.block_until_ready(agent.online_params)

  for _ in range(warmup_steps):
    agent.train_step()
  finish()
  if is_jax:
    agent.reset_replay_wait()
  sampled[:] = [0.0, 0]
  began = time.perf_counter()
  for _ in range(train_steps):
    agent.train_step()
  finish()
  seconds = time.perf_counter() - began
  if is_jax:
    sampled = [agent.replay_wait_seconds, agent.replay_batches]
    agent.close()
  return seconds, sampled[0], sampled[1]


def speed():
  rows = common.ROWS.value
  directory = common.build_checkpoint(rows, common.SEED.value)
  print(f'\nspeed: {rows:,} rows of Breakout ({directory}), ', end='')
  print(f'{_TRAIN_STEPS.value} steps timed after {_WARMUP_STEPS.value}')
  print('| agent | sampling | training steps/s | ms per update | waiting |')
  print('|---|---|---:|---:|---:|')
  for spec in _SPEED_AGENTS.value:
    args = (spec, directory, rows, _WARMUP_STEPS.value, _TRAIN_STEPS.value)
    seconds, waited, updates = common.measure(
      _setup, time_agent, args, _same
    ).digest
    name, _, mode = spec.partition(':')
    background = name.startswith('jax_') and mode != 'inline'
    print(
      f'| {name} | {"background" if background else "in the step"} | '
      f'{_TRAIN_STEPS.value / seconds:.1f} | '
      f'{1000 * seconds / max(updates, 1):.0f} | {waited / seconds:.1%} |'
    )


# ------------------------------------------------------- CartPole data


def cartpole_data():
  """(Dopamine files, store, behaviour return) of the CartPole data."""
  directory = common.DATA_DIR / (
    f'cartpole_scripted_eps{_EPSILON.value:g}x{_CARTPOLE_CHECKPOINTS.value}'
  )
  dopamine, store = directory / 'dopamine', directory / 'store'
  summary = directory / 'behaviour.json'
  if not summary.exists():
    from fixed_replay.convert import convert
    from fixed_replay.generate import generate

    generated = generate.generate_dataset(
      str(dopamine),
      environment='cartpole',
      policy='scripted',
      epsilon=_EPSILON.value,
      num_checkpoints=_CARTPOLE_CHECKPOINTS.value,
      checkpoint_rows=10_000,
      seed=0,
    )
    convert.convert(str(dopamine), str(store))
    summary.write_text(json.dumps({'return': generated.mean_return}))
  return dopamine, store, json.loads(summary.read_text())['return']


def learning(dopamine, behaviour, scratch):
  from fixed_replay.training import plotting

  print(f'\nlearning: {dopamine}, configs/cartpole/<agent>.gin')
  print('| agent | seed | best return | vs behaviour | final | wall s |')
  print('|---|---:|---:|---:|---:|---:|')
  for agent in _AGENTS.value:
    for seed in _SEEDS.value:
      base_dir = os.path.join(scratch, f'{agent}_{seed}')
      bindings = [*_GIN_BINDINGS.value, f'FixedReplayBuffer.seed = {seed}']
      _, wall = _python(
        [
          '-m',
          'fixed_replay.cli',
          'train',
          f'--base_dir={base_dir}',
          f'--replay_dir={dopamine}',
          f'--agent_name={agent}',
          f'--gin_files={ROOT / "configs" / "cartpole" / f"{agent}.gin"}',
          *[f'--gin_bindings={b}' for b in bindings],
        ]
      )
      _, returns = plotting.load_eval_returns(base_dir)
      print(
        f'| {agent} | {seed} | {np.max(returns):.1f} | '
        f'{np.max(returns) / behaviour:.2f}x | {returns[-1]:.1f} | {wall:.0f} |'
      )


def examples(dopamine, store, behaviour):
  print(f'\nexamples: {_NUM_UPDATES.value} updates, evaluations every ', end='')
  print(f'{_EVAL_EVERY.value}')
  print(
    '| example | data | seed | evaluations | final | vs behaviour | wall s |'
  )
  print('|---|---|---:|---|---:|---:|---:|')
  for example in EXAMPLES:
    for layout in _LAYOUTS.value:
      for seed in _SEEDS.value:
        done, wall = _python(
          [
            str(ROOT / 'examples' / example),
            f'--replay_dir={dopamine if layout == "dopamine" else store}',
            '--environment=cartpole',
            f'--num_updates={_NUM_UPDATES.value}',
            f'--eval_every={_EVAL_EVERY.value}',
            f'--seed={seed}',
          ]
        )
        curve = ', '.join(
          f'{int(u)}: {float(v):.0f}'
          for u, v in re.findall(
            r'eval return at update (\d+): (-?[\d.]+)', done.stderr
          )
        )
        final = float(done.stdout.strip().splitlines()[-1].split(':')[1])
        print(
          f'| {example} | {layout} | {seed} | {curve} | {final:.1f} | '
          f'{final / behaviour:.2f}x | {wall:.0f} |'
        )


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  print(f'{common.load_average()} at start ({os.cpu_count()} CPUs)')
  if 'speed' in _PARTS.value:
    speed()
  if {'learning', 'examples'} & set(_PARTS.value):
    dopamine, store, behaviour = cartpole_data()
    print(f'\nCartPole data: behaviour policy return {behaviour:.1f}')
    with tempfile.TemporaryDirectory(prefix='training_benchmark_') as scratch:
      if 'learning' in _PARTS.value:
        learning(dopamine, behaviour, scratch)
    if 'examples' in _PARTS.value:
      examples(dopamine, store, behaviour)
  print(f'\n{common.load_average()} at end')


if __name__ == '__main__':
  flags.FLAGS.set_default('rows', 100_000)
  app.run(main)
