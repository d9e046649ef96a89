"""Progress bars for people at a terminal; silent in logs and CI."""

import sys

import tqdm


def bar(total, desc, unit='it', unit_scale=False):
  """Returns a tqdm bar shown only when stderr is a terminal."""
  return tqdm.tqdm(
    total=total,
    desc=desc,
    unit=unit,
    unit_scale=unit_scale,
    disable=not sys.stderr.isatty(),
    dynamic_ncols=True,
    leave=False,
  )
