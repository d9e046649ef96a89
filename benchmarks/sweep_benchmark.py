"""Sweeps on Ray against trials run by hand, and a fresh process's start-up.

A sweep is many short-lived processes: each trial (and each Ray worker,
test or conversion worker) starts by importing TensorFlow, Dopamine and JAX,
and `fixed-replay sweep` adds a private Ray cluster. Both costs only pay off
if the sweep is faster than what a user would write instead, a shell loop.

Two parts (`--parts`):

* sweep: a CartPole dataset (random play, five 10,000-row checkpoints,
  written once under benchmarks/data/) and a sweep of `--agents` x `--seeds`
  trials with `configs/cartpole/<agent>.gin` (fixed_replay.training.sweep).
  The baseline is each trial as its own `fixed-replay train` process, one
  after another (the shell loop); then `sweep.run_sweep` on a private local
  Ray (the `fixed-replay sweep` code path, Ray's start and stop included):
  the ratio of the two wall times, each trial's Ray overhead (submission to
  result, less the time the trial ran), and starting and stopping a local
  Ray alone.
* startup: CPU seconds (user + system) of a fresh process running `import
  fixed_replay; from fixed_replay.training import run_experiment`, as Python
  imports it (the baseline) and after `heavy_imports.install()` (the
  collector paused during the imports, their objects frozen after), the
  median of `--repeats` processes each.

Usage:
  python benchmarks/sweep_benchmark.py [--parts=sweep,startup]
    [--agents=dqn,rem] [--seeds=0,1] [--iterations=30] [--repeats=5]
"""

import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
from absl import logging
import common
import numpy as np

_PARTS = flags.DEFINE_list('parts', ['sweep', 'startup'], 'Parts to run.')
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
_REPEATS = flags.DEFINE_integer('repeats', 5, 'startup: processes each.')

DATA = common.DATA_DIR / 'cartpole_sweep'
_IMPORTS = (
  'import fixed_replay; from fixed_replay.training import run_experiment'
)
_INSTALL = 'from fixed_replay import heavy_imports; heavy_imports.install(); '


def _children_cpu_seconds():
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def _run(command):
  """Runs a command in a fresh process; returns (wall s, CPU s)."""
  began, cpu = time.monotonic(), _children_cpu_seconds()
  done = subprocess.run(command, capture_output=True, text=True)
  if done.returncode:
    raise RuntimeError(f'{" ".join(command)} failed:\n{done.stderr[-3000:]}')
  return time.monotonic() - began, _children_cpu_seconds() - cpu


# ---------------------------------------------------------------- sweep


def _dataset():
  """Five checkpoints (one iteration of configs/cartpole/*.gin), made once."""
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
  from fixed_replay.training import sweep

  return sweep.plan(
    base_dir,
    data,
    agents=_AGENTS.value,
    seeds=[int(s) for s in _SEEDS.value],
    games=['CartPole'],
    gin_files=[
      str(common.BENCHMARK_DIR.parent / 'configs/cartpole/{agent}.gin')
    ],
    gin_bindings=[
      f'FixedReplayRunner.num_iterations = {_ITERATIONS.value}',
      f'FixedReplayRunner.training_steps = {_TRAINING_STEPS.value}',
    ],
  )


def _by_hand(trial):
  """Runs one trial as `fixed-replay train`: (wall s, CPU s)."""
  command = [
    sys.executable,
    '-m',
    'fixed_replay.cli',
    'train',
    f'--base_dir={trial.base_dir}',
    f'--replay_dir={trial.replay_dir}',
    f'--agent_name={trial.agent}',
    *[f'--gin_files={path}' for path in trial.gin_files],
    *[f'--gin_bindings={b}' for b in trial.gin_bindings],
    f'--gin_bindings=FixedReplayBuffer.seed = {trial.seed}',
  ]
  return _run(command)


def sweep_part(scratch):
  from fixed_replay import distributed
  from fixed_replay.training import sweep

  data = _dataset()
  trials = _plan(os.path.join(scratch, 'by_hand'), data)
  began = time.monotonic()
  hand = {trial.key: _by_hand(trial) for trial in trials}
  hand_wall = time.monotonic() - began
  trials = _plan(os.path.join(scratch, 'sweep'), data)
  result = sweep.run_sweep(trials, cpus_per_trial=_CPUS_PER_TRIAL.value)
  if result.failed:
    raise RuntimeError(f'trials failed: {result.failed}')
  began = time.monotonic()
  with distributed.cluster() as info:
    started = time.monotonic() - began
  ray_wall = time.monotonic() - began
  print(
    f'\nsweep: {len(trials)} trials ({", ".join(_AGENTS.value)} x seeds '
    f'{", ".join(_SEEDS.value)}) on CartPole, {_ITERATIONS.value} iterations '
    f'x {_TRAINING_STEPS.value} training steps; {_CPUS_PER_TRIAL.value:g} '
    f'CPU per trial on {info.num_cpus:g} CPUs'
  )
  print(
    f'{"trial":<24} {"by hand s":>9} {"(CPU s)":>8} {"sweep s":>8} '
    f'{"in task s":>9} {"(CPU s)":>8} {"Ray overhead s":>14}'
  )
  overheads = []
  for trial in trials:
    finished = result.finished[trial.key]
    overheads.append(result.seconds[trial.key] - finished['seconds'])
    wall, cpu = hand[trial.key]
    print(
      f'{trial.key:<24} {wall:>9.1f} {cpu:>8.1f} '
      f'{result.seconds[trial.key]:>8.1f} {finished["seconds"]:>9.1f} '
      f'{finished["cpu_seconds"]:>8.1f} {overheads[-1]:>14.2f}'
    )
  print(
    f'wall: by hand {hand_wall:.1f} s, sweep {result.wall_seconds:.1f} s '
    f'(Ray start and stop included): {hand_wall / result.wall_seconds:.2f}x'
  )
  print(
    f'Ray overhead per trial: mean {np.mean(overheads):.2f} s, max '
    f'{np.max(overheads):.2f} s; a local Ray alone starts in {started:.1f} s, '
    f'starts and stops in {ray_wall:.1f} s'
  )


# -------------------------------------------------------------- startup


def startup_part():
  rows = {
    'as Python imports (baseline)': _IMPORTS,
    'after heavy_imports.install()': _INSTALL + _IMPORTS,
  }
  print(
    f'\nstartup: CPU s of a fresh process importing the training modules, '
    f'median of {_REPEATS.value}'
  )
  baseline = None
  for name, code in rows.items():
    cpu = statistics.median(
      _run([sys.executable, '-c', code])[1] for _ in range(_REPEATS.value)
    )
    baseline = baseline or cpu
    print(f'  {name:<32} {cpu:6.2f} CPU-s  {cpu / baseline:5.2f}x')


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  print(f'{common.load_average()} at start ({os.cpu_count()} CPUs)')
  if 'sweep' in _PARTS.value:
    scratch = tempfile.mkdtemp(prefix='sweep_benchmark_')
    try:
      sweep_part(scratch)
    finally:
      shutil.rmtree(scratch, ignore_errors=True)
  if 'startup' in _PARTS.value:
    startup_part()
  print(f'{common.load_average()} at end')


if __name__ == '__main__':
  app.run(main)
