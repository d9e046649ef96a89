"""MkDocs hook: writes the command-line reference from the flag definitions.

The page reference/cli.md holds a marker; at build time this hook replaces
it with every `fixed-replay` command's help text and flags, read from the
absl flags each subcommand module defines. The page is therefore generated
from the code each time the site is built and cannot drift from it.

Each subcommand is read in a process of its own, because subcommands may
define flags of the same name (absl refuses a second definition in one
process).
"""

import concurrent.futures
import html
import json
import os
import subprocess
import sys

MARKER = '<!-- cli-flags -->'
PAGE = 'reference/cli.md'

# Runs in a fresh interpreter: prints the subcommand's docstring and flags.
_READ_FLAGS = r"""
import importlib, json, sys
from absl import flags
module = importlib.import_module('fixed_replay.cli.' + sys.argv[1])
rows = []
for flag in flags.FLAGS.get_flags_for_module(module.__name__):
  parser = flag.parser
  rows.append({
    'name': flag.name,
    'type': flag.flag_type(),
    'default': None if flag.default is None else repr(flag.default),
    'help': flag.help,
    'enum': list(getattr(parser, 'enum_values', None) or []),
  })
print(json.dumps({'doc': module.__doc__ or '', 'flags': rows}))
"""


def _subcommands():
  from fixed_replay import cli

  return cli.SUBCOMMANDS


def read_command(name):
  """The docstring and flag definitions of `fixed-replay NAME`."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  result = subprocess.run(
    [sys.executable, '-c', _READ_FLAGS, name],
    capture_output=True,
    text=True,
    env=env,
    check=False,
  )
  if result.returncode != 0:
    raise RuntimeError(
      f'reading the flags of fixed-replay {name} failed:\n{result.stderr}'
    )
  return json.loads(result.stdout.strip().splitlines()[-1])


def _cell(text):
  text = html.escape(' '.join(str(text).split()), quote=False)
  return text.replace('|', '\\|')


def render(commands):
  """Markdown for {name: (summary, read_command(name))}."""
  out = []
  for name, (summary, info) in commands.items():
    out += [f'## `fixed-replay {name}`', '', _cell(summary), '']
    doc = info['doc'].strip('\n')
    if doc:
      out += ['```text', doc.rstrip(), '```', '']
    out += ['| flag | type | default | meaning |', '|---|---|---|---|']
    for flag in sorted(info['flags'], key=lambda f: f['name']):
      meaning = flag['help']
      if flag['enum']:
        meaning += ' One of: ' + ', '.join(flag['enum']) + '.'
      default = flag['default'] or ''
      out.append(
        f'| `--{flag["name"]}` | {flag["type"]} | '
        f'{"`" + _cell(default) + "`" if default else ""} | {_cell(meaning)} |'
      )
    out.append('')
  return '\n'.join(out)


def generate():
  """The generated part of the page, for every subcommand."""
  names = list(_subcommands().items())
  with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
    infos = list(pool.map(read_command, [name for name, _ in names]))
  return render(
    {
      name: (summary, info)
      for (name, summary), info in zip(names, infos, strict=True)
    }
  )


def on_page_markdown(markdown, page, config, files):
  """MkDocs event: fills the marker of the CLI reference page."""
  del config, files
  if page.file.src_uri != PAGE:
    return markdown
  if MARKER not in markdown:
    raise RuntimeError(f'{PAGE} lost its marker {MARKER}')
  return markdown.replace(MARKER, generate())
