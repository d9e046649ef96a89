"""Arrays kept in a file on local disk, mapped, not in the process's memory.

A buffer over a store holds about 25 bytes a row of tables it builds once
(unit offsets, actions, rewards, terminals, the valid-row table) and a 1 MB
zstd dictionary a checkpoint: for a mixture of 40 runs of 50 checkpoints of
20,000 rows, 3 GiB of anonymous memory, which the kernel can only keep or
swap. Written once into an unlinked file and mapped, the same bytes are page
cache: read at memory speed while RAM allows, shared with forked workers,
and under pressure written back and dropped, then read again, instead of
the process being killed.

The file lives in $FIXED_REPLAY_SPILL_DIR, else the temporary directory
($TMPDIR, /tmp). A tmpfs there would make it shared memory, RAM again. Where
the directory cannot hold the array, it is allocated in memory, with a
warning: the tables work the same either way.
"""

import mmap
import os
import tempfile

from absl import logging
import numpy as np

DIRECTORY_VARIABLE = 'FIXED_REPLAY_SPILL_DIR'
# Smaller arrays stay in memory: a mapping costs a page and a map entry.
SMALLEST_BYTES = 64 << 10


def empty(shape: int | tuple, dtype) -> np.ndarray:
  """An uninitialised, writable array in an unlinked, mapped file.

  Its disk blocks are reserved first, so a full disk is an OSError here
  (the array is then allocated in memory), never a SIGBUS while writing.
  """
  dtype = np.dtype(dtype)
  shape = (shape,) if isinstance(shape, int) else tuple(shape)
  nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  if nbytes < SMALLEST_BYTES:
    return np.empty(shape, dtype)
  directory = os.environ.get(DIRECTORY_VARIABLE) or tempfile.gettempdir()
  try:
    with tempfile.TemporaryFile(dir=directory) as stream:
      os.posix_fallocate(stream.fileno(), 0, nbytes)
      mapped = mmap.mmap(stream.fileno(), nbytes)
  except OSError as error:
    logging.log_first_n(
      logging.WARNING,
      'Tables held in memory: cannot map them in %s (%s); set %s',
      1,
      directory,
      error,
      DIRECTORY_VARIABLE,
    )
    return np.empty(shape, dtype)
  return np.frombuffer(mapped, dtype).reshape(shape)
