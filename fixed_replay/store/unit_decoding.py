"""Reads, checks and decodes a batch's zstd units in compiled code.

A batch from a store of one-frame units decodes some 150 units. Done in
Python (a `pread`, a CRC-32 and a zstd call per unit), the loop held the GIL
for most of a batch: sampling reached 0.3 of the decoder's speed and a second
sampling thread ran slower than one. Here one numba call per batch does the
reads (one per run of consecutive units), checks every unit's CRC-32 before
decoding it and decodes it straight into the frames, with the GIL released.

Out of memory, a transition is read from disk, a page or two of units. A
disk serves random 4 KiB reads four times as fast 16 deep as one at a time,
so the kernel first asks for every run of the batch at once
(`posix_fadvise(WILLNEED)`: Linux starts those reads together), and only
then reads and decodes them; runs already in memory cost nothing more.

The C functions come from pinned wheels, not from the system: libzstd from
python-zstandard's cffi extension (it exports zstd's whole API), the CRC-32
of ISA-L from isal's zlib module, `pread` and `posix_fadvise` from the C
library. numba calls them through addresses passed in as arguments, never
baked into the machine code, so the kernel is cached on disk like the
stacking kernels.
"""

import ctypes
import importlib.util
import threading

from llvmlite import ir
import numba
from numba import types
from numba.extending import intrinsic
import numpy as np

from fixed_replay import kernel_cache

kernel_cache.install()  # Before the first njit: see kernel_cache.py.

# Columns of a unit table: one row per stored checkpoint. Units are stored
# without the first 6 bytes every unit shares: zstd's magic number, then the
# 2 bytes HEADER holds (frame header descriptor and window descriptor,
# little-endian), put back in front of each unit before it is decoded.
# SIZES: the address of the units' sizes, SIZE_BYTES wide each; ANCHORS:
# of the int64 offset of every ANCHOR_UNITS-th unit.
FD, ANCHORS, CRCS, DDICT, NUM_UNITS, UNIT_BYTES, LAST_BYTES, HEADER = range(8)
SIZES, SIZE_BYTES, ANCHOR_UNITS = range(8, 11)
COLUMNS = 11
# zstd's frame magic number, as it is stored (little-endian).
ZSTD_MAGIC = 0xFD2FB528
# Bytes taken off the front of every unit.
STRIPPED = 6
# What `decode` reports in status[1] (status[0]: the unit's position).
OK, SHORT_READ, BAD_CRC, ZSTD_ERROR, WRONG_SIZE, NO_SUCH_UNIT = range(6)


def _load_library(module, symbol):
  origin = importlib.util.find_spec(module).origin
  library = ctypes.CDLL(origin)
  getattr(library, symbol)  # Fails here, naming the symbol, if missing.
  return library


def _address(function):
  return ctypes.cast(function, ctypes.c_void_p).value


_zstd = _load_library('zstandard._cffi', 'ZSTD_decompress_usingDDict')
_zstd.ZSTD_createDCtx.restype = ctypes.c_void_p
_zstd.ZSTD_freeDCtx.argtypes = [ctypes.c_void_p]
_zstd.ZSTD_createDDict_byReference.restype = ctypes.c_void_p
_zstd.ZSTD_createDDict_byReference.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_zstd.ZSTD_freeDDict.argtypes = [ctypes.c_void_p]
_zstd.ZSTD_getErrorName.restype = ctypes.c_char_p
_zstd.ZSTD_getErrorName.argtypes = [ctypes.c_size_t]
_crc = _load_library('isal.isal_zlib', 'crc32_gzip_refl')
_libc = ctypes.CDLL(None)
# The kernels' first argument: where their C functions are. Without the
# last two (FUNCTIONS[:READ_AHEAD]), they read one run or block at a time.
READ_AHEAD = 3
MADVISE = 4
FUNCTIONS = np.array(
  [
    _address(_zstd.ZSTD_decompress_usingDDict),
    _address(_crc.crc32_gzip_refl),
    _address(_libc.pread),
    _address(_libc.posix_fadvise),
    _address(_libc.madvise),
  ],
  dtype=np.int64,
)


