"""`fixed-replay demo`: the main job on an embedded default.

1. Plays a real Atari game (Pong) through Dopamine's environment to write a
   small dataset in exactly the DQN Replay Dataset layout;
2. inspects and verifies it as `fixed-replay inspect --verify` does, and
   samples minibatches through the FixedReplayBuffer;
3. trains offline DQN (configs/dqn.gin, scaled down) for a few short
   iterations on the CPU, each evaluated in the real game;
4. prints a results table and writes the evaluation plot.

Re-running reuses the dataset and resumes (or skips) the training run.

  fixed-replay demo --output_dir=demo_output
"""

import os
import time

from absl import app
from absl import flags
from absl import logging

import fixed_replay
from fixed_replay.dataset import generate
from fixed_replay.dataset import inspection

_OUTPUT_DIR = flags.DEFINE_string(
  'output_dir', 'demo_output', 'Where the demo writes its dataset and results.'
)
_GAME = flags.DEFINE_string('game', 'Pong', 'Atari game to play.')
_NUM_CHECKPOINTS = flags.DEFINE_integer(
  'num_checkpoints', 2, 'Checkpoints to write.', lower_bound=1
)
_CHECKPOINT_ROWS = flags.DEFINE_integer(
  'checkpoint_rows', 5000, 'Rows per checkpoint.', lower_bound=100
)
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the game and the policy.')
_AGENT_NAME = flags.DEFINE_string(
  'agent_name', 'dqn', 'Offline agent to train (see fixed-replay train).'
)
_NUM_ITERATIONS = flags.DEFINE_integer(
  'num_iterations', 3, 'Training iterations.', lower_bound=1
)
_TRAINING_STEPS = flags.DEFINE_integer(
  'training_steps', 1000, 'Training steps per iteration (an update every 4).'
)
_EVALUATION_STEPS = flags.DEFINE_integer(
  'evaluation_steps', 1500, 'Agent steps of evaluation per iteration.'
)

_CONFIGS_DIR = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(fixed_replay.__file__))),
  'configs',
)


def _dataset(output_dir):
  """Generates the dataset once; reuses it when a previous demo wrote it."""
  data_dir = os.path.join(output_dir, 'replay_logs')
  summary = inspection.summarize_directory(data_dir)
  if (
    os.path.isdir(data_dir)
    and summary.ok
    and (summary.num_complete == _NUM_CHECKPOINTS.value)
  ):
    logging.info('Reusing the dataset in %s', data_dir)
    return data_dir
  if os.path.isdir(data_dir) and os.listdir(data_dir):
    raise app.UsageError(
      f'{data_dir} holds files that are not a complete demo dataset; '
      'choose another --output_dir (nothing is overwritten).'
    )
  logging.info(
    'Playing %s: %d checkpoints x %d rows, scripted policy with epsilon 0.2',
    _GAME.value,
    _NUM_CHECKPOINTS.value,
    _CHECKPOINT_ROWS.value,
  )
  generate.generate_dataset(
    data_dir,
    environment='atari',
    game=_GAME.value,
    num_checkpoints=_NUM_CHECKPOINTS.value,
    checkpoint_rows=_CHECKPOINT_ROWS.value,
    policy='scripted',
    epsilon=0.2,
    seed=_SEED.value,
  )
  return data_dir


def _sample(data_dir):
  """Samples minibatches across checkpoints and reports the rate."""
  from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer

  buffer = FixedReplayBuffer(
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


def _train(data_dir, base_dir):
  """Trains the offline agent for a few short iterations; returns its stats."""
  from fixed_replay.training import plotting
  from fixed_replay.training import run_experiment

  bindings = [
    f'atari_lib.create_atari_environment.game_name = "{_GAME.value}"',
    f'FixedReplayRunner.num_iterations = {_NUM_ITERATIONS.value}',
    f'FixedReplayRunner.training_steps = {_TRAINING_STEPS.value}',
    f'FixedReplayRunner.evaluation_steps = {_EVALUATION_STEPS.value}',
    'FixedReplayRunner.max_steps_per_episode = 5000',
    # Two checkpoints: hold one, prefetch the other, swap every iteration.
    'FixedReplayBuffer.num_buffers_to_load = 1',
    f'FixedReplayBuffer.seed = {_SEED.value}',
  ]
  config = os.path.join(_CONFIGS_DIR, f'{_AGENT_NAME.value}.gin')
  runner = run_experiment.create_runner(
    base_dir, _AGENT_NAME.value, data_dir, [config], bindings
  )
  runner.run_experiment()
  return plotting.load_statistics(base_dir)


def _print_results(statistics):
  print(f'\n{_AGENT_NAME.value} on {_GAME.value}, offline:')
  print(
    f'{"iteration":>9} {"eval return":>12} {"episodes":>9} '
    f'{"train steps/s":>14} {"loss":>10}'
  )
  for iteration, stats in statistics.items():
    returns = stats.get('eval_episode_returns', [])
    losses = [
      v
      for k, v in stats.items()
      if k.startswith('train_average_')
      and k != 'train_average_steps_per_second'
    ]
    loss = f'{losses[0][0]:.4f}' if losses and losses[0] else 'n/a'
    speed = stats.get('train_average_steps_per_second', [float('nan')])[0]
    mean = f'{sum(returns) / len(returns):.1f}' if returns else 'n/a'
    print(
      f'{iteration:>9} {mean:>12} {len(returns):>9} {speed:>14.1f} '
      f'{loss:>10}'
    )


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}')
  data_dir = _dataset(_OUTPUT_DIR.value)
  summary = inspection.summarize_directory(data_dir, verify=True)
  print(inspection.format_table(summary))
  if not summary.ok:
    print(inspection.format_problems(summary))
    return 1
  _sample(data_dir)
  from fixed_replay.training import plotting

  base_dir = os.path.join(_OUTPUT_DIR.value, f'{_AGENT_NAME.value}_run')
  statistics = _train(data_dir, base_dir)
  _print_results(statistics)
  plot = os.path.join(_OUTPUT_DIR.value, 'eval_returns.png')
  plotting.plot_eval_returns([base_dir], plot, overwrite=True)
  print(f'\nRun in {base_dir}; evaluation plot in {plot}')
  return 0


if __name__ == '__main__':
  app.run(main)
