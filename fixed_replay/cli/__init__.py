"""The `fixed-replay` console script: dispatches to one subcommand.

Each subcommand is a module of this package that defines its own
absl flags and a `main(argv)`; only the chosen one is imported, so flags of
different subcommands never meet and `--help` shows just the relevant ones.
"""

import importlib
import sys

from absl import app

SUBCOMMANDS = {
  'demo': 'Generates a small Atari dataset and inspects it (the main job).',
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
}


def _usage():
  lines = ['usage: fixed-replay COMMAND [--flags]', '', 'commands:']
  lines += [f'  {name:<10} {text}' for name, text in SUBCOMMANDS.items()]
  lines += ['', 'fixed-replay COMMAND --help lists the flags of a command.']
  return '\n'.join(lines)


def main(argv=None):
  """Runs `fixed-replay COMMAND ...`."""
  argv = list(sys.argv if argv is None else argv)
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
  module = importlib.import_module(f'fixed_replay.cli.{command}')
  # absl's --help prints __main__'s docstring and the flags defined by the
  # module named sys.argv[0]: point both at the subcommand.
  sys.argv[0] = module.__name__
  sys.modules['__main__'].__doc__ = module.__doc__
  app.run(module.main, argv=[f'fixed-replay {command}'] + argv[2:])
  return 0


if __name__ == '__main__':
  sys.exit(main())
