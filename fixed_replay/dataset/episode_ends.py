"""Reads Dopamine's pickled `episode_end_indices`, trusting nothing in it.

Newer Dopamine saves the rows where episodes were cut (without a terminal)
as a pickled set of numpy int64 scalars. A dataset may come from anywhere,
so the unpickler builds integers and sets only, and the file's inflated
size is bounded before anything is unpickled.
"""

import io
import pickle

import numpy as np

from fixed_replay.dataset import checks
from fixed_replay.errors import CheckpointError
from fixed_replay.io.gzip_stream import GzipStream


class _IndexSetUnpickler(pickle.Unpickler):
  """Unpickles a set of integers and nothing else.

  Dopamine pickles `episode_end_indices` (a set of numpy int64 scalars); a
  dataset may come from anywhere, so no other object may be constructed.
  """

  _ALLOWED = {
    ('builtins', 'set'),
    ('builtins', 'frozenset'),
    ('builtins', 'int'),
    ('numpy', 'dtype'),
    ('numpy.core.multiarray', 'scalar'),
    ('numpy._core.multiarray', 'scalar'),
    ('numpy', 'int64'),
  }

  def find_class(self, module, name):
    if (module, name) in self._ALLOWED:
      return super().find_class(module, name)
    raise pickle.UnpicklingError(f'{module}.{name} is not allowed')


def read_episode_end_indices(
  path: str, num_rows: int | None = None
) -> np.ndarray:
  """Reads Dopamine's pickled episode_end_indices set as sorted int64 rows.

  Args:
    path: str.
    num_rows: int or None, rows of the checkpoint's arrays: bounds what the
      file may inflate to (checked before unpickling) and the rows it names.

  Raises:
    CheckpointError: if the file is damaged, too big, or not a set of ints
      naming rows of the arrays.
  """
  limit = checks.episode_ends_byte_limit(
    checks.MAX_ROWS if num_rows is None else num_rows
  )
  with GzipStream(path) as stream:
    data = stream.read_remaining(limit)
  try:
    values = _IndexSetUnpickler(io.BytesIO(data)).load()
  except Exception as error:  # noqa: BLE001 - any damage in the pickle.
    raise CheckpointError(
      path,
      f'episode_end_indices is not a pickled set of ints: '
      f'{type(error).__name__}: {error}'[:300],
    ) from error
  return checks.episode_ends(path, values, num_rows)
