"""`fixed-replay generate`: writes a dataset in the DQN Replay Dataset layout.

Plays an Atari game or CartPole with a random, scripted or restored Dopamine
agent policy and writes Dopamine replay checkpoints. Prints a JSON summary
on stdout; progress and per-checkpoint log lines go to stderr. E.g.

  fixed-replay generate --output_dir=/tmp/pong --policy=scripted
  fixed-replay generate --output_dir=/tmp/cartpole --environment=cartpole
"""

import inspect
import json

from absl import flags

from fixed_replay import cli
from fixed_replay.generate import generate
from fixed_replay.sources.dopamine import environments

flags.DEFINE_string(
  'output_dir',
  None,
  'Local directory to write the checkpoints to; created if missing. A '
  'directory that already holds replay checkpoint files is refused.',
  required=True,
)
flags.DEFINE_enum(
  'environment',
  'atari',
  environments.ENVIRONMENTS,
  'atari: Dopamine atari_lib, (84, 84) uint8 frames, stack 4; cartpole: '
  'gym_lib CartPole-v0, (4, 1) float64 observations, stack 1.',
)
flags.DEFINE_string(
  'game', 'Pong', 'Atari game name, e.g. Pong or Breakout (atari only).'
)
flags.DEFINE_integer(
  'num_checkpoints', 2, 'Checkpoints (suffixes 0..N-1) to write.', lower_bound=1
)
flags.DEFINE_integer(
  'checkpoint_rows',
  1000,
  'Rows per checkpoint = replay capacity (the published data: 1000000).',
  lower_bound=2,
)
flags.DEFINE_enum(
  'policy',
  'random',
  generate.POLICIES,
  'Behaviour policy: random, scripted (CartPole, Pong, Breakout) or agent '
  '(a Dopamine agent restored from --agent_checkpoint_dir).',
)
flags.DEFINE_float(
  'epsilon',
  0.1,
  'Probability of a uniform random action around the scripted or agent '
  'policy.',
  lower_bound=0.0,
  upper_bound=1.0,
)
flags.DEFINE_integer(
  'action_repeat',
  1,
  'Agent steps each action of the random policy is held for.',
  lower_bound=1,
)
flags.DEFINE_integer(
  'seed', 0, 'Seed; the same seed and flags give identical files.'
)
flags.DEFINE_integer(
  'cursor',
  None,
  'Write position at each dump, in [0, checkpoint_rows); default '
  'checkpoint_rows - 1 (published layout). Checkpoint k is dumped at '
  'add_count = cursor + k * checkpoint_rows.',
)
flags.DEFINE_bool(
  'write_episode_end_indices',
  False,
  'Keep the episode_end_indices files newer Dopamine writes (the published '
  'dataset has none).',
)
flags.DEFINE_integer(
  'max_steps_per_episode',
  None,
  'Cut episodes (stored as terminal) after this many agent steps; default '
  f'{environments.ATARI_MAX_STEPS_PER_EPISODE} for Atari, '
  f'{environments.CARTPOLE_MAX_STEPS_PER_EPISODE} for CartPole.',
  lower_bound=1,
)
flags.DEFINE_bool(
  'sticky_actions', True, 'Atari sticky actions (repeat probability 0.25).'
)
flags.DEFINE_string(
  'agent_checkpoint_dir',
  None,
  'Dopamine Runner base_dir (or its checkpoints/ directory) of the agent '
  'for --policy=agent.',
)
flags.DEFINE_string(
  'agent_name',
  'dqn',
  'Agent name as Dopamine create_agent takes it (dqn, rainbow, jax_dqn, '
  '...).',
)
flags.DEFINE_multi_string(
  'gin_files', [], 'Gin files the agent was trained with (--policy=agent).'
)
flags.DEFINE_multi_string(
  'gin_bindings', [], 'Extra gin bindings (--policy=agent).'
)
flags.DEFINE_bool(
  'progress', True, 'Show a progress bar when stderr is a terminal.'
)


def main(argv):
  cli.take_flags_only(argv)
  # Each argument of generate_dataset is the flag of its name.
  summary = generate.generate_dataset(
    **{
      name: flags.FLAGS[name].value
      for name in inspect.signature(generate.generate_dataset).parameters
    }
  )
  # One JSON line on stdout for scripts; the log lines go to stderr.
  print(
    json.dumps(
      {
        'output_dir': summary.output_dir,
        'suffixes': summary.suffixes,
        'add_counts': [c.add_count for c in summary.checkpoints],
        'episodes': len(summary.episode_returns),
        'mean_return': summary.mean_return,
        'agent_steps': summary.agent_steps,
        'seconds': round(summary.seconds, 2),
        'rows_per_second': round(summary.rows_per_second, 1),
      }
    )
  )
