"""`fixed-replay sweep` on a real local Ray: CartPole trials, kills, reruns."""

import os
import re
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from fixed_replay.training import plotting
from fixed_replay.training import sweep
from fixed_replay.training import trial as trial_lib

# The Ray tests share one xdist worker (and conftest's local_ray there); the
# killed-sweep test, which starts clusters of its own, has a group of its own.
pytestmark = pytest.mark.xdist_group('ray')

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, 'configs', 'cartpole', '{agent}.gin')
MARK = 'FIXED_REPLAY_TEST_MARK'
# How long processes may take to exit after the command ends: seconds when
# idle, more on a loaded machine (the wait returns as soon as they are gone).
GRACE_SECONDS = 60
# Small enough that a trial is its process start plus a few seconds.
TINY = (
  'FixedReplayRunner.training_steps = 100',
  'FixedReplayRunner.evaluation_steps = 100',
  'FixedReplayBuffer.num_buffers_to_load = 1',
  'FixedReplayBuffer.batch_size = 32',
)


@pytest.fixture(scope='module')
def dataset(tmp_path_factory):
  """Two CartPole checkpoints of random play, written by Dopamine."""
  from fixed_replay.generate import generate

  directory = tmp_path_factory.mktemp('cartpole') / 'replay_logs'
  generate.generate_dataset(
    str(directory),
    environment='cartpole',
    num_checkpoints=2,
    checkpoint_rows=500,
    policy='random',
    seed=0,
    progress=False,
  )
  return str(directory)


def sweep_argv(
  base_dir, dataset, iterations, agents='dqn', seeds='0,1', bindings=()
):
  argv = [
    sys.executable,
    '-m',
    'fixed_replay.cli',
    'sweep',
    f'--base_dir={base_dir}',
    f'--replay_dir={dataset}',
    '--games=CartPole',
    f'--agents={agents}',
    f'--seeds={seeds}',
    f'--gin_files={CONFIG}',
    f'--gin_bindings=FixedReplayRunner.num_iterations = {iterations}',
  ]
  return argv + [f'--gin_bindings={b}' for b in TINY + tuple(bindings)]


def marked_environment(mark):
  """This environment plus a mark every process it starts inherits."""
  return dict(os.environ, **{MARK: mark})


def marked_processes(mark):
  """Live processes (zombies excluded) whose environment holds the mark."""
  found = []
  for process in psutil.process_iter(['pid']):
    try:
      if process.status() == psutil.STATUS_ZOMBIE:
        continue
      if process.environ().get(MARK) == mark:
        found.append(process)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
      continue
  return found


def describe(processes):
  """Command lines of processes, which may have exited since."""
  described = []
  for process in processes:
    try:
      described.append(' '.join(process.cmdline()))
    except psutil.NoSuchProcess:
      described.append(f'{process.pid} (exited since)')
  return described


def wait_until_gone(mark, seconds, keep=lambda process: True):
  """Waits for the marked processes `keep` selects to exit; returns those
  still alive after `seconds`."""
  deadline = time.monotonic() + seconds
  while True:
    alive = []
    for process in marked_processes(mark):
      try:
        if keep(process):
          alive.append(process)
      except psutil.NoSuchProcess:  # Exited (or a zombie) since listed.
        continue
    if not alive or time.monotonic() > deadline:
      return alive
    time.sleep(0.5)


def end_marked_processes(mark):
  """Kills what a test started and left behind; returns their names."""
  names = []
  for process in marked_processes(mark):
    try:
      names.append(' '.join(process.cmdline())[:60])
      process.kill()
    except psutil.NoSuchProcess:
      continue
  psutil.wait_procs(marked_processes(mark), timeout=10)
  return names


def trial_dirs(base_dir):
  return sorted(
    os.path.join(root)
    for root, _, files in os.walk(base_dir)
    if trial_lib.STATE_FILE in files
  )


def started_iterations(trial_dir):
  """Iteration numbers in 'Starting iteration N' lines, every attempt."""
  with open(os.path.join(trial_dir, trial_lib.LOG_FILE)) as f:
    return [int(n) for n in re.findall(r'Starting iteration (\d+)', f.read())]


# --------------------------------------------- planning (no Ray, no TF)


