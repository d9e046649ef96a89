"""Training speed of the offline TF and JAX agents, and the time spent waiting.

One command measures, on this machine, training steps per second of the TF
and JAX versions of DQN and REM with their published Atari configs (Nature
network, states 84x84x4, batch 32, REM with 200 heads, an update every 4
training steps), trained from the real Breakout checkpoint of `common.py`
(100,000 rows by default, built once and reused), and the share of each
training step spent waiting on the replay buffer:

* TF agents sample inside `sess.run` (Dopamine's `tf.numpy_function`), so
  the wait is the time spent in `FixedReplayBuffer.sample_transition_batch`,
  timed by a wrapper installed before the agent builds its graph;
* JAX agents take minibatches prepared by a background thread; the wait is
  the time `train_step` blocked on that queue (`agent.replay_wait_seconds`).
  They are also run with `prefetch_batches=0` (sampling in the step) to show
  what the thread saves.

Each configuration runs in a fresh process: build the agent from
`configs/<agent>.gin` (data bindings aside), run `--warmup_steps` training
steps (XLA / graph compilation), then time `--train_steps` steps, waiting for
the last JAX update to finish.

Usage: python benchmarks/training_speed.py [--train_steps=400] [--rows=100000]
"""

import os
import time

from absl import app
from absl import flags
from absl import logging
import common

_TRAIN_STEPS = flags.DEFINE_integer(
  'train_steps', 400, 'Training steps timed per agent (an update every 4).'
)
_WARMUP_STEPS = flags.DEFINE_integer(
  'warmup_steps', 40, 'Training steps run before timing (compilation).'
)
_AGENTS = flags.DEFINE_list(
  'agents',
  ['dqn', 'jax_dqn', 'jax_dqn:inline', 'rem', 'jax_rem', 'jax_rem:inline'],
  'Agents to time; ":inline" runs a JAX agent with prefetch_batches=0.',
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _setup():
  import fixed_replay  # noqa: F401


class _TimedSampling:
  """Wraps FixedReplayBuffer.sample_transition_batch with a stopwatch."""

  def __init__(self):
    from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer

    self.seconds = 0.0
    self.calls = 0
    original = FixedReplayBuffer.sample_transition_batch

    def timed(buffer, *args, **kwargs):
      began = time.perf_counter()
      try:
        return original(buffer, *args, **kwargs)
      finally:
        self.seconds += time.perf_counter() - began
        self.calls += 1

    FixedReplayBuffer.sample_transition_batch = timed


def time_agent(spec, directory, rows, warmup_steps, train_steps):
  """Builds one agent from its Atari config and times its training steps.

  Args:
    spec: str, an agent name, with ':inline' for a JAX agent that samples in
      the training step.
    directory: str, the replay checkpoint directory.
    rows: int, rows of the checkpoint.
    warmup_steps: int, steps before timing.
    train_steps: int, steps timed.

  Returns:
    dict of the measurements.
  """
  from dopamine.discrete_domains import atari_lib
  import gin

  from fixed_replay import agents

  name, _, mode = spec.partition(':')
  is_jax = name.startswith('jax_')
  bindings = [
    f'FixedReplayBuffer.replay_capacity = {rows}',
    'FixedReplayBuffer.num_buffers_to_load = 1',
    'FixedReplayBuffer.prefetch = False',
    'FixedReplayBuffer.seed = 0',
  ]
  if is_jax:
    cls = agents.agent_class(name).__name__
    prefetch = 0 if mode == 'inline' else 2
    bindings.append(f'{cls}.prefetch_batches = {prefetch}')
  else:
    bindings.append(f'WrappedFixedReplayBuffer.replay_capacity = {rows}')
  agents.agent_class(name)
  gin.parse_config_files_and_bindings(
    [os.path.join(ROOT, 'configs', f'{name}.gin')], bindings
  )
  sampling = _TimedSampling()
  environment = atari_lib.create_atari_environment(common.DEFAULT_GAME)
  # sess=None: Dopamine's TF agents make (and initialise) their own session.
  agent = agents.create_agent(None, environment, name, str(directory))
  for _ in range(warmup_steps):
    agent.train_step()
  _finish(agent, is_jax)
  if is_jax:
    agent.reset_replay_wait()
  sampling.seconds, sampling.calls = 0.0, 0
  began = time.perf_counter()
  for _ in range(train_steps):
    agent.train_step()
  _finish(agent, is_jax)
  seconds = time.perf_counter() - began
  if is_jax:
    wait, batches = agent.replay_wait_seconds, agent.replay_batches
    agent.close()
  else:
    wait, batches = sampling.seconds, sampling.calls
  return {
    'spec': spec,
    'framework': 'JAX' if is_jax else 'TF',
    'sampling': (
      'in the step' if not is_jax or mode == 'inline' else 'background'
    ),
    'train_steps': train_steps,
    'updates': batches,
    'seconds': seconds,
    'wait_seconds': wait,
  }


def _finish(agent, is_jax):
  """Waits for the JAX updates dispatched so far to finish."""
  if is_jax:
    import jax

    jax.block_until_ready(agent.online_params)


def _result(value):
  return value


def main(argv):
  del argv
  directory = common.build_checkpoint(common.ROWS.value, common.SEED.value)
  rows = common.ROWS.value
  print(
    f'\nTraining speed on {directory} ({rows:,} rows of real Breakout), '
    f'{os.cpu_count()} CPUs, {common.load_average()} at start'
  )
  results = []
  for spec in _AGENTS.value:
    logging.info('Timing %s', spec)
    measurement = common.measure(
      _setup,
      time_agent,
      (spec, directory, rows, _WARMUP_STEPS.value, _TRAIN_STEPS.value),
      _result,
    )
    results.append(measurement.digest)
    logging.info('%s: %s', spec, measurement.digest)
  print(f'{common.load_average()} at the end\n')
  print(
    '| agent | framework | sampling | training steps/s | updates/s | '
    'ms per update | waiting on the buffer |'
  )
  print('|---|---|---|---:|---:|---:|---:|')
  for r in results:
    name = r['spec'].partition(':')[0]
    print(
      f'| {name} | {r["framework"]} | {r["sampling"]} | '
      f'{r["train_steps"] / r["seconds"]:.1f} | '
      f'{r["updates"] / r["seconds"]:.2f} | '
      f'{1000 * r["seconds"] / max(r["updates"], 1):.0f} | '
      f'{100 * r["wait_seconds"] / r["seconds"]:.1f}% |'
    )
  print(
    f'\n{_TRAIN_STEPS.value} training steps timed per agent after '
    f'{_WARMUP_STEPS.value} warm-up steps; published configs (batch 32, an '
    'update every 4 steps, REM 200 heads). "waiting on the buffer": share of '
    'the timed wall time the training loop spent sampling (TF, JAX inline) '
    'or blocked on the background queue (JAX).'
  )


if __name__ == '__main__':
  flags.FLAGS.set_default('rows', 100_000)
  app.run(main)
