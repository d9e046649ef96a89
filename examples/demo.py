"""The main job on an embedded default (what `./run.sh` runs).

1. Plays a real Atari game (Pong) through Dopamine's environment to write a
   small dataset in exactly the DQN Replay Dataset layout;
2. inspects and verifies it as `fixed-replay inspect --verify` does, and
   samples minibatches through the FixedReplayBuffer;
3. trains offline DQN (configs/dqn.gin, scaled down) for a few short
   iterations on the CPU, each evaluated in the real game: the whole loop,
   though far too short for Pong to improve;
4. writes a second dataset from random play in Dopamine's CartPole (episodes
   average about 22 steps) and trains offline DQN on it
   (configs/cartpole/dqn.gin), which reaches the 200-step cap of an episode
   within a few thousand updates: offline learning, in a minute;
5. prints one results table and writes one plot of both runs.

Re-running reuses the datasets and resumes (or skips) the training runs.

  python examples/demo.py --output_dir=demo_output

It is a walk through this repository (it reads its `configs/`), not a part
of the library: the library's side of each step is a `fixed-replay` command.
"""

import os
import time

from absl import app
from absl import flags
from absl import logging

from fixed_replay import heavy_imports
from fixed_replay import quiet

# Before anything imports TensorFlow, as the CLI does: no third-party noise,
# and the heavy imports without the cyclic collector (a few CPU-s).
quiet.install()
heavy_imports.install()

import fixed_replay  # noqa: E402
from fixed_replay.cli import tables  # noqa: E402
from fixed_replay.generate import generate  # noqa: E402
from fixed_replay.sources.dopamine import inspection  # noqa: E402

# Several flags share `generate`'s and `train`'s names, with the demo's small
# defaults.
_OUTPUT_DIR = flags.DEFINE_string(
  'output_dir', 'demo_output', 'Where the demo writes its datasets and results.'
)
_GAME = flags.DEFINE_string('game', 'Pong', 'Atari game to play.')
_NUM_CHECKPOINTS = flags.DEFINE_integer(
  'num_checkpoints', 2, 'Atari checkpoints to write.', lower_bound=1
)
_CHECKPOINT_ROWS = flags.DEFINE_integer(
  'checkpoint_rows', 5000, 'Rows per Atari checkpoint.', lower_bound=100
)
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the games and the policies.')
_AGENT_NAME = flags.DEFINE_string(
  'agent_name', 'dqn', 'Offline agent to train (see fixed-replay train).'
)
_NUM_ITERATIONS = flags.DEFINE_integer(
  'num_iterations', 3, 'Training iterations on Atari.', lower_bound=1
)
_TRAINING_STEPS = flags.DEFINE_integer(
  'training_steps',
  1000,
  'Training steps per Atari iteration (an update ' 'every 4).',
)
_EVALUATION_STEPS = flags.DEFINE_integer(
  'evaluation_steps', 1500, 'Agent steps of Atari evaluation per iteration.'
)
_CARTPOLE_ROWS = flags.DEFINE_integer(
  'cartpole_rows',
  2500,
  'Rows per CartPole checkpoint (2 checkpoints of random play); 0 skips '
  'CartPole.',
  lower_bound=0,
)
_CARTPOLE_ITERATIONS = flags.DEFINE_integer(
  'cartpole_iterations', 2, 'Training iterations on CartPole.', lower_bound=1
)
_CARTPOLE_TRAINING_STEPS = flags.DEFINE_integer(
  'cartpole_training_steps',
  1000,
  'Training steps per CartPole iteration (an update every step).',
)

_CONFIGS_DIR = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs'
)


def _dataset(data_dir, num_checkpoints, what, **generate_kwargs):
  """Generates a dataset once; reuses it when a previous demo wrote it."""
  summary = inspection.summarize_directory(data_dir)
  if (
    os.path.isdir(data_dir)
    and summary.ok
    and (summary.num_complete == num_checkpoints)
  ):
    logging.info('Reusing the dataset in %s', data_dir)
    return data_dir
  if os.path.isdir(data_dir) and os.listdir(data_dir):
    raise app.UsageError(
      f'{data_dir} holds files that are not a complete demo dataset; '
      'choose another --output_dir (nothing is overwritten).'
    )
  logging.info('Playing %s', what)
  generate.generate_dataset(
    data_dir,
    num_checkpoints=num_checkpoints,
    seed=_SEED.value,
    **generate_kwargs,
  )
  return data_dir


def _atari_dataset(output_dir):
  return _dataset(
    os.path.join(output_dir, 'replay_logs'),
    _NUM_CHECKPOINTS.value,
    f'{_GAME.value}: {_NUM_CHECKPOINTS.value} checkpoints x '
    f'{_CHECKPOINT_ROWS.value} rows, scripted policy with epsilon 0.2',
    environment='atari',
    game=_GAME.value,
    checkpoint_rows=_CHECKPOINT_ROWS.value,
    policy='scripted',
    epsilon=0.2,
  )


def _cartpole_dataset(output_dir):
  return _dataset(
    os.path.join(output_dir, 'cartpole', 'replay_logs'),
    2,
    f'CartPole: 2 checkpoints x {_CARTPOLE_ROWS.value} rows, random policy',
    environment='cartpole',
    checkpoint_rows=_CARTPOLE_ROWS.value,
    policy='random',
  )


