"""MkDocs hook: documents each top-level name where it is defined.

Users import the buffers from the top (`from fixed_replay import
FixedReplayBuffer`), and the package decides which module defines each.
The reference pages therefore name them as `::: fixed_replay.NAME`; this
hook rewrites each such line to the defining module's path, which
mkdocstrings needs, so that moving a class between modules never breaks
the reference.

The names are resolved in a fresh interpreter: importing the buffers
imports TensorFlow, whose start-up messages must not reach the build's log.
"""

import json
import os
import re
import subprocess
import sys

_TOP_LEVEL = re.compile(r'^::: fixed_replay\.(\w+)\s*$', re.M)

_RESOLVE = r"""
import json, sys
import fixed_replay
paths = {}
for name in sys.argv[1:]:
  value = getattr(fixed_replay, name)
  paths[name] = value.__module__ + '.' + value.__qualname__
print(json.dumps(paths))
"""


def resolve(names):
  """{name: 'module.path.Name'} for top-level names of fixed_replay."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  result = subprocess.run(
    [sys.executable, '-c', _RESOLVE, *names],
    capture_output=True,
    text=True,
    env=env,
    check=False,
  )
  if result.returncode != 0:
    raise RuntimeError(f'resolving {names} failed:\n{result.stderr}')
  return json.loads(result.stdout.strip().splitlines()[-1])


def on_page_markdown(markdown, page, config, files):
  """MkDocs event: `::: fixed_replay.NAME` -> `::: module.NAME`."""
  del page, config, files
  names = sorted(set(_TOP_LEVEL.findall(markdown)))
  if not names:
    return markdown
  paths = resolve(names)
  return _TOP_LEVEL.sub(lambda m: f'::: {paths[m.group(1)]}', markdown)
