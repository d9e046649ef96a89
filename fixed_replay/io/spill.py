"""Arrays kept in a file on local disk, mapped, not in the process's memory.

A buffer over a store holds about 25 bytes a row of tables it builds once
(unit offsets, actions, rewards, terminals, the valid-row table) and a 1 MB
zstd dictionary a checkpoint: for a mixture of 40 runs of 50 checkpoints of
20,000 rows, 3 GiB of anonymous memory, which the kernel can only keep or
swap. Written once into an unlinked file and mapped, the same bytes are page
cache: read at memory speed while RAM allows, and under pressure written
back and dropped, then read again, instead of the process being killed.
Each process that opens a buffer (a DataLoader worker too) writes its own.

The file lives in $FIXED_REPLAY_SPILL_DIR, else /var/tmp: the place for
large temporary files, on disk where /tmp is often a tmpfs (Fedora, Debian
13), whose files are shared memory, RAM again. Where the directory cannot
hold the array, it stays in memory, with a warning: the tables work the
same either way.
"""

import ctypes
import os
import tempfile

from absl import logging
import numpy as np

from fixed_replay.io import mapped

DIRECTORY_VARIABLE = 'FIXED_REPLAY_SPILL_DIR'
DEFAULT_DIRECTORY = '/var/tmp'
# Smaller arrays stay in memory: a mapping costs a page and a map entry.
SMALLEST_BYTES = 64 << 10
_LIBC = ctypes.CDLL(None)


def copy(array: np.ndarray) -> np.ndarray:
  """`array`'s values, read-only, in an unlinked file mapped into memory.

  Read-only, so that nothing can change them (a forked worker would share
  the pages). Small arrays, and any the directory cannot take (with a
  warning), stay in memory, read-only all the same: a stray write fails on
  small data as on large.
  """
  array = np.ascontiguousarray(array)
  directory = os.environ.get(DIRECTORY_VARIABLE) or DEFAULT_DIRECTORY
  if array.nbytes >= max(SMALLEST_BYTES, 1):  # mmap refuses an empty file.
    try:
      with tempfile.TemporaryFile(dir=directory) as stream:
        stream.write(array.reshape(-1).view(np.uint8))
        stream.flush()
        data = mapped.map_descriptor(stream.fileno(), directory)
      return data.view(array.dtype).reshape(array.shape)
    except OSError as error:
      logging.log_first_n(
        logging.WARNING,
        f'Tables held in memory: {directory} cannot hold them ({error}); '
        f'set {DIRECTORY_VARIABLE}',
        1,
      )
  view = array.view()
  view.flags.writeable = False
  return view


def release_freed_memory() -> None:
  """Hands the heap's freed pages back to the kernel (glibc's malloc_trim).

  Building the tables frees megabytes of temporaries (a checkpoint's arrays
  before they are copied out) that glibc would otherwise keep for later
  allocations: 28 MB of the 70 MB a 50M-row run grew by.
  """
  if hasattr(_LIBC, 'malloc_trim'):  # glibc's; musl has none.
    _LIBC.malloc_trim(0)
