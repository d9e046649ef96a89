"""`fixed-replay demo`: the main job on an embedded default.

Plays a real Atari game (Pong) through Dopamine's environment to write a small
dataset in exactly the DQN Replay Dataset layout, then inspects and verifies
it with the same code `fixed-replay inspect --verify` runs, and samples a few
minibatches through the FixedReplayBuffer.

  fixed-replay demo --output_dir=demo_output
"""

import os
import time

from absl import app
from absl import flags
from absl import logging

from fixed_replay import generate
from fixed_replay import inspection

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
  from fixed_replay.fixed_replay_buffer import FixedReplayBuffer

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
  return 0


if __name__ == '__main__':
  app.run(main)
