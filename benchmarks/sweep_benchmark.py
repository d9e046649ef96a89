"""Sweep on Ray against the same trials run one after another by hand.

Writes (once, then reuses) a CartPole dataset under benchmarks/data/ with
`fixed_replay.generate.generate`, plans a sweep of `--agents` x `--seeds`
trials with `configs/cartpole/<agent>.gin` (`fixed_replay.training.sweep`),
then measures, in this order:

1. by hand: each trial as its own `fixed-replay train` process with the
   trial's gin files and bindings, one after another (what a shell loop
   does);
2. the sweep: `sweep.run_sweep` on a private local Ray (the `fixed-replay
   sweep` code path), `--cpus_per_trial` CPUs per trial, all trials in fresh
   Ray worker processes; the wall time includes starting and stopping Ray;
3. Ray's cost: starting and stopping the local cluster alone, and
   `--noop_tasks` empty tasks each in a fresh worker process.

Ray's overhead per trial is the time from submitting a trial to receiving
its result minus the time the trial's function ran in the worker (worker
process start, scheduling, returning the result). The target on 2 cores is
a sweep >= 1.8x faster than the trials by hand.

Usage:
  python benchmarks/sweep_benchmark.py [--agents=dqn,rem] [--seeds=0,1]
"""

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
from absl import logging
import common
import numpy as np

from fixed_replay import distributed
from fixed_replay.training import sweep

_AGENTS = flags.DEFINE_list('agents', ['dqn', 'rem'], 'Agents of the sweep.')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1'], 'Seeds of the sweep.')
_ITERATIONS = flags.DEFINE_integer(
  'iterations',
  30,
  'FixedReplayRunner.num_iterations of every trial (30: about 2 minutes a '
  'trial on an idle core, so that starting Ray weighs as little as in real '
  'sweeps, whose trials take hours).',
)
_TRAINING_STEPS = flags.DEFINE_integer(
  'training_steps', 1000, 'FixedReplayRunner.training_steps per iteration.'
)
_CPUS_PER_TRIAL = flags.DEFINE_float(
  'cpus_per_trial', 1.0, 'CPUs Ray reserves per trial.'
)
_NOOP_TASKS = flags.DEFINE_integer(
  'noop_tasks', 8, 'Empty tasks run to measure a fresh worker process.'
)
_KEEP = flags.DEFINE_boolean(
  'keep', False, 'Keep the trial directories (printed) instead of deleting.'
)

ROOT = os.path.dirname(common.BENCHMARK_DIR)
DATA = common.DATA_DIR / 'cartpole_sweep'


def _dataset():
  """Five checkpoints of 10,000 rows of random CartPole play, made once.

  Five because configs/cartpole/*.gin hold five checkpoints per iteration.
  """
  from fixed_replay.generate import generate
  from fixed_replay.sources.dopamine import inspection

  summary = inspection.summarize_directory(str(DATA))
  if DATA.is_dir() and summary.ok and summary.num_complete == 5:
    return str(DATA)
  shutil.rmtree(DATA, ignore_errors=True)
  generate.generate_dataset(
    str(DATA),
    environment='cartpole',
    num_checkpoints=5,
    checkpoint_rows=10_000,
    policy='random',
    seed=0,
  )
  return str(DATA)


def _plan(base_dir, data):
  return sweep.plan(
    base_dir,
    data,
    agents=_AGENTS.value,
    seeds=[int(s) for s in _SEEDS.value],
    games=['CartPole'],
    gin_files=[os.path.join(ROOT, 'configs', 'cartpole', '{agent}.gin')],
    gin_bindings=[
      f'FixedReplayRunner.num_iterations = {_ITERATIONS.value}',
      f'FixedReplayRunner.training_steps = {_TRAINING_STEPS.value}',
    ],
  )


def _by_hand(trials):
  """Runs each trial as `fixed-replay train`, one after another.

  Returns:
    ({key: wall seconds}, {key: CPU seconds of the process}).
  """
  seconds, cpu_seconds = {}, {}
  for trial in trials:
    command = [
      sys.executable,
      '-m',
      'fixed_replay.cli',
      'train',
      f'--base_dir={trial.base_dir}',
      f'--replay_dir={trial.replay_dir}',
      f'--agent_name={trial.agent}',
    ]
    command += [f'--gin_files={path}' for path in trial.gin_files]
    command += [f'--gin_bindings={b}' for b in trial.gin_bindings]
    command += [f'--gin_bindings=FixedReplayBuffer.seed = {trial.seed}']
    began = time.monotonic()
    cpu_before = _children_cpu_seconds()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
      raise RuntimeError(f'{" ".join(command)} failed:\n{done.stderr[-3000:]}')
    seconds[trial.key] = time.monotonic() - began
    cpu_seconds[trial.key] = _children_cpu_seconds() - cpu_before
    logging.info('By hand: %s in %.1f s', trial.key, seconds[trial.key])
  return seconds, cpu_seconds