def test_plan_fills_placeholders_per_trial(tmp_path):
  for game in ('Pong', 'Breakout'):
    for run in ('1', '2'):
      (tmp_path / 'data' / game / run).mkdir(parents=True)
  (tmp_path / 'configs').mkdir()
  for agent in ('dqn', 'rem'):
    (tmp_path / 'configs' / f'{agent}.gin').write_text('# empty\n')
  trials = sweep.plan(
    str(tmp_path / 'sweep'),
    str(tmp_path / 'data' / '{game}' / '{run}'),
    agents=['dqn', 'rem'],
    seeds=[0, 7],
    games=['Pong', 'Breakout'],
    runs=['1', '2'],
    gin_files=[str(tmp_path / 'configs' / '{agent}.gin')],
    gin_bindings=["FixedReplayBuffer.data_dir = 'x/{game}'"],
  )
  assert len(trials) == 16
  assert len({t.base_dir for t in trials}) == 16
  rem = next(
    t
    for t in trials
    if (t.game, t.run, t.agent, t.seed) == ('Breakout', '2', 'rem', 7)
  )
  assert rem.base_dir == str(tmp_path / 'sweep/Breakout/2/rem/seed_7')
  assert rem.replay_dir == str(tmp_path / 'data/Breakout/2')
  assert rem.gin_files == (str(tmp_path / 'configs/rem.gin'),)
  # The game reaches Atari evaluation first; user bindings come after it.
  assert rem.gin_bindings == (
    "atari_lib.create_atari_environment.game_name = 'Breakout'",
    "FixedReplayBuffer.data_dir = 'x/Breakout'",
  )
  assert rem.key == 'Breakout/2/rem/seed_7'


@pytest.mark.parametrize(
  'change, message',
  [
    (dict(replay_dir='{data}/{gam}'), 'unknown placeholder'),
    (dict(games=['Pong', 'Breakout']), 'would train on the same data'),
    (dict(agents=['dqn', 'nope']), 'unknown agent'),
    (dict(seeds=[1, 1]), 'distinct'),
    (dict(games=['../up']), 'cannot name a directory'),
    (dict(gin_files=['no_such.gin']), 'no_such.gin: no such file'),
  ],
)
def test_plan_rejects_bad_sweeps(tmp_path, change, message):
  (tmp_path / 'data').mkdir()
  arguments = dict(
    base_dir=str(tmp_path / 'sweep'),
    replay_dir=str(tmp_path / 'data'),
    agents=['dqn'],
    seeds=[0],
    games=['Pong'],
  )
  if 'replay_dir' in change:
    change = dict(replay_dir=str(tmp_path / change['replay_dir']))
  if 'gin_files' in change:
    change = dict(gin_files=[str(tmp_path / change['gin_files'][0])])
  arguments.update(change)
  with pytest.raises(ValueError, match=message):
    sweep.plan(**arguments)


def test_plan_names_a_missing_dataset(tmp_path):
  with pytest.raises(ValueError, match='dataset .*Pong/1: no such directory'):
    sweep.plan(
      str(tmp_path / 'sweep'),
      str(tmp_path / '{game}' / '{run}'),
      agents=['dqn'],
      seeds=[0],
      games=['Pong'],
    )


def test_trial_of_another_configuration_is_refused(tmp_path):
  (tmp_path / 'data').mkdir()
  (tmp_path / 'a.gin').write_text('# a\n')

  def plan(bindings):
    return sweep.plan(
      str(tmp_path / 'sweep'),
      str(tmp_path / 'data'),
      agents=['dqn'],
      seeds=[0],
      games=['Pong'],
      gin_files=[str(tmp_path / 'a.gin')],
      gin_bindings=bindings,
    )

  (trial,) = plan(['FixedReplayRunner.num_iterations = 3'])
  os.makedirs(trial.base_dir)
  trial_lib.write_state(
    trial.base_dir, {'config': trial.config(), 'status': 'done'}
  )
  assert sweep.pending([trial]) == ([trial], [])
  (changed,) = plan(['FixedReplayRunner.num_iterations = 5'])
  with pytest.raises(ValueError, match='gin_bindings differ'):
    sweep.pending([changed])
  assert sweep.pending([changed], allow_changed_config=True) == ([], [changed])
  # Editing a gin file is a change too.
  (tmp_path / 'a.gin').write_text('# b\n')
  with pytest.raises(ValueError, match='gin_file_sha256 differ'):
    sweep.pending([trial])


