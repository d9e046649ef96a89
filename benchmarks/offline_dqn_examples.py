"""Do the single-file examples learn? CartPole, Dopamine files and store alike.

Writes (once) random-policy CartPole data with `fixed-replay generate
--environment=cartpole --policy=random --num_checkpoints=2
--checkpoint_rows=5000` (about 22 steps an episode) and its compact store
(`fixed-replay convert`), then runs examples/torch_offline_dqn.py,
examples/jax_offline_dqn.py and examples/torchrl_offline_dqn.py on each, each
in a fresh process, for `--num_updates` (4,000) updates with a greedy
evaluation (10 episodes) every `--eval_every` (1,000) updates, the spacing of
Dopamine's CartPole iterations. A run passes when its final return, the last
line a user reads, reaches `--target_return` (150), the mark
cartpole_learning.py sets the Dopamine agents. It prints every evaluation,
the final one, and the wall time of each run.

Usage:
  python benchmarks/offline_dqn_examples.py [--seeds=0,1,2]
"""

import os
import re
import subprocess
import sys
import time

from absl import app
from absl import flags
import common

_DATA_DIR = flags.DEFINE_string(
  'data_dir',
  str(common.DATA_DIR / 'cartpole_random_2x5000'),
  'Where the CartPole data is written (and reused).',
)
_NUM_UPDATES = flags.DEFINE_integer('num_updates', 4000, 'Updates a run.')
_EVAL_EVERY = flags.DEFINE_integer('eval_every', 1000, 'Updates between evals.')
_TARGET_RETURN = flags.DEFINE_float('target_return', 150.0, 'Pass mark.')
_SEEDS = flags.DEFINE_list('seeds', ['0'], 'Seeds to run.')

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = (
  'torch_offline_dqn.py',
  'jax_offline_dqn.py',
  'torchrl_offline_dqn.py',
)


def _cli(*args):
  subprocess.run(
    [sys.executable, '-m', 'fixed_replay.cli', *args],
    check=True,
    stdout=subprocess.DEVNULL,
  )


def ensure_data(directory):
  """(Dopamine directory, store directory), written when missing."""
  dopamine = os.path.join(directory, 'dopamine')
  store = os.path.join(directory, 'store')
  if not os.path.exists(os.path.join(dopamine, 'add_count_ckpt.1.gz')):
    _cli(
      'generate',
      '--environment=cartpole',
      '--policy=random',
      '--num_checkpoints=2',
      '--checkpoint_rows=5000',
      '--seed=0',
      f'--output_dir={dopamine}',
    )
  if not os.path.isdir(store):
    _cli('convert', dopamine, store)
  return dopamine, store


def run(example, replay_dir, seed):
  """(evaluations [(update, return)], final return, wall s) of one run."""
  began = time.perf_counter()
  completed = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, 'examples', example),
      f'--replay_dir={replay_dir}',
      '--environment=cartpole',
      f'--num_updates={_NUM_UPDATES.value}',
      f'--eval_every={_EVAL_EVERY.value}',
      f'--seed={seed}',
    ],
    capture_output=True,
    text=True,
    check=True,
  )
  wall = time.perf_counter() - began
  evaluations = [
    (int(update), float(value))
    for update, value in re.findall(
      r'eval return at update (\d+): (-?[\d.]+)', completed.stderr
    )
  ]
  final = float(completed.stdout.strip().splitlines()[-1].split(':')[1])
  return evaluations, final, wall


def main(argv):
  del argv
  dopamine, store = ensure_data(_DATA_DIR.value)
  print(f'CartPole random play, 2 x 5,000 rows; {common.load_average()}')
  print(f'{"example":<22} {"data":<9} seed  evaluations (update: return)')
  failures = 0
  for example in EXAMPLES:
    for layout, replay_dir in (('dopamine', dopamine), ('store', store)):
      for seed in _SEEDS.value:
        evaluations, final, wall = run(example, replay_dir, int(seed))
        best = max(value for _, value in evaluations)
        passed = final >= _TARGET_RETURN.value
        failures += not passed
        curve = ', '.join(f'{u}: {v:.0f}' for u, v in evaluations)
        print(
          f'{example:<22} {layout:<9} {seed:>4}  {curve}  best {best:.0f} '
          f'final {final:.1f}  {wall:.0f} s  {"PASS" if passed else "FAIL"}'
        )
  return 1 if failures else 0


if __name__ == '__main__':
  app.run(main)
