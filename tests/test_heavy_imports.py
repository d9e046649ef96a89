"""heavy_imports: the collector paused during heavy imports, then frozen.

The finder is exercised on a package of the test's own (named heavy for the
test), whose modules record the collector's state while they run; the
entry points' processes on the real ones.
"""

import gc
import importlib
import sys

import pytest
from test_imports import fresh_python

from fixed_replay import distributed
from fixed_replay import heavy_imports

_RECORD = (
  'import gc, {probe}\n{probe}.seen.append((__name__, gc.isenabled()))\n'
)


@pytest.fixture
def heavy_package(tmp_path, monkeypatch):
  """A package `heavy_probe_pkg` (with a submodule) counted as heavy.

  Its modules append (module name, gc.isenabled()) to heavy_probe.seen as
  they run; its submodule `broken` raises while it is imported.
  """
  name = 'heavy_probe_pkg'
  probe = tmp_path / 'heavy_probe.py'
  probe.write_text('seen = []\n')
  package = tmp_path / name
  package.mkdir()
  record = _RECORD.format(probe='heavy_probe')
  (package / '__init__.py').write_text(record + f'from {name} import inner\n')
  (package / 'inner.py').write_text(record)
  (package / 'later.py').write_text(record)
  (package / 'broken.py').write_text(record + "raise RuntimeError('broken')\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setattr(
    heavy_imports, 'HEAVY_PACKAGES', heavy_imports.HEAVY_PACKAGES | {name}
  )
  heavy_imports.install()
  yield name, importlib.import_module('heavy_probe')
  for module in [m for m in sys.modules if m.split('.')[0] == name]:
    del sys.modules[module]
  del sys.modules['heavy_probe']


def test_a_heavy_import_runs_paused_and_leaves_its_objects_frozen(
  heavy_package,
):
  name, probe = heavy_package
  assert gc.isenabled()
  frozen = gc.get_freeze_count()
  module = importlib.import_module(name)
  # The package and the submodule it imports ran with the collector off.
  assert probe.seen == [(name, False), (f'{name}.inner', False)]
  assert gc.isenabled()
  assert gc.get_freeze_count() > frozen
  # Each module keeps its own loader, not the pausing one.
  for each in (module, module.inner):
    assert type(each.__loader__).__name__ == 'SourceFileLoader'
    assert each.__spec__.loader is each.__loader__
  # A submodule imported later is paused too.
  importlib.import_module(f'{name}.later')
  assert probe.seen[-1] == (f'{name}.later', False)
  assert gc.isenabled()


def test_a_failing_import_still_turns_the_collector_back_on(heavy_package):
  name, probe = heavy_package
  with pytest.raises(RuntimeError, match='broken'):
    importlib.import_module(f'{name}.broken')
  assert probe.seen[-1] == (f'{name}.broken', False)
  assert gc.isenabled()
  assert heavy_imports._depth == 0


def test_a_collector_turned_off_by_the_program_stays_off(heavy_package):
  name, probe = heavy_package
  gc.disable()
  try:
    importlib.import_module(name)
    assert not gc.isenabled()
  finally:
    gc.enable()
  assert probe.seen == [(name, False), (f'{name}.inner', False)]


def test_other_imports_are_not_paused(heavy_package, tmp_path):
  _, probe = heavy_package
  (tmp_path / 'light_probe_mod.py').write_text(
    _RECORD.format(probe='heavy_probe')
  )
  try:
    importlib.import_module('light_probe_mod')
  finally:
    sys.modules.pop('light_probe_mod', None)
  assert probe.seen == [('light_probe_mod', True)]


def test_commands_pause_the_real_imports_and_the_library_does_not():
  # Both in one fresh process: first as a library (import fixed_replay),
  # then as the command-line entry point sets its process up.
  result = fresh_python(
    """
    import gc, sys
    import fixed_replay
    from fixed_replay import cli, heavy_imports
    print(heavy_imports._FINDER in sys.meta_path)
    cli.set_up_process(verbose=False)
    import tensorflow
    print(gc.get_freeze_count(), gc.isenabled())
    print(type(tensorflow.__loader__).__name__)
    """
  )
  assert result.returncode == 0, result.stderr[-3000:]
  installed_by_library, frozen, enabled, tf_loader = result.stdout.split()
  assert installed_by_library == 'False'
  # TensorFlow's import leaves hundreds of thousands of objects.
  assert int(frozen) > 100_000 and enabled == 'True'
  assert tf_loader == 'SourceFileLoader'


@pytest.mark.xdist_group('ray')
def test_ray_workers_running_our_tasks_pause_them(local_ray):
  def _installed():  # Defined here: Ray ships it by value.
    return heavy_imports._FINDER in sys.meta_path

  outcome = distributed.run_tasks(
    [distributed.Task('installed', _installed)], poll_seconds=0.5
  )
  assert outcome.results == {'installed': True}