def _c_call(c_type):
  """An intrinsic f(address, *int64 args) calling C at an int64 address.

  Arguments are truncated to the C type's narrower integers; the result,
  zero-extended when narrower, is an int64 (a size_t error is negative).
  """
  arity = len(c_type.args)

  def codegen(context, builder, signature, values):
    del context, signature
    callee = builder.inttoptr(values[0], c_type.as_pointer())
    arguments = [
      builder.trunc(v, t) if t.width < 64 else v
      for v, t in zip(values[1:], c_type.args, strict=True)
    ]
    result = builder.call(callee, arguments)
    if c_type.return_type.width < 64:
      result = builder.zext(result, _I64)
    return result

  def typer(typingctx, *args):
    del typingctx
    if len(args) != arity + 1:
      raise TypeError(f'{arity + 1} arguments expected')
    return types.int64(*([types.int64] * (arity + 1))), codegen

  return typer


_I32, _I64 = ir.IntType(32), ir.IntType(64)
# size_t ZSTD_decompress_usingDDict(dctx, dst, capacity, src, size, ddict):
# an error is (size_t)-code, negative as int64.
_zstd_type = ir.FunctionType(_I64, [_I64] * 6)
# uint32_t crc32_gzip_refl(uint32_t init, const unsigned char *, uint64_t).
_crc_type = ir.FunctionType(_I32, [_I32, _I64, _I64])
# ssize_t pread(int fd, void *buffer, size_t count, off_t offset).
_pread_type = ir.FunctionType(_I64, [_I32, _I64, _I64, _I64])


@intrinsic
def _call_zstd(typingctx, function, dctx, dst, capacity, src, size, ddict):
  return _c_call(_zstd_type)(
    typingctx, function, dctx, dst, capacity, src, size, ddict
  )


@intrinsic
def call_crc(typingctx, function, init, data, size):
  return _c_call(_crc_type)(typingctx, function, init, data, size)


@intrinsic
def _call_pread(typingctx, function, fd, buffer, count, offset):
  return _c_call(_pread_type)(typingctx, function, fd, buffer, count, offset)


# int posix_fadvise(int fd, off_t offset, off_t length, int advice).
_fadvise_type = ir.FunctionType(_I32, [_I32, _I64, _I64, _I32])
_WILLNEED = 3  # POSIX_FADV_WILLNEED


@intrinsic
def _call_fadvise(typingctx, function, fd, offset, length, advice):
  return _c_call(_fadvise_type)(typingctx, function, fd, offset, length, advice)


# int madvise(void *address, size_t length, int advice).
_madvise_type = ir.FunctionType(_I32, [_I64, _I64, _I32])
MADV_WILLNEED = 3


@intrinsic
def call_madvise(typingctx, function, address, length, advice):
  return _c_call(_madvise_type)(typingctx, function, address, length, advice)


def loader(value_type):
  """An intrinsic f(address) loading one `value_type` from an int64 address."""

  @intrinsic
  def load(typingctx, address):
    del typingctx

    def codegen(context, builder, signature, values):
      del signature
      pointer_type = context.get_value_type(value_type).as_pointer()
      return builder.load(builder.inttoptr(values[0], pointer_type))

    return value_type(types.int64), codegen

  return load


_load_int64, _load_uint32, _load_uint16, _load_uint8 = map(
  loader, (types.int64, types.uint32, types.uint16, types.uint8)
)


@numba.njit(nogil=True, cache=True, inline='always')
def _unit_size(table, source, unit):
  """The stored bytes of unit `unit` of table row `source`."""
  sizes = table[source, SIZES]
  width = table[source, SIZE_BYTES]
  if width == 1:
    return _load_uint8(sizes + unit)
  if width == 2:
    return _load_uint16(sizes + 2 * unit)
  return _load_uint32(sizes + 4 * unit)