def test_plan_without_games_sweeps_the_one_dataset(tmp_path):
  (tmp_path / 'Pong' / '1').mkdir(parents=True)
  (tmp_path / 'cartpole' / 'replay_logs').mkdir(parents=True)
  arguments = dict(agents=['dqn'], seeds=[0, 1])
  trials = sweep.plan(
    str(tmp_path / 'sweep'), str(tmp_path / 'Pong' / '1'), **arguments
  )
  assert [t.key for t in trials] == ['Pong/1/dqn/seed_0', 'Pong/1/dqn/seed_1']
  # No game binding: train evaluates in the data's game.
  assert all(t.gin_bindings == () for t in trials)
  (trial, _) = sweep.plan(
    str(tmp_path / 'sweep'),
    str(tmp_path / 'cartpole' / 'replay_logs'),
    **arguments,
  )
  assert trial.key == 'cartpole/1/dqn/seed_0'
  assert trial.replay_dir == str(tmp_path / 'cartpole' / 'replay_logs')
  with pytest.raises(ValueError, match='has {game}: list the values'):
    sweep.plan(str(tmp_path / 'sweep'), str(tmp_path / '{game}'), **arguments)
  with pytest.raises(ValueError, match='without --games: --replay_dir names'):
    sweep.plan(
      str(tmp_path / 'sweep'),
      str(tmp_path / 'Pong' / '1'),
      runs=['1', '2'],
      **arguments,
    )


def test_plan_reads_configs_from_the_installed_copy_outside_the_repo(
  tmp_path, monkeypatch
):
  (tmp_path / 'cartpole' / 'replay_logs').mkdir(parents=True)
  monkeypatch.chdir(tmp_path)  # No configs/ here: the packaged copy is used.
  (trial,) = sweep.plan(
    str(tmp_path / 'sweep'),
    str(tmp_path / 'cartpole' / 'replay_logs'),
    agents=['dqn'],
    seeds=[0],
    gin_files=['configs/cartpole/{agent}.gin'],
  )
  (path,) = trial.gin_files
  assert os.path.isfile(path)
  assert path.endswith(os.path.join('configs', 'cartpole', 'dqn.gin'))
  assert not path.startswith(str(tmp_path))
  with pytest.raises(ValueError, match='configs/nothing.gin: no such file'):
    sweep.plan(
      str(tmp_path / 'sweep'),
      str(tmp_path / 'cartpole' / 'replay_logs'),
      agents=['dqn'],
      seeds=[0],
      gin_files=['configs/nothing.gin'],
    )


