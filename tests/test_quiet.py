"""Commands print their own lines only; --verbose or FIXED_REPLAY_VERBOSE=1
shows all."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What TensorFlow, XLA, absl, Gym and Dopamine print on the way (from C++,
# print() and Python logging and warnings alike).
NOISE = (
  'Unable to register cu',
  'absl::InitializeLog',
  'Gym has been unmaintained',
  'DeprecationWarning',
  'Creating a _ReportingReplayBuffer',
)
# Also printed by train.
TRAIN_NOISE = NOISE + (
  'already exists in the registry',
  'with the following parameters',
  'Instructions for updating',
)


def _environment(**extra):
  environment = dict(os.environ, PYTHONPATH=ROOT, **extra)
  for name in ('TF_CPP_MIN_LOG_LEVEL', 'FIXED_REPLAY_VERBOSE'):
    environment.pop(name, None)
  environment.update(extra)
  return environment


def _generate(directory, *before, **extra):
  return subprocess.run(
    [
      sys.executable,
      '-m',
      'fixed_replay.cli',
      *before,
      'generate',
      '--environment=cartpole',
      f'--output_dir={directory}',
      '--num_checkpoints=1',
      '--checkpoint_rows=100',
      '--policy=random',
      '--noprogress',
    ],
    cwd=ROOT,
    env=_environment(**extra),
    capture_output=True,
    text=True,
    timeout=600,
  )


def test_generate_prints_no_third_party_noise(tmp_path):
  quiet = _generate(tmp_path / 'quiet')
  assert quiet.returncode == 0, quiet.stderr[-3000:]
  for marker in NOISE:
    assert marker not in quiet.stderr, (marker, quiet.stderr[-3000:])
  # The command's own progress and result are still there.
  assert 'Wrote 1 checkpoint ' in quiet.stderr, quiet.stderr[-3000:]
  assert '"episodes"' in quiet.stdout
  loud = _generate(tmp_path / 'loud', FIXED_REPLAY_VERBOSE='1')
  assert loud.returncode == 0, loud.stderr[-3000:]
  assert 'Creating a _ReportingReplayBuffer' in loud.stderr
  assert 'Gym has been unmaintained' in loud.stderr
  assert len(loud.stderr.splitlines()) > len(quiet.stderr.splitlines()) + 10
  # The flag does what the variable does.
  flagged = _generate(tmp_path / 'flagged', '--verbose')
  assert flagged.returncode == 0, flagged.stderr[-3000:]
  assert 'Creating a _ReportingReplayBuffer' in flagged.stderr
  assert 'Gym has been unmaintained' in flagged.stderr
  assert 'Wrote 1 checkpoint ' in flagged.stderr


def test_verbose_flag_goes_before_or_after_the_command():
  from fixed_replay import cli

  for argv in (
    ['fixed-replay', '--verbose', 'inspect', 'DIR'],
    ['fixed-replay', 'inspect', 'DIR', '--verbose'],
  ):
    assert cli._take_verbose_flag(argv) == (
      ['fixed-replay', 'inspect', 'DIR'],
      True,
    )
  assert cli._take_verbose_flag(['fixed-replay', 'inspect', 'DIR']) == (
    ['fixed-replay', 'inspect', 'DIR'],
    False,
  )
  # After `--` it is an argument, not the flag.
  assert cli._take_verbose_flag(['fixed-replay', 'x', '--', '--verbose']) == (
    ['fixed-replay', 'x', '--', '--verbose'],
    False,
  )


def test_import_prints_nothing():
  completed = subprocess.run(
    [sys.executable, '-c', 'import fixed_replay'],
    cwd=ROOT,
    env=_environment(),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert completed.returncode == 0
  assert completed.stdout == '' and completed.stderr == ''


def _train_module(*arguments):
  return subprocess.run(
    [sys.executable, '-m', 'fixed_replay.train', *arguments],
    cwd=ROOT,
    env=_environment(),
    capture_output=True,
    text=True,
    timeout=300,
  )


def test_train_module_takes_the_verbose_flag(tmp_path):
  """`python -m fixed_replay.train` takes --verbose as `fixed-replay train`
  does, before or after the other flags (what it lets through:
  test_dropin.py's test_train_module_shows_third_party_output_...)."""
  missing = tmp_path / 'missing'
  flags = [f'--replay_dir={missing}', f'--base_dir={tmp_path / "run"}']
  for arguments in (['--verbose', *flags], [*flags, '--verbose']):
    completed = _train_module(*arguments)
    # Refused for the missing data (before TensorFlow loads), not the flag.
    assert completed.returncode == 1, completed.stderr[-3000:]
    assert completed.stderr.strip() == (
      f'fixed-replay train: {missing}: no such directory'
    )
  assert '--[no]verbose' in _train_module('--help').stdout
