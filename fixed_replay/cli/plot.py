r"""`fixed-replay plot RUN_DIR...`: evaluation return per iteration, as PNG.

Reads each run's logs/log_N files (what `fixed-replay train` and Dopamine's
runners write) and draws one line per run, labelled by its directory name:

  fixed-replay plot /tmp/dqn_pong /tmp/rem_pong --output=pong.png
"""

from absl import app
from absl import flags
from absl import logging

from fixed_replay.training import plotting

_OUTPUT = flags.DEFINE_string('output', 'plot.png', 'PNG file to write.')
_OVERWRITE = flags.DEFINE_boolean(
  'overwrite', False, 'Replace --output if it already exists.'
)
_TITLE = flags.DEFINE_string('title', None, 'Title of the plot.')


def main(argv: list[str]) -> int:
  """Plots the runs named by the positional arguments."""
  if len(argv) < 2:
    raise app.UsageError(
      'expected one or more run directories\n'
      'usage: fixed-replay plot RUN_DIR... [--output=plot.png]'
    )
  curves = plotting.plot_eval_returns(
    argv[1:], _OUTPUT.value, title=_TITLE.value, overwrite=_OVERWRITE.value
  )
  for curve in curves:
    logging.info(
      '%s: %d iterations, last eval return %.2f',
      curve.label,
      len(curve.iterations),
      curve.returns[-1],
    )
  print(_OUTPUT.value)
  return 0