def test_cli_refusal_prints_the_reason_only(tmp_path):
  """A sweep refused for a changed config: its reason, not --help."""
  (tmp_path / 'data').mkdir()
  (tmp_path / 'a.gin').write_text('# a\n')
  common = dict(agents=['dqn'], seeds=[0], games=['Pong'], runs=['1'])
  (trial,) = sweep.plan(
    str(tmp_path / 'sweep'),
    str(tmp_path / 'data'),
    gin_files=[str(tmp_path / 'a.gin')],
    gin_bindings=['FixedReplayRunner.num_iterations = 3'],
    **common,
  )
  os.makedirs(trial.base_dir)
  trial_lib.write_state(
    trial.base_dir, {'config': trial.config(), 'status': 'done'}
  )
  completed = subprocess.run(
    [
      sys.executable,
      '-m',
      'fixed_replay.cli',
      'sweep',
      f'--base_dir={tmp_path / "sweep"}',
      f'--replay_dir={tmp_path / "data"}',
      '--games=Pong',
      '--agents=dqn',
      '--seeds=0',
      '--runs=1',
      f'--gin_files={tmp_path / "a.gin"}',
      '--gin_bindings=FixedReplayRunner.num_iterations = 5',
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert completed.returncode == 2, completed.stderr[-3000:]
  assert 'gin_bindings differ' in completed.stderr
  assert '--allow_changed_config' in completed.stderr
  assert '--cpus_per_trial' not in completed.stderr  # No flags' help.
  assert len(completed.stderr.strip().splitlines()) < 6, completed.stderr


def test_cli_refuses_a_bad_sweep_before_starting_ray(tmp_path):
  # `fixed-replay sweep` as a user starts it, in the core tier: the grid is
  # checked, and refused with its reason, before Ray or a trial starts.
  (tmp_path / 'data').mkdir()
  argv = sweep_argv(
    str(tmp_path / 'sweep'), str(tmp_path / 'data'), 1, agents='dqn,nope'
  )
  result = subprocess.run(
    argv, capture_output=True, text=True, timeout=120, check=False
  )
  assert result.returncode != 0
  assert "unknown agent(s) ['nope']" in result.stderr, result.stderr[-3000:]
  assert 'Ray:' not in result.stderr
  assert not (tmp_path / 'sweep' / 'CartPole').exists()


# ------------------------------------------------ sweeps, real processes


@pytest.fixture(scope='module')
def finished_sweep(dataset, tmp_path_factory):
  """A 1 agent x 2 seeds CartPole sweep run to the end by the CLI.

  Two trials: as many as the local cluster runs at once on two CPUs, and
  enough for the report's means over seeds (test_report covers tables of
  several agents and games on logged trials).
  """
  base_dir = str(tmp_path_factory.mktemp('sweep') / 'sweep')
  argv = sweep_argv(base_dir, dataset, iterations=2)
  mark = uuid.uuid4().hex
  result = subprocess.run(
    argv,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
    env=marked_environment(mark),
  )
  left = wait_until_gone(mark, seconds=GRACE_SECONDS)
  end_marked_processes(mark)
  return base_dir, argv, result, left


@pytest.mark.slow
def test_sweep_runs_every_trial_to_the_end(finished_sweep):
  base_dir, _, result, left = finished_sweep
  assert result.returncode == 0, result.stderr[-3000:]
  assert '2 trials: 2 done, 0 failed' in result.stdout
  # Ray ran on the loopback only, and nothing of it outlived the command.
  assert 'started a local cluster on 127.0.0.1:' in result.stderr
  assert not left, describe(left)
  directories = trial_dirs(base_dir)
  assert [os.path.relpath(d, base_dir) for d in directories] == [
    'CartPole/1/dqn/seed_0',
    'CartPole/1/dqn/seed_1',
  ]
  for directory in directories:
    state = trial_lib.read_state(directory)
    assert state['status'] == 'done'
    assert [a['outcome'] for a in state['attempts']] == ['done']
    iterations, _ = plotting.load_eval_returns(directory)
    assert list(iterations) == [0, 1]
    assert started_iterations(directory) == [0, 1]


def test_sweep_without_games_trains_on_the_one_dataset(dataset, tmp_path):
  base_dir = str(tmp_path / 'sweep')
  argv = sweep_argv(base_dir, dataset, iterations=1, agents='dqn', seeds='0')
  argv.remove('--games=CartPole')
  mark = uuid.uuid4().hex
  result = subprocess.run(
    argv,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
    env=marked_environment(mark),
  )
  # What outlives the command is test_sweep_runs_every_trial_to_the_end's
  # business; here it is only cleaned up.
  wait_until_gone(mark, seconds=GRACE_SECONDS)
  end_marked_processes(mark)
  assert result.returncode == 0, result.stderr[-3000:]
  assert '1 trial: 1 done, 0 failed' in result.stdout
  # Named after the dataset's directory (CartPole data names no game).
  name = os.path.basename(os.path.dirname(dataset))
  (directory,) = trial_dirs(base_dir)
  assert os.path.relpath(directory, base_dir) == f'{name}/1/dqn/seed_0'
  state = trial_lib.read_state(directory)
  assert state['status'] == 'done'
  assert state['config']['gin_bindings'][0].startswith(
    'FixedReplayRunner.num_iterations'
  )
  iterations, _ = plotting.load_eval_returns(directory)
  assert list(iterations) == [0]


@pytest.mark.slow
def test_rerunning_a_finished_sweep_returns_at_once(finished_sweep):
  base_dir, argv, _, _ = finished_sweep
  states = {d: trial_lib.read_state(d) for d in trial_dirs(base_dir)}
  began = time.monotonic()
  again = subprocess.run(
    argv, capture_output=True, text=True, timeout=120, check=False
  )
  seconds = time.monotonic() - began
  assert again.returncode == 0, again.stderr[-3000:]
  assert 'All 2 trials are done; nothing to run' in again.stderr
  assert '(2 were done before' in again.stdout
  assert 'Ray:' not in again.stderr  # Ray was never started.
  assert {d: trial_lib.read_state(d) for d in trial_dirs(base_dir)} == states
  assert seconds < 60, seconds  # Generous: a Python start, no training.


@pytest.mark.slow
def test_report_on_the_sweep(finished_sweep, tmp_path):
  base_dir, _, _, _ = finished_sweep
  prefix = str(tmp_path / 'report')
  result = subprocess.run(
    [
      sys.executable,
      '-m',
      'fixed_replay.cli',
      'report',
      base_dir,
      f'--output={prefix}',
    ],
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'ray' not in result.stderr.lower()
  with open(prefix + '.csv') as f:
    header, *rows = [line.split(',') for line in f.read().splitlines()]
  assert header[:4] == ['game', 'agent', 'trials', 'iterations']
  table = {(r[0], r[1]): dict(zip(header, r, strict=False)) for r in rows}
  for agent in ('dqn',):
    row = table['CartPole', agent]
    assert (row['trials'], row['iterations']) == ('2', '2')
    finals = [
      plotting.load_eval_returns(
        os.path.join(base_dir, 'CartPole/1', agent, f'seed_{s}')
      )[1][-1]
      for s in (0, 1)
    ]
    assert float(row['final_mean']) == pytest.approx(sum(finals) / 2)
    assert row['dqn_normalized_pct'] == row['human_normalized_pct'] == ''
    assert 'no reference scores for CartPole' in row['note']
    assert f'| CartPole | {agent} | 2 | 2 |' in result.stdout
  with open(f'{prefix}_CartPole.png', 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  assert os.path.exists(prefix + '.md')


# Its own private clusters and marked processes only, so it need not wait for
# the 'ray' group: alone, it can run beside it on the other worker.
@pytest.mark.xdist_group('sweep_killed')
@pytest.mark.slow
def test_killed_sweep_resumes_without_repeating_iterations(dataset, tmp_path):
  base_dir = str(tmp_path / 'sweep')
  iterations = 10
  # More and longer iterations than TINY's: Ray needs a few seconds to end
  # the trial of a killed driver, and it must not finish every iteration
  # meanwhile (on an idle machine 5 iterations of 400 steps did).
  argv = sweep_argv(
    base_dir,
    dataset,
    iterations,
    agents='dqn',
    seeds='0',
    bindings=['FixedReplayRunner.training_steps = 1000'],
  )
  mark = uuid.uuid4().hex
  driver = subprocess.Popen(
    argv,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
    env=marked_environment(mark),
  )
  try:
    # Kill the driver once a trial has checkpointed an iteration.
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and driver.poll() is None:
      done = [trial_lib.completed_iterations(d) for d in trial_dirs(base_dir)]
      if any(n >= 1 for n in done):
        break
      time.sleep(0.2)
    assert driver.poll() is None, 'the sweep ended before it could be killed'
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    # The trials' processes stop with the driver (Ray's two idle agents
    # may take longer; the teardown below ends them).
    trials_left = wait_until_gone(
      mark, GRACE_SECONDS, keep=lambda p: 'Agent' not in ' '.join(p.cmdline())
    )
    assert not trials_left, describe(trials_left)
  finally:
    if driver.poll() is None:
      driver.kill()
    end_marked_processes(mark)
  at_kill = {d: trial_lib.completed_iterations(d) for d in trial_dirs(base_dir)}
  assert any(0 < n < iterations for n in at_kill.values()), at_kill

  rerun = subprocess.run(
    argv,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
    env=marked_environment(mark),
  )
  left = wait_until_gone(mark, GRACE_SECONDS)
  end_marked_processes(mark)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert '1 trial: 1 done' in rerun.stdout
  assert not left, describe(left)
  for directory, completed in at_kill.items():
    state = trial_lib.read_state(directory)
    outcomes = [a['outcome'] for a in state['attempts']]
    assert outcomes == ['interrupted', 'done'], state
    # The rerun started where the killed attempt's last checkpoint was.
    assert state['attempts'][1]['start_iteration'] == completed
    started = started_iterations(directory)
    for iteration in range(completed):
      assert started.count(iteration) == 1, (directory, started)
    assert sorted(set(started)) == list(range(iterations))
    iterations_logged, _ = plotting.load_eval_returns(directory)
    assert list(iterations_logged) == list(range(iterations))
  with open(os.path.join(base_dir, 'CartPole/1/dqn/seed_0/trial.log')) as f:
    assert f.read().count('Trial CartPole/1/dqn/seed_0 on ') == 2
