"""The `fixed-replay` console script: dispatches to one subcommand.

Each subcommand is a module of this package that defines its own
absl flags and a `main(argv)`; only the chosen one is imported, so flags of
different subcommands never meet and `--help` shows just the relevant ones.
`--verbose`, before or after the command, is the dispatcher's own flag:
third-party output must be let through (or not) before the subcommand
imports TensorFlow, that is before absl parses the subcommand's flags.
"""

import functools
import importlib
import re
import sys
import traceback

from absl import app
from absl import flags
from absl import logging

from fixed_replay.errors import CheckpointError
from fixed_replay.errors import UsageError

# A line gin adds to an exception raised inside a configurable.
_GIN_CALL = re.compile(r'^\s+In call to configurable ')

SUBCOMMANDS = {
  'generate': 'Writes a dataset in the DQN Replay Dataset layout by playing '
  'a real game.',
  'inspect': 'Summarises (and with --verify checks) replay checkpoints, a '
  'compact store or RL Unplugged shards.',
  'convert': 'Converts a run (Dopamine checkpoints, RL Unplugged shards or '
  'TFDS) into a compact store or Dopamine files.',
  'download': "Downloads a run of RL Unplugged's DQN Replay Dataset (and "
  'converts it as it arrives).',
  'train': 'Trains an offline agent on a replay dataset, evaluating it in '
  'the game.',
  'plot': 'Plots evaluation return per iteration of training runs (PNG).',
  'sweep': 'Trains games x runs x agents x seeds trials on Ray (local or a '
  'cluster), resumable.',
  'report': 'Tables (CSV, Markdown) and learning curves of sweeps, with '
  'normalized scores.',
}


def define_remote_timeout_flag(module_name):
  """Defines --remote_timeout_s for the subcommand module `module_name`."""
  return flags.DEFINE_float(
    'remote_timeout_s',
    None,
    'Longest wait, in seconds, for one call to remote storage (gs://) '
    'before failing with its cause (default 30, or the environment '
    'variable FIXED_REPLAY_REMOTE_TIMEOUT_S).',
    lower_bound=0.001,
    module_name=module_name,  # Listed by the subcommand's --help.
  )


def apply_remote_timeout(flag):
  """Applies a --remote_timeout_s flag's value, if set."""
  if flag.value is not None:
    from fixed_replay.io import remote

    remote.set_timeout(flag.value)


def require_flags(*required):
  """Refuses to run a command whose flags in `required` have no value.

  Checked when the command runs, not when its module is imported: absl
  checks a flag marked required at every parse of a command line, so a
  program that imports the module and sets the flags in code (batch_rl's
  runner test under tf.test.main, a notebook, a launcher) would be refused
  before it could set them.

  Args:
    *required: absl FlagHolders.

  Raises:
    UsageError: naming the missing flags (one line at the command line).
  """
  missing = [f'--{flag.name}' for flag in required if flag.value is None]
  if missing:
    raise UsageError(f'{" and ".join(missing)} must be given')


def take_flags_only(argv):
  """Starts a subcommand that takes flags only: INFO logs, no positionals.

  Raises:
    app.UsageError: naming the positional arguments given.
  """
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  logging.set_verbosity(logging.INFO)


VERBOSE_FLAG = '--verbose'
_VERBOSE_HELP = (
  'Shows third-party output too (TensorFlow, JAX, absl, Gym and Dopamine '
  'logs and warnings), which is filtered out by default; the same as '
  'FIXED_REPLAY_VERBOSE=1. May come before or after the command.'
)


def _take_verbose_flag(argv):
  """argv without --verbose (before any `--`), and whether it was there."""
  end = argv.index('--') if '--' in argv else len(argv)
  kept = [a for a in argv[:end] if a != VERBOSE_FLAG] + argv[end:]
  return kept, len(kept) != len(argv)


def set_up_process(verbose):
  """Sets up a command's process before anything imports TensorFlow.

  Filters third-party output from here on, unless `verbose` (which also
  reaches the processes this one starts: FIXED_REPLAY_VERBOSE), and pauses
  the cyclic collector during the heavy imports (heavy_imports.py).
  """
  from fixed_replay import heavy_imports
  from fixed_replay import quiet

  if verbose:
    quiet.set_verbose()
  quiet.install()
  heavy_imports.install()


