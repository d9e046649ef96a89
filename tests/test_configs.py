"""Every config in configs/ parses from any directory and binds what it did.

The `*_1pct.gin` / `*_10pct.gin` configs `include` their base config. gin
looks for an include on its search path (the current directory first); the
library's one gin loader (`fixed_replay.gin_files`) looks next to the
including file first. These tests parse each config from another directory,
one that holds decoy files named like the base configs, and compare the
effective bindings with those of the same config before the includes, as
git holds it.
"""

import os
import subprocess
import sys

import gin
import pytest

import fixed_replay  # noqa: F401  (module aliases, compat)
from fixed_replay import gin_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, 'configs')
# The last commit whose configs held every binding themselves.
BEFORE_INCLUDES = '9717249a2d6749d644618d5a5b6d8096bc360a15'
CONFIG_NAMES = sorted(
  os.path.relpath(os.path.join(directory, name), CONFIGS)
  for directory, _, names in os.walk(CONFIGS)
  for name in names
  if name.endswith('.gin')
)
INCLUDING = [name for name in CONFIG_NAMES if name.endswith('pct.gin')]


def _bindings(path):
  """All bindings after parsing path with the library's loader."""
  gin.clear_config()
  gin_files.load_gin_configs([path], [], finalize_config=False)
  bindings = gin.config_str()
  gin.clear_config()
  return bindings


def _config_before_includes(name):
  """The text of configs/<name> at BEFORE_INCLUDES, or None without git."""
  try:
    result = subprocess.run(
      ['git', '-C', ROOT, 'show', f'{BEFORE_INCLUDES}:configs/{name}'],
      capture_output=True,
      text=True,
      timeout=60,
    )
  except OSError:
    return None
  return result.stdout if result.returncode == 0 else None


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
  """A current directory with decoy base configs that must not be read."""
  for name in CONFIG_NAMES:
    if '/' not in name and not name.endswith('pct.gin'):
      (tmp_path / name).write_text('FixedReplayBuffer.batch_size = 1\n')
  monkeypatch.chdir(tmp_path)
  return tmp_path


def test_the_variants_include_their_base():
  assert len(INCLUDING) == 22
  for name in INCLUDING:
    base = name.replace('_10pct', '').replace('_1pct', '')
    with open(os.path.join(CONFIGS, name)) as f:
      assert f"include '{base}'\n" in f.read(), name


@pytest.mark.parametrize('name', CONFIG_NAMES)
def test_config_binds_what_it_bound_before_includes(elsewhere, name):
  before = _config_before_includes(name)
  if before is None:
    pytest.skip(f'no git history with configs/{name} at {BEFORE_INCLUDES}')
  old_path = elsewhere / 'before.gin'
  old_path.write_text(before)
  expected = _bindings(str(old_path))
  # Relative to the current directory, and absolute.
  path = os.path.join(CONFIGS, name)
  assert _bindings(os.path.relpath(path)) == expected
  assert _bindings(path) == expected


def test_include_next_to_the_file_wins_over_the_current_directory(elsewhere):
  assert (elsewhere / 'dqn.gin').exists()  # The decoy.
  gin.clear_config()
  gin_files.load_gin_configs(
    [os.path.join(CONFIGS, 'dqn_1pct.gin')],
    ['FixedReplayBuffer.seed = 3'],
    finalize_config=False,
  )
  try:
    assert gin.query_parameter('FixedReplayBuffer.batch_size') == 32
    assert gin.query_parameter('FixedReplayBuffer.num_buffers_to_load') == 50
    assert gin.query_parameter('FixedReplayBuffer.seed') == 3  # Bindings.
  finally:
    gin.clear_config()
  # The search path is as gin had it.
  assert os.path.dirname(CONFIGS) not in gin.config._LOCATION_PREFIXES
  assert CONFIGS not in gin.config._LOCATION_PREFIXES


def test_missing_include_names_the_file(tmp_path):
  config = tmp_path / 'variant.gin'
  config.write_text("include 'no_such_base.gin'\n")
  with pytest.raises(IOError, match='no_such_base.gin'):
    gin_files.load_gin_configs([str(config)], [], finalize_config=False)
  assert str(tmp_path) not in gin.config._LOCATION_PREFIXES


def test_train_command_finds_the_include_from_another_directory(elsewhere):
  # A fresh process, as a user runs it, with --gin_files relative to a
  # directory that holds a decoy dqn.gin. The run stops at the missing
  # dataset, which is checked after the gin files are parsed.
  config = os.path.relpath(os.path.join(CONFIGS, 'dqn_1pct.gin'))
  missing = elsewhere / 'no_data'
  env = dict(os.environ, PYTHONPATH=ROOT)
  result = subprocess.run(
    [
      sys.executable,
      '-m',
      'fixed_replay.cli',
      'train',
      f'--base_dir={elsewhere / "run"}',
      f'--replay_dir={missing}',
      f'--gin_files={config}',
    ],
    cwd=elsewhere,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert result.returncode != 0
  assert (
    f'fixed-replay train: {missing}: no such directory' in result.stderr
  ), result.stderr[-3000:]
  assert 'Unable to open file' not in result.stderr


def test_config_digest_changes_with_an_included_base(tmp_path):
  # A sweep records this digest per trial and refuses to resume a trial whose
  # configs changed: editing the base a *_1pct.gin includes is such a change.
  (tmp_path / 'base.gin').write_text('DQNAgent.gamma = 0.99\n')
  pct = tmp_path / 'base_1pct.gin'
  pct.write_text(
    "include 'base.gin'\nFixedReplayBuffer.num_buffers_to_load = 50\n"
  )
  before = gin_files.config_digest(pct)
  assert gin_files.config_digest(pct) == before
  (tmp_path / 'base.gin').write_text('DQNAgent.gamma = 0.9\n')
  assert gin_files.config_digest(pct) != before


def test_relative_configs_path_falls_back_to_the_installed_copy(
  tmp_path, monkeypatch
):
  monkeypatch.chdir(tmp_path)  # No configs/ here.
  located = gin_files.locate('configs/dqn_1pct.gin')
  assert located == os.path.join(gin_files.PACKAGED_CONFIGS, 'dqn_1pct.gin')
  with open(located) as f, open(os.path.join(CONFIGS, 'dqn_1pct.gin')) as g:
    assert f.read() == g.read()
  # The installed copy parses, with its include, as the repository's does.
  assert _bindings('configs/dqn_1pct.gin') == _bindings(
    os.path.join(CONFIGS, 'dqn_1pct.gin')
  )
  # A file in the working directory wins over the installed copy.
  (tmp_path / 'configs').mkdir()
  (tmp_path / 'configs' / 'dqn.gin').write_text('DQNAgent.gamma = 0.5\n')
  assert gin_files.locate('configs/dqn.gin') == 'configs/dqn.gin'
  # Other paths are read as given: batch_rl's layout is not redirected.
  with pytest.raises(gin_files.UsageError, match='not found') as error:
    gin_files.locate('batch_rl/fixed_replay/configs/dqn.gin')
  assert 'installed with fixed_replay' not in str(error.value)
  with pytest.raises(gin_files.UsageError, match='installed with'):
    gin_files.locate('configs/nope.gin')
