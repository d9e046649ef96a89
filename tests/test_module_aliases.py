"""Old module paths import as the same module objects as today's paths."""

import subprocess
import sys

from fixed_replay import module_aliases


def test_every_old_path_is_the_new_module_in_a_fresh_process():
  # A fresh process: nothing imported yet, exactly as a gin file's `import`
  # line or a user's script meets the old path.
  script = (
    'import importlib, sys\n'
    'import fixed_replay\n'
    'from fixed_replay import module_aliases\n'
    'for old, new in module_aliases.ALIASES.items():\n'
    '  module = importlib.import_module(old)\n'
    '  assert module is importlib.import_module(new), old\n'
    '  assert sys.modules[old] is sys.modules[new], old\n'
    'print(len(module_aliases.ALIASES))\n'
  )
  result = subprocess.run(
    [sys.executable, '-c', script], capture_output=True, text=True, timeout=300
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert int(result.stdout.split()[-1]) == len(module_aliases.ALIASES)


def test_unknown_names_are_not_aliased():
  assert (
    module_aliases.AliasFinder({}).find_spec('fixed_replay.nothing') is None
  )


def test_only_batch_rl_and_dopamine_paths_are_aliased():
  # The package's own paths before its split into folders were never
  # released: no gin file imports them, so they are not kept alive.
  # One exception: CompactReplayBuffer's module, which configs import,
  # is FixedReplayBuffer's now.
  own = {
    old
    for old in module_aliases.ALIASES
    if not old.startswith(('batch_rl.', 'dopamine.'))
  }
  assert own == {'fixed_replay.replay.compact_replay_buffer'}
  finder = module_aliases.AliasFinder(module_aliases.ALIASES)
  assert finder.find_spec('fixed_replay.fixed_replay_buffer') is None
