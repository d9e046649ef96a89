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
# The tables mapped here are read whole when opened (their CRC-32), so their
# pages are in memory then: MAP_POPULATE has the kernel enter them in the
# process's page table at once, from the cache, instead of one minor fault at
# a time while sampling (a 40-run mixture spreads its reads over 2,000
# checkpoints' pages, and faulted on most transitions). Only up to half the
# machine's memory a process: beyond, the first tables checked may have left
# the cache by the time they are mapped, and populating would read them again.
_POPULATE = getattr(mmap, 'MAP_POPULATE', 0)
_POPULATED_AT_MOST = (
  os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') // 2
)
_populated = {'bytes': 0, 'pid': os.getpid()}  # This process's, so far.


def _populate(size: int) -> int:
  """The flag that populates a map of `size` bytes, while under the cap."""
  if _populated['pid'] != os.getpid():  # A forked child's page table is new.
    _populated.update(bytes=0, pid=os.getpid())
  if _populated['bytes'] + size > _POPULATED_AT_MOST:
    return 0
  _populated['bytes'] += size
  return _POPULATE


def _unmap(address: int | None, size: int, populated: int) -> None:
  """Unmaps a map of map_descriptor (None: none was made), and counts it."""
  if address is not None:
    _LIBC.munmap(address, size)
  if populated and _populated['pid'] == os.getpid():
    _populated['bytes'] -= size


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
    populate = _populate(size)
    address = _LIBC.mmap(
      None, size, mmap.PROT_READ, mmap.MAP_SHARED | populate, descriptor, 0
    )
    if address in (None, _MAP_FAILED):
      _unmap(None, size, populate)
      raise _limit_error(ctypes.get_errno(), name)
    memory = (ctypes.c_ubyte * size).from_address(address)
    weakref.finalize(memory, _unmap, address, size, populate)
    array = np.frombuffer(memory, np.uint8)
  array.flags.writeable = False
  return array


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
