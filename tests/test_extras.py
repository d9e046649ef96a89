"""The core runs without the extras; a feature that needs one names it.

Each command runs in a fresh process whose import system cannot find Ray
or tensorflow-datasets (a meta-path finder that refuses them, which is what
Python does when a package is not installed), so one virtualenv serves for
both the "extras absent" and the "extras present" cases.
"""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest
import test_quiet

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs `fixed-replay ARGS...` with the named top-level packages missing.
_WITHOUT = r"""
import sys

missing = set(sys.argv[1].split(','))


class Refuse:
  def find_spec(self, name, path=None, target=None):
    if name.split('.')[0] in missing:
      raise ModuleNotFoundError(f'No module named {name!r}', name=name)
    return None


sys.meta_path.insert(0, Refuse())
from fixed_replay import cli

sys.exit(cli.main(['fixed-replay'] + sys.argv[2:]))
"""

WITHOUT_EXTRAS = 'ray,tensorflow_datasets'
RAY_HINT = "pip install 'fixed_replay[ray]'"


def _run(arguments, missing=WITHOUT_EXTRAS, timeout=600, cwd=ROOT, path=ROOT):
  """`fixed-replay ARGUMENTS` without `missing`, importing from `path`."""
  environment = test_quiet._environment()
  environment['PYTHONPATH'] = str(path)
  return subprocess.run(
    [sys.executable, '-c', _WITHOUT, missing] + list(arguments),
    cwd=cwd,
    env=environment,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


@pytest.fixture(scope='module')
def installed(tmp_path_factory):
  """The wheel `pip wheel .` builds, and its files unpacked as pip would.

  Built from a copy of the sources (pip builds in the source tree).
  """
  tmp = tmp_path_factory.mktemp('wheel')
  source = tmp / 'source'
  source.mkdir()
  for name in ('pyproject.toml', 'README.md'):
    shutil.copy(os.path.join(ROOT, name), source)
  ignore = shutil.ignore_patterns('__pycache__')
  for name in ('fixed_replay', 'configs'):
    shutil.copytree(
      os.path.join(ROOT, name), source / name, symlinks=True, ignore=ignore
    )
  subprocess.run(
    [sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation']
    + ['-q', '-w', str(tmp / 'dist'), str(source)],
    capture_output=True,
    check=True,
    timeout=300,
  )
  (wheel,) = (tmp / 'dist').glob('fixed_replay-*.whl')
  site = tmp / 'site'
  with zipfile.ZipFile(wheel) as archive:
    archive.extractall(site)
  return wheel, site


def test_the_wheel_holds_the_configs(installed):
  wheel, _ = installed
  names = set(zipfile.ZipFile(wheel).namelist())
  configs = os.path.join(ROOT, 'configs')
  expected = {
    'fixed_replay/configs/' + os.path.relpath(os.path.join(d, n), configs)
    for d, _, files in os.walk(configs)
    for n in files
    if n.endswith('.gin')
  }
  assert 'fixed_replay/configs/dqn.gin' in expected
  assert 'fixed_replay/configs/cartpole/dqn.gin' in expected
  assert expected <= names, sorted(expected - names)


def _assert_names_the_extra(completed, hint):
  assert completed.returncode == 1, completed.stderr[-3000:]
  last = completed.stderr.strip().splitlines()[-1]
  assert hint in last, completed.stderr[-3000:]
  assert 'Traceback' not in completed.stderr, completed.stderr[-3000:]


def test_convert_and_inspect_run_without_the_extras(cartpole_dir, tmp_path):
  store = tmp_path / 'store'
  converted = _run(['convert', cartpole_dir, str(store), '--workers=0'])
  assert converted.returncode == 0, converted.stderr[-3000:]
  inspected = _run(['inspect', str(store)])
  assert inspected.returncode == 0, inspected.stderr[-3000:]
  assert 'checkpoint' in inspected.stdout.lower() or inspected.stdout.strip()


def test_train_runs_without_the_extras(cartpole_dir, tmp_path, installed):
  """Installed from the wheel, run outside the repository: the documented
  `--gin_files=configs/...` is read from the configs installed with it."""
  _, site = installed
  bindings = (
    'FixedReplayRunner.num_iterations = 1',
    'FixedReplayRunner.training_steps = 50',
    'FixedReplayRunner.evaluation_steps = 50',
    'FixedReplayBuffer.num_buffers_to_load = 1',
    'FixedReplayBuffer.batch_size = 32',
  )
  completed = _run(
    [
      'train',
      f'--base_dir={tmp_path / "run"}',
      f'--replay_dir={cartpole_dir}',
      '--gin_files=configs/cartpole/dqn.gin',
    ]
    + [f'--gin_bindings={binding}' for binding in bindings],
    cwd=tmp_path,
    path=site,
  )
  assert completed.returncode == 0, completed.stderr[-3000:]
  assert (tmp_path / 'run' / 'checkpoints').is_dir()
  packaged = site / 'fixed_replay' / 'configs' / 'cartpole' / 'dqn.gin'
  assert (
    f'gin file configs/cartpole/dqn.gin is not in the working directory '
    f'({tmp_path}): reading the copy installed with fixed_replay, {packaged}'
  ) in completed.stderr, completed.stderr[-3000:]
  # Quiet by default (test_quiet.py): train's own lines only.
  for marker in test_quiet.TRAIN_NOISE:
    assert marker not in completed.stderr, (marker, completed.stderr[-3000:])


def test_ray_features_name_the_ray_extra(cartpole_dir, tmp_path):
  converted = _run(['convert', cartpole_dir, str(tmp_path / 'out'), '--ray'])
  _assert_names_the_extra(converted, RAY_HINT)
  assert not (tmp_path / 'out').exists() or not os.listdir(tmp_path / 'out')
  swept = _run(
    [
      'sweep',
      f'--base_dir={tmp_path / "sweep"}',
      f'--replay_dir={cartpole_dir}',
      '--games=CartPole',
      '--gin_files=' + os.path.join(ROOT, 'configs', 'cartpole', '{agent}.gin'),
    ]
  )
  _assert_names_the_extra(swept, RAY_HINT)


def test_tfds_source_names_the_tfds_extra(tmp_path):
  code = _WITHOUT.replace(
    "from fixed_replay import cli\n\nsys.exit(cli.main(['fixed-replay'] + "
    'sys.argv[2:]))',
    'from fixed_replay.sources.rlu import rlu_tfds\n'
    'rlu_tfds._builder(sys.argv[2])',
  )
  completed = subprocess.run(
    [sys.executable, '-c', code, WITHOUT_EXTRAS, str(tmp_path)],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert completed.returncode == 1
  assert 'MissingExtraError' in completed.stderr, completed.stderr[-3000:]
  assert "pip install 'fixed_replay[tfds]'" in completed.stderr