def define_verbose_flag(verbose, module_name):
  """Defines --verbose, taken out of argv already, so that --help lists it.

  Args:
    verbose: whether argv held it (the flag's value for the command).
    module_name: the module whose --help lists it (the command's).
  """
  if VERBOSE_FLAG[2:] not in flags.FLAGS:
    flags.DEFINE_boolean(
      VERBOSE_FLAG[2:], verbose, _VERBOSE_HELP, module_name=module_name
    )


def run_module(command, command_main, module_name, argv=None):
  """`python -m MODULE ...` run the way `fixed-replay COMMAND ...` runs.

  The module form of a command takes --verbose (anywhere before `--`) and
  starts as quietly as the console script does.

  Args:
    command: the command's name, for error messages.
    command_main: its main(argv).
    module_name: the module run as __main__ (whose --help lists the flag),
      as absl names it: sys.argv[0].
    argv: the command line (default sys.argv).
  """
  argv, verbose = _take_verbose_flag(list(sys.argv if argv is None else argv))
  set_up_process(verbose)
  define_verbose_flag(verbose, module_name)
  app.run(functools.partial(run_command, command, command_main), argv=argv)


def _usage():
  lines = ['usage: fixed-replay [--verbose] COMMAND [--flags]', '', 'commands:']
  lines += [f'  {name:<10} {text}' for name, text in SUBCOMMANDS.items()]
  lines += [
    '',
    'fixed-replay COMMAND --help lists the flags of a command.',
    f'{VERBOSE_FLAG}: {_VERBOSE_HELP}',
  ]
  return '\n'.join(lines)


def main(argv=None):
  """Runs `fixed-replay COMMAND ...`."""
  argv, verbose = _take_verbose_flag(list(sys.argv if argv is None else argv))
  if len(argv) < 2 or argv[1] in ('-h', '--help', 'help'):
    print(_usage())
    return 0 if len(argv) >= 2 else 2
  command = argv[1]
  if command not in SUBCOMMANDS:
    print(
      f'fixed-replay: unknown command {command!r}\n\n{_usage()}',
      file=sys.stderr,
    )
    return 2
  set_up_process(verbose)  # Before the subcommand imports TensorFlow.
  module = importlib.import_module(f'fixed_replay.cli.{command}')
  define_verbose_flag(verbose, module.__name__)
  # absl's --help prints __main__'s docstring and the flags defined by the
  # module named sys.argv[0]: point both at the subcommand.
  sys.argv[0] = module.__name__
  sys.modules['__main__'].__doc__ = module.__doc__
  app.run(
    functools.partial(run_command, command, module.main),
    argv=[f'fixed-replay {command}'] + argv[2:],
  )
  return 0


def user_message(error):
  """An error's message without the call stack gin appends to it."""
  lines = str(error).splitlines()
  return '\n'.join(x for x in lines if not _GIN_CALL.match(x)).rstrip()


def run_command(command, command_main, argv):
  """Runs a subcommand; leaves at once if remote calls are left hanging.

  Damaged or unsuitable data (CheckpointError, naming the path) and a
  mistake in what was asked for (UsageError, absl's app.UsageError) are
  printed as their message alone, with no traceback and not after the
  command's whole help (absl's way), and exit with status 1.
  """
  from fixed_replay import compat
  from fixed_replay.io import remote

  try:
    code = command_main(argv)
  except compat.MissingExtraError as error:
    # An installation step, not a bug: one line, no traceback.
    print(f'fixed-replay {command}: {error}', file=sys.stderr)
    code = 1
  except Exception as error:
    if remote.hanging():
      traceback.print_exc()
      remote.exit_now(1)
    if not isinstance(error, CheckpointError | UsageError | app.UsageError):
      raise
    print(f'fixed-replay {command}: {user_message(error)}', file=sys.stderr)
    if isinstance(error, app.UsageError):
      print(f'(fixed-replay {command} --help lists its flags)', file=sys.stderr)
    remote.exit_now(1)
    return 1
  remote.exit_now(code or 0)
  return code