def _children_cpu_seconds():
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def _ray_costs():
  """Seconds to start and stop a local Ray, and per fresh-process task."""
  began = time.monotonic()
  with distributed.cluster():
    started = time.monotonic()
  lifecycle = time.monotonic() - began
  with distributed.cluster() as info:
    tasks = [
      distributed.Task(f'noop{i}', os.getpid) for i in range(_NOOP_TASKS.value)
    ]
    t0 = time.monotonic()
    outcome = distributed.run_tasks(tasks, poll_seconds=0.5)
    noop_wall = time.monotonic() - t0
  return {
    'start': started - began,
    'start_and_stop': lifecycle,
    'noop_latency': float(np.mean(list(outcome.seconds.values()))),
    'noop_wall': noop_wall,
    'cpus': info.num_cpus,
  }


def main(argv):
  del argv
  logging.set_verbosity(logging.INFO)
  data = _dataset()
  scratch = tempfile.mkdtemp(prefix='sweep_benchmark_')
  try:
    print(f'{common.load_average()} at start ({os.cpu_count()} CPUs)')
    hand_trials = _plan(os.path.join(scratch, 'by_hand'), data)
    began = time.monotonic()
    hand = _by_hand(hand_trials)
    hand_wall = time.monotonic() - began
    print(f'{common.load_average()} after the trials by hand')
    trials = _plan(os.path.join(scratch, 'sweep'), data)
    result = sweep.run_sweep(trials, cpus_per_trial=_CPUS_PER_TRIAL.value)
    if result.failed:
      raise RuntimeError(f'trials failed: {result.failed}')
    costs = _ray_costs()
    print(f'{common.load_average()} at end')
  finally:
    if _KEEP.value:
      print(f'Trial directories kept in {scratch}')
    else:
      shutil.rmtree(scratch, ignore_errors=True)
  _print(trials, hand, hand_wall, result, costs)


def _print(trials, hand, hand_wall, result, costs):
  print(
    f'\n{len(trials)} trials ({", ".join(_AGENTS.value)} x seeds '
    f'{", ".join(_SEEDS.value)}) on CartPole, {_ITERATIONS.value} iterations '
    f'x {_TRAINING_STEPS.value} training steps, configs/cartpole/<agent>.gin; '
    f'{_CPUS_PER_TRIAL.value:g} CPU per trial on {costs["cpus"]:g} CPUs'
  )
  hand, hand_cpu = hand
  print(
    f'{"trial":<24} {"by hand s":>9} {"(CPU s)":>8} {"sweep s":>8} '
    f'{"in task s":>9} {"(CPU s)":>8} {"Ray overhead s":>14}'
  )
  overheads = []
  for trial in trials:
    finished = result.finished[trial.key]
    overhead = result.seconds[trial.key] - finished['seconds']
    overheads.append(overhead)
    print(
      f'{trial.key:<24} {hand[trial.key]:>9.1f} {hand_cpu[trial.key]:>8.1f} '
      f'{result.seconds[trial.key]:>8.1f} {finished["seconds"]:>9.1f} '
      f'{finished["cpu_seconds"]:>8.1f} {overhead:>14.2f}'
    )
  speedup = hand_wall / result.wall_seconds
  verdict = 'PASS' if speedup >= 1.8 else 'FAIL'
  print(
    f'wall: by hand {hand_wall:.1f} s, sweep {result.wall_seconds:.1f} s '
    f'(Ray start and stop included): x{speedup:.2f} faster (target >= 1.8x '
    f'on 2 cores: {verdict})'
  )
  print(
    f'Ray overhead per trial (submission to result minus time in the task): '
    f'mean {np.mean(overheads):.2f} s, max {np.max(overheads):.2f} s'
  )
  print(
    f'Ray alone: local cluster start {costs["start"]:.1f} s, start and '
    f'stop {costs["start_and_stop"]:.1f} s; an empty task in a fresh worker '
    f'process {costs["noop_latency"]:.2f} s from submission to result '
    f'({_NOOP_TASKS.value} tasks in {costs["noop_wall"]:.1f} s)'
  )


if __name__ == '__main__':
  app.run(main)
