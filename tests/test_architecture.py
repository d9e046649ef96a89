"""The package's layers, as pyproject.toml's import-linter contracts state them.

docs/architecture.md draws the data path (sources -> store -> replay or
convert -> front doors and commands) and the replay path's parts (buffer,
rotation, storage, sampler, assembler); these contracts are that drawing
enforced: an import that runs back up the stack, an arrow between the two
sources or between sampler and assembler, or a circle among the modules of
a folder (a type-only one included) fails the suite. Each check runs
`lint-imports` in a fresh process over a tree: the repository's own, then
copies with one wrong import added, which must each break the contract they
cross.
"""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINT_IMPORTS = os.path.join(os.path.dirname(sys.executable), 'lint-imports')
LAYERS = 'The data path: each room imports only from the rooms below it'
SOURCES = 'Sources: what a path holds, above two sources that never meet'
CIRCLES = 'No circle among the modules of any one folder'
REPLAY = 'Replay: buffer over rotation over storage; sampler, assembler apart'


def _lint_imports(tree):
  """lint-imports over the fixed_replay package and pyproject.toml in tree."""
  env = dict(os.environ, PYTHONPATH=str(tree))
  return subprocess.run(
    [LINT_IMPORTS, '--config', 'pyproject.toml', '--no-cache'],
    cwd=tree,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )


def test_the_package_keeps_every_contract():
  result = _lint_imports(ROOT)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr
  for contract in (LAYERS, SOURCES, CIRCLES, REPLAY):
    assert f'{contract} KEPT' in result.stdout, contract


@pytest.mark.parametrize(
  'module, wrong_import, broken',
  [
    # The bytes layer reaching up to the samplers.
    ('io/files.py', 'from fixed_replay.replay import core', LAYERS),
    # A source's reader using the compact store above it.
    (
      'sources/dopamine/validity.py',
      'from fixed_replay.store import manifest',
      LAYERS,
    ),
    # Dopamine's files and RL Unplugged's shards knowing each other.
    (
      'sources/dopamine/checks.py',
      'from fixed_replay.sources.rlu import rlu_shards',
      SOURCES,
    ),
    # The sampler knowing how a batch is assembled.
    (
      'replay/samplers.py',
      'from fixed_replay.replay import transitions',
      REPLAY,
    ),
    # Storage reaching up to the sampling API (as it once did for the
    # buffer's arguments).
    (
      'replay/compact_windows.py',
      'from fixed_replay.replay import core',
      REPLAY,
    ),
    # The circle this layout removed, even for annotations only.
    (
      'sources/dopamine/checks.py',
      'from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n'
      '  from fixed_replay.sources.dopamine import checkpoints',
      CIRCLES,
    ),
  ],
)
def test_a_wrong_import_breaks_its_contract(
  tmp_path, module, wrong_import, broken
):
  shutil.copy(os.path.join(ROOT, 'pyproject.toml'), tmp_path)
  shutil.copytree(
    os.path.join(ROOT, 'fixed_replay'),
    tmp_path / 'fixed_replay',
    ignore=shutil.ignore_patterns('__pycache__', 'configs'),
  )
  with open(tmp_path / 'fixed_replay' / module, 'a') as f:
    f.write(f'\n{wrong_import}  # noqa\n')
  result = _lint_imports(tmp_path)
  assert result.returncode == 1, result.stdout[-3000:] + result.stderr
  assert f'{broken} BROKEN' in result.stdout, result.stdout[-3000:]