@numba.njit(nogil=True, cache=True, inline='always')
def _unit_start(table, source, unit):
  """The offset of unit `unit` of table row `source` in its file."""
  every = table[source, ANCHOR_UNITS]
  first = unit - unit % every
  start = _load_int64(table[source, ANCHORS] + 8 * (first // every))
  for earlier in range(first, unit):
    start += _unit_size(table, source, earlier)
  return start


def _store(bits):
  @intrinsic
  def store(typingctx, address, value):
    """*(uintN_t *)address = value, at any alignment."""
    del typingctx

    def codegen(context, builder, signature, values):
      del signature
      kind = ir.IntType(bits)
      pointer = builder.inttoptr(values[0], kind.as_pointer())
      builder.store(builder.trunc(values[1], kind), pointer, align=1)
      return context.get_dummy_value()

    return types.void(address, value), codegen

  return store


_store_uint16, _store_uint32 = _store(16), _store(32)


@numba.njit(nogil=True, cache=True, inline='always')
def _run(table, which, units, k):
  """(end, first byte, bytes) of the run of consecutive units of one source
  from units[k]: what one read takes."""
  source, end = which[k], k + 1
  while (
    end < len(units)
    and which[end] == source
    and units[end] == units[end - 1] + 1
  ):
    end += 1
  size = 0
  for j in range(k, end):
    size += _unit_size(table, source, units[j])
  return end, _unit_start(table, source, units[k]), size


@numba.njit(nogil=True, cache=True)
def decode_units(
  functions, table, which, units, out_at, stride, slots, dctx, status
):
  """Reads, checks and decodes units[k] of table row which[k].

  Unit k decodes to address out_at + slots[k] * stride (slots empty: k);
  see `decode` for the rest.
  Compiled code may call this; it checks the units, not the table rows.
  """
  count = len(units)
  total = 0
  for k in range(count):
    source, unit = which[k], units[k]
    if unit < 0 or unit >= table[source, NUM_UNITS]:
      status[0], status[1] = k, NO_SUCH_UNIT
      return
    # Each unit's bytes, and room before each for what was stripped.
    total += _unit_size(table, source, unit) + STRIPPED
  # numba frees an array right after the last use of its variable, and the
  # reads use only its address: passed as an argument, it lives until the
  # call returns. (Taken from a local array, the address pointed at freed
  # memory that other threads' allocations reused: CRC failures on sound
  # stores, and heap corruption.)
  scratch = np.empty(max(total, 1), np.uint8)
  _read_and_decode(
    functions, table, which, units, out_at, stride, slots, dctx, status, scratch
  )


@numba.njit(nogil=True, cache=True)
def _read_and_decode(
  functions, table, which, units, out_at, stride, slots, dctx, status, scratch
):
  """decode_units' reads and decoding, into the caller's `scratch`."""
  count = len(units)
  scratch_at = np.int64(scratch.ctypes.data)
  if functions.size > READ_AHEAD:
    # Every run asked for before the first is read (see the module's
    # docstring): a disk serves the batch at depth, not one read at a time.
    k = 0
    while k < count:
      end, first, size = _run(table, which, units, k)
      if size:  # A length of 0 would mean the whole rest of the file.
        _call_fadvise(
          functions[READ_AHEAD], table[which[k], FD], first, size, _WILLNEED
        )
      k = end
  k = 0
  read = 0  # Bytes of scratch filled.
  while k < count:
    source = which[k]
    end, first, size = _run(table, which, units, k)
    # Room before the run: where its first unit's stripped bytes go.
    read += STRIPPED
    got = _call_pread(
      functions[2], table[source, FD], scratch_at + read, size, first
    )
    if got != size:
      status[0], status[1], status[2], status[3] = k, SHORT_READ, got, end
      return
    data, length = scratch_at + read, 0
    for j in range(k, end):
      unit = units[j]
      data += length  # Past the unit before it in the run.
      length = _unit_size(table, source, unit)
      crc = call_crc(functions[1], 0, data, length)
      if crc != _load_uint32(table[source, CRCS] + 4 * unit):
        status[0], status[1], status[2] = j, BAD_CRC, crc
        return
      expected = table[source, UNIT_BYTES]
      if unit == table[source, NUM_UNITS] - 1:
        expected = table[source, LAST_BYTES]
      # Over the previous unit's last bytes: checked and decoded already.
      _store_uint32(data - STRIPPED, ZSTD_MAGIC)
      _store_uint16(data - 2, table[source, HEADER])
      whole, whole_length = data - STRIPPED, length + STRIPPED
      decoded = _call_zstd(
        functions[0],
        dctx,
        out_at + (slots[j] if slots.size else j) * stride,
        expected,
        whole,
        whole_length,
        table[source, DDICT],
      )
      if decoded != expected:
        status[0], status[2] = j, decoded
        status[1] = ZSTD_ERROR if decoded < 0 else WRONG_SIZE
        return
    read += size
    k = end
  status[1] = OK


class _Context:
  """One thread's zstd decoding context, freed with the thread."""

  _free = _zstd.ZSTD_freeDCtx  # Still there while the interpreter exits.

  def __init__(self):
    self.address = _zstd.ZSTD_createDCtx()
    if not self.address:
      raise MemoryError('zstd could not allocate a decoding context')

  def __del__(self):
    self._free(self.address)


_local = threading.local()


def context():
  """The address of this thread's zstd decoding context."""
  found = getattr(_local, 'context', None)
  if found is None:
    found = _local.context = _Context()
  return found.address


class Dictionary:
  """A zstd dictionary digested for decoding, shared by every thread.

  zstd keeps its entropy tables (about 27 KB) and refers to `data`, a uint8
  array held here, for the content: the run's dictionary mapped from the
  store keeps its megabytes out of the process's own memory.
  """

  _free = _zstd.ZSTD_freeDDict

  def __init__(self, data: np.ndarray):
    self.address = 0
    self._data = data
    if len(data):
      self.address = _zstd.ZSTD_createDDict_byReference(
        data.ctypes.data, len(data)
      )
      if not self.address:
        raise MemoryError('zstd could not load the dictionary')

  def __del__(self):
    if self.address:
      self._free(self.address)


def error_name(code):
  """zstd's name for the (negative) result of a failed decode."""
  return _zstd.ZSTD_getErrorName(code & 0xFFFFFFFFFFFFFFFF).decode()


def decode(table, which, units, out, slots=None):
  """Reads, checks and decodes units into `out`, outside the GIL.

  Args:
    table: int64 array (sources, COLUMNS) describing the checkpoints (file
      descriptor, addresses of their unit offsets or sizes and anchors and
      of their uint32 CRCs, of their Dictionary, and unit sizes). The
      arrays behind the addresses must outlive the call.
    which: int64 array (n,), the table row of each unit.
    units: int64 array (n,), unit numbers, increasing within a run of one
      source (any order otherwise).
    out: C-contiguous uint8 array (rows, stride): unit k decodes to
      out[slots[k]] (out[k] without `slots`).
    slots: optional int64 array (n,) of rows of `out`.

  Returns:
    int64 array [position, status, value, run end]: status OK, or what
    went wrong with unit `position` (the got bytes of a SHORT_READ of the
    run [position, run end), the CRC-32 of a BAD_CRC, zstd's result of a
    ZSTD_ERROR or WRONG_SIZE).
  """
  if out.dtype != np.uint8 or out.ndim != 2 or not out.flags.c_contiguous:
    raise ValueError('`out` must be a C-contiguous 2-D uint8 array')
  if table[:, UNIT_BYTES].max(initial=0) > out.shape[1]:
    raise ValueError('a unit decodes to more bytes than a row of `out`')
  if slots is None:
    slots = np.arange(len(units))
  slots = np.ascontiguousarray(slots, np.int64)
  if len(which) != len(units) or len(slots) != len(units):
    raise ValueError('`which`, `units` and `slots` disagree in length')
  if slots.size and (slots.min() < 0 or slots.max() >= len(out)):
    raise IndexError(f'slots outside the {len(out)} rows of `out`')
  which = np.ascontiguousarray(which, np.int64)
  # The kernel does no bounds checks on the table (units it checks).
  if which.size and (which.min() < 0 or which.max() >= len(table)):
    raise IndexError(f'table rows outside [0, {len(table)})')
  status = np.zeros(4, np.int64)
  decode_units(
    FUNCTIONS,
    np.ascontiguousarray(table, np.int64),
    which,
    np.ascontiguousarray(units, np.int64),
    out.ctypes.data,
    out.shape[1],
    slots,
    context(),
    status,
  )
  return status
