"""MkDocs hook: documents each top-level name where it is defined.

Users import the buffers from the top (`from fixed_replay import
FixedReplayBuffer`), and the package decides which module defines each.
The reference pages therefore name them as `::: fixed_replay.NAME`; this
hook rewrites each such line to the defining module's path, which
mkdocstrings needs, so that moving a class between modules never breaks
the reference.

The paths come from the package's own table of its top-level names, read
without importing the modules it names (one of them imports TensorFlow:
seconds of start-up, and its messages in the build's log).
"""

import re

import fixed_replay

_TOP_LEVEL = re.compile(r'^::: fixed_replay\.(\w+)\s*$', re.M)


def on_page_markdown(markdown, page, config, files):
  """MkDocs event: `::: fixed_replay.NAME` -> `::: module.NAME`."""
  del page, config, files
  modules = fixed_replay._PUBLIC  # noqa: SLF001 - the table __getattr__ reads.
  return _TOP_LEVEL.sub(
    lambda m: f'::: {modules[m.group(1)]}.{m.group(1)}', markdown
  )
