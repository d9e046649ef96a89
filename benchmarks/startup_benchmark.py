"""Start-up: the CPU a fresh process spends before and around its first step.

Every `fixed-replay train` (and every sweep trial, test and conversion
worker) starts by importing TensorFlow, Dopamine and JAX. fixed_replay's
processes import them with the cyclic collector paused and freeze what the
imports left (fixed_replay/heavy_imports.py). This measures, in fresh
processes, each run `--repeats` times (the median is printed), CPU seconds
(user + system, from the kernel's accounting of the child):

* the training imports: `import fixed_replay; from fixed_replay.training
  import run_experiment`, as Python runs them (the baseline) and with
  `heavy_imports.install()` first;
* one tiny `fixed-replay train` iteration (Atari DQN of configs/dqn.gin on
  two small checkpoints of Pong, 20 training and 20 evaluation steps), as
  the command runs it and with `heavy_imports.install` made a no-op (the
  baseline).

The data (two 1,000-row checkpoints of Pong played by Dopamine's
environment) is written once under benchmarks/data/startup_pong/.

Usage: python benchmarks/startup_benchmark.py [--repeats=3]
"""

import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile

from absl import app
from absl import flags
from absl import logging

import fixed_replay  # noqa: F401  (sets TensorFlow up before generate)

REPEATS = flags.DEFINE_integer('repeats', 3, 'Runs of each measurement.')

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / 'benchmarks' / 'data' / 'startup_pong' / 'replay_logs'

_IMPORTS = (
  'import fixed_replay; from fixed_replay.training import run_experiment'
)
_INSTALL = 'from fixed_replay import heavy_imports; heavy_imports.install(); '
_NO_INSTALL = (
  'from fixed_replay import heavy_imports; '
  'heavy_imports.install = lambda: None; '
)
_TRAIN = (
  'import sys; from fixed_replay import cli; sys.exit(cli.main(sys.argv))'
)
_TINY = (
  'FixedReplayRunner.num_iterations = 1',
  'FixedReplayRunner.training_steps = 20',
  'FixedReplayRunner.evaluation_steps = 20',
  'FixedReplayRunner.max_steps_per_episode = 20',
)


def _dataset():
  if not (DATA / 'add_count_ckpt.1.gz').exists():
    from fixed_replay.generate import generate

    logging.info('Writing two 1,000-row checkpoints of Pong to %s', DATA)
    shutil.rmtree(DATA, ignore_errors=True)
    generate.generate_dataset(
      str(DATA), game='Pong', num_checkpoints=2, checkpoint_rows=1000
    )
  return DATA


def _cpu_seconds(argv):
  """CPU seconds (user + system) of one fresh process running argv."""
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  result = subprocess.run(argv, capture_output=True, text=True, check=False)
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  if result.returncode:
    raise RuntimeError(f'{argv} exited {result.returncode}:\n{result.stderr}')
  return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _median(argv_of_run):
  return statistics.median(
    _cpu_seconds(argv_of_run(i)) for i in range(REPEATS.value)
  )


def main(argv):
  del argv
  data = _dataset()
  python = [sys.executable, '-c']
  imports = {
    'as Python imports (baseline)': _median(lambda _: python + [_IMPORTS]),
    'collector paused, then frozen': _median(
      lambda _: python + [_INSTALL + _IMPORTS]
    ),
  }
  work = pathlib.Path(tempfile.mkdtemp(prefix='startup_benchmark_'))

  def train(prelude):
    def argv_of_run(i):
      return (
        python
        + [
          prelude + _TRAIN,
          'train',
          f'--replay_dir={data}',
          '--agent_name=dqn',
          f'--gin_files={ROOT / "configs" / "dqn.gin"}',
          f'--base_dir={work / f"{len(prelude)}_{i}"}',
        ]
        + [f'--gin_bindings={b}' for b in _TINY]
      )

    return _median(argv_of_run)

  trains = {
    'collector on (baseline)': train(_NO_INSTALL),
    'as the command runs (paused imports)': train(''),
  }
  shutil.rmtree(work, ignore_errors=True)
  print(f'\nStart-up CPU seconds, median of {REPEATS.value} fresh processes')
  print(f'(load average {os.getloadavg()[0]:.2f} at the end)')
  for title, rows in (
    ('training imports', imports),
    ('one tiny `fixed-replay train` (Pong, DQN)', trains),
  ):
    print(f'\n{title}:')
    baseline = next(iter(rows.values()))
    for name, seconds in rows.items():
      print(f'  {name:<40} {seconds:6.2f} CPU-s  {seconds / baseline:5.2f}x')


if __name__ == '__main__':
  app.run(main)
