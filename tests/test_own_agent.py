"""Agent modules may use fixed_replay's names late (a fresh process).

The docs' "Your own agent" recipes themselves run as the guide prints them,
in tests/test_docs.py (test_own_agent_recipe_*, on the guide's own runs).
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_top_level_names_import_after_the_config_is_locked(tmp_path):
  """A recipe whose gin file imports none of ours: first use comes late."""
  code = (
    'import fixed_replay, gin\n'
    "gin.parse_config('')\n"
    'gin.finalize()\n'
    'assert gin.config_is_locked()\n'
    'for name in fixed_replay.__all__:\n'
    '  getattr(fixed_replay, name)\n'
    'assert gin.config_is_locked()\n'
    "print('ok')\n"
  )
  result = subprocess.run(
    [sys.executable, '-c', code],
    cwd=tmp_path,
    env=dict(os.environ, PYTHONPATH=ROOT),
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip() == 'ok'