def _sample(data_dir):
  """Samples minibatches across checkpoints and reports the rate."""
  buffer = fixed_replay.FixedReplayBuffer(
    data_dir,
    None,
    num_buffers_to_load=_NUM_CHECKPOINTS.value,
    prefetch=False,
    seed=_SEED.value,
  )
  buffer.sample_transition_batch()  # Compiles the gather kernels once.
  began = time.perf_counter()
  batches = 500
  for _ in range(batches):
    state, *_, suffixes = buffer.sample_transition_batch()
  rate = batches / (time.perf_counter() - began)
  print(
    f'\nSampled {batches} minibatches of {state.shape} at {rate:,.0f} '
    f'batches/s; the last mixed checkpoints {sorted(set(suffixes.tolist()))}'
  )


def _train(agent_name, config, data_dir, base_dir, bindings):
  """Trains an offline agent in its own TF graph; returns its statistics."""
  import gin
  import tensorflow as tf

  from fixed_replay.training import plotting
  from fixed_replay.training import run_experiment

  config = os.path.join(_CONFIGS_DIR, config)
  bindings = list(bindings) + [f'FixedReplayBuffer.seed = {_SEED.value}']
  # Each run gets its own configuration and TF graph: the two runs share a
  # process.
  gin.clear_config()  # Also unlocks it.
  with tf.Graph().as_default():
    runner = run_experiment.create_runner(
      base_dir, agent_name, data_dir, [config], bindings
    )
    runner.run_experiment()
  return plotting.load_statistics(base_dir)


def _train_atari(data_dir, base_dir):
  return _train(
    _AGENT_NAME.value,
    f'{_AGENT_NAME.value}.gin',
    data_dir,
    base_dir,
    [
      f'atari_lib.create_atari_environment.game_name = "{_GAME.value}"',
      f'FixedReplayRunner.num_iterations = {_NUM_ITERATIONS.value}',
      f'FixedReplayRunner.training_steps = {_TRAINING_STEPS.value}',
      f'FixedReplayRunner.evaluation_steps = {_EVALUATION_STEPS.value}',
      'FixedReplayRunner.max_steps_per_episode = 5000',
      # Two checkpoints: hold one, prefetch the other, swap every iteration.
      'FixedReplayBuffer.num_buffers_to_load = 1',
    ],
  )


def _train_cartpole(data_dir, base_dir):
  return _train(
    'dqn',
    os.path.join('cartpole', 'dqn.gin'),
    data_dir,
    base_dir,
    [
      f'FixedReplayRunner.num_iterations = {_CARTPOLE_ITERATIONS.value}',
      'FixedReplayRunner.training_steps = ' f'{_CARTPOLE_TRAINING_STEPS.value}',
      'FixedReplayBuffer.num_buffers_to_load = 2',
    ],
  )


def _row(name, iteration, stats):
  returns = stats.get('eval_episode_returns', [])
  losses = [
    v
    for k, v in stats.items()
    if k.startswith('train_average_') and k != 'train_average_steps_per_second'
  ]
  loss = f'{losses[0][0]:.4f}' if losses and losses[0] else 'n/a'
  speed = stats.get('train_average_steps_per_second', [float('nan')])[0]
  mean = f'{sum(returns) / len(returns):.1f}' if returns else 'n/a'
  return (
    f'{name:<18} {iteration:>9} {mean:>12} {len(returns):>9} '
    f'{speed:>14.1f} {loss:>10}'
  )


def _print_results(runs):
  """One table: every evaluated iteration of every run."""
  print('\nOffline training, evaluated in the real game after each iteration:')
  print(
    f'{"run":<18} {"iteration":>9} {"eval return":>12} {"episodes":>9} '
    f'{"train steps/s":>14} {"loss":>10}'
  )
  for name, statistics, _ in runs:
    for iteration, stats in statistics.items():
      print(_row(name, iteration, stats))
  for name, statistics, data_return in runs:
    best = max(
      (
        sum(s['eval_episode_returns']) / len(s['eval_episode_returns'])
        for s in statistics.values()
        if s.get('eval_episode_returns')
      ),
      default=float('nan'),
    )
    print(
      f'{name}: the data averages {data_return:.1f} per episode; the best '
      f'evaluation of the offline agent averaged {best:.1f}'
    )


def _data_return(data_dir):
  return inspection.summarize_directory(data_dir).episodes.mean_return


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  output_dir = _OUTPUT_DIR.value
  data_dir = _atari_dataset(output_dir)
  summary = inspection.summarize_directory(data_dir, verify=True)
  print(tables.format_table(summary))
  if not summary.ok:
    print(tables.format_problems(summary))
    return 1
  _sample(data_dir)
  from fixed_replay.training import plotting

  base_dir = os.path.join(output_dir, f'{_AGENT_NAME.value}_run')
  runs = [
    (
      f'{_AGENT_NAME.value} {_GAME.value}',
      _train_atari(data_dir, base_dir),
      summary.episodes.mean_return or float('nan'),
    )
  ]
  run_dirs = [base_dir]
  if _CARTPOLE_ROWS.value:
    cartpole_data = _cartpole_dataset(output_dir)
    cartpole_dir = os.path.join(output_dir, 'dqn_cartpole_run')
    runs.append(
      (
        'dqn CartPole',
        _train_cartpole(cartpole_data, cartpole_dir),
        _data_return(cartpole_data),
      )
    )
    run_dirs.append(cartpole_dir)
  _print_results(runs)
  plot = os.path.join(output_dir, 'eval_returns.png')
  plotting.plot_eval_returns(
    run_dirs,
    plot,
    title='Offline DQN, evaluated in the game after each iteration',
    overwrite=True,
    panels=True,
    labels=[name for name, _, _ in runs],
    references=[('the data, per episode', value) for _, _, value in runs],
  )
  print(f'\nRuns in {", ".join(run_dirs)}; evaluation plot in {plot}')
  return 0


if __name__ == '__main__':
  app.run(main)
