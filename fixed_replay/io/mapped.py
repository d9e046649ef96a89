"""Files mapped read-only without a descriptor, and the descriptors kept.

Python's mmap, and numpy's memmap on it, keep a duplicate of the file's
descriptor for as long as the mapping lives. A store maps a checkpoint's
tables and keeps its units open for `pread`: a mixture of 2,000 checkpoints
would hold 4,000 descriptors, where a desktop's soft limit is 1,024.
Linux keeps a mapping valid once its descriptor is closed, so here a file is
mapped with the C library's mmap and closed at once: a checkpoint holds one
descriptor, its units'. When even those outnumber the soft limit,
`reserve_descriptors` raises it towards the hard limit, and says so.

Where a limit is reached anyway, the error names it and its fix: Linux
reports a process out of maps (`vm.max_map_count`) as "Cannot allocate
memory", which points at RAM.
"""

import contextlib
import ctypes
import errno
import mmap
import os
import resource
import weakref

from absl import logging
import numpy as np

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mmap.restype = ctypes.c_void_p
_LIBC.mmap.argtypes = [
  ctypes.c_void_p,
  ctypes.c_size_t,
  ctypes.c_int,
  ctypes.c_int,
  ctypes.c_int,
  ctypes.c_long,
]
_LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value
# Descriptors left free beyond those reserved: imports, logs, sockets.
_SPARE = 64
# Maps short of vm.max_map_count at which a failed mmap is the limit's
# doing: the C library and numpy take a few of their own meanwhile.
_MAPS_SPARE = 64
_LIBC.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


class LimitError(OSError):
  """A limit of the system reached (maps, open files): names it and its fix."""


def _limit_error(code: int, name: str) -> OSError:
  """The error of a failed mmap or open: a LimitError at Linux's limits."""
  held = limit = 0
  if code == errno.ENOMEM:
    with contextlib.suppress(OSError, ValueError):  # Not Linux's /proc.
      with open('/proc/self/maps') as maps:
        held = sum(1 for _ in maps)
      with open('/proc/sys/vm/max_map_count') as limit_file:
        limit = int(limit_file.read())
    if limit and held + _MAPS_SPARE >= limit:
      return LimitError(
        code,
        f"this process holds {held:,} memory maps, at Linux's limit "
        f'(vm.max_map_count = {limit:,}), not out of memory: raise it, e.g. '
        f'`sudo sysctl -w vm.max_map_count={4 * limit}`',
        name,
      )
  if code == errno.EMFILE:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return LimitError(
      code,
      f'{soft:,} files open, the soft limit on open files: raise it, e.g. '
      f'`ulimit -n {4 * soft}` in the shell that starts the run',
      name,
    )
  return OSError(code, os.strerror(code), name)


def map_descriptor(descriptor: int, name: str) -> np.ndarray:
  """The whole file open as `descriptor` (`name`, for errors), as a
  read-only uint8 array; unmapped when the last array viewing it goes."""
  size = os.fstat(descriptor).st_size
  if not size:  # mmap refuses an empty file.
    array = np.zeros(0, np.uint8)
  else:
    address = _LIBC.mmap(
      None, size, mmap.PROT_READ, mmap.MAP_SHARED, descriptor, 0
    )
    if address in (None, _MAP_FAILED):
      raise _limit_error(ctypes.get_errno(), name)
    memory = (ctypes.c_ubyte * size).from_address(address)
    weakref.finalize(memory, _LIBC.munmap, address, size)
    array = np.frombuffer(memory, np.uint8)
  array.flags.writeable = False
  return array


def in_page_cache(array: np.ndarray) -> bool:
  """Whether every page of a map_file array is in the page cache: reading
  it costs no read from disk (mincore; False where it fails)."""
  if not array.size:
    return True
  pages = -(-array.size // mmap.PAGESIZE)
  vector = np.zeros(pages, np.uint8)
  if _LIBC.mincore(array.ctypes.data, array.size, vector.ctypes.data):
    return False
  return bool((vector & 1).all())


def advise(
  array: np.ndarray, advice: int, start: int = 0, length: int | None = None
) -> None:
  """madvise(`advice`, e.g. mmap.MADV_RANDOM) on bytes [start, start +
  length) of a map_file array (default: all of it); a hint, never fails."""
  first = start - start % mmap.PAGESIZE
  end = array.size if length is None else min(start + length, array.size)
  if end > first:
    _LIBC.madvise(array.ctypes.data + first, end - first, advice)


def map_file(path: str) -> np.ndarray:
  """map_descriptor of the file at `path`; no descriptor stays open."""
  try:
    descriptor = os.open(path, os.O_RDONLY)
  except OSError as error:
    if error.errno != errno.EMFILE:
      raise
    raise _limit_error(error.errno, path) from error
  try:
    return map_descriptor(descriptor, path)
  finally:
    os.close(descriptor)


def reserve_descriptors(count: int) -> None:
  """Makes room under the soft limit on open files for `count` more (and
  _SPARE besides), raising it towards the hard limit, with a log line."""
  soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  needed = len(os.listdir('/dev/fd')) + count + _SPARE
  if needed <= soft or soft == hard:
    return
  wanted = max(needed, 2 * soft)
  if hard != resource.RLIM_INFINITY:
    wanted = min(wanted, hard)
  resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
  logging.info(
    'Raised the soft limit on open files from %d to %d (hard limit %s): '
    'each stored checkpoint keeps its units open',
    soft,
    wanted,
    'none' if hard == resource.RLIM_INFINITY else hard,
  )
