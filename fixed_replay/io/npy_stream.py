"""Reads row windows of `.npy` arrays stored inside gzip files.

A Dopamine checkpoint file is `np.save` output wrapped in gzip. Rows are stored
contiguously after a short header, so rows [start, start + count) are the
bytes [start * row_bytes, (start + count) * row_bytes) of the payload: we
decompress and discard what comes before, decompress straight into the result
array, then check the file.

Checking means inflating to the end of the file, where gzip keeps the CRC-32
and length of everything before: a window is returned only once that check
passed (and the payload is exactly what the header promises). A window that
reaches the file's end costs nothing more; a shorter one costs inflating the
rest into a fixed-size scratch buffer, unless `verify=False` is asked for
data already verified once.
"""

import ast
import dataclasses
import struct
import threading

import numpy as np
from numpy.lib import format as npy_format
import numpy.typing as npt

from fixed_replay.errors import CheckpointError
from fixed_replay.io import gzip_stream
from fixed_replay.io.gzip_stream import GzipStream

_MAGIC = b'\x93NUMPY'
_MAX_HEADER_BYTES = 1 << 16
# What damaged header text can raise when parsed (UnicodeDecodeError is a
# ValueError; deep nesting a RecursionError).
# CPython 3.11 before 3.11.8 tracks the AST constructor's recursion depth in
# state shared by all threads (gh-106905): two threads parsing headers at
# once (checkpoints load in parallel) can fail with "SystemError: AST
# constructor recursion depth mismatch". Headers are parsed one at a time.
_PARSE_LOCK = threading.Lock()

_HEADER_ERRORS = (
  ValueError,
  SyntaxError,
  KeyError,
  TypeError,
  MemoryError,
  RecursionError,
  OverflowError,
)


def row_bytes(row_shape: tuple[int, ...], dtype: npt.DTypeLike) -> int:
  """Bytes of one row of `row_shape` elements of `dtype`."""
  return int(np.prod(row_shape, dtype=np.int64)) * np.dtype(dtype).itemsize


@dataclasses.dataclass(frozen=True)
class ArrayHeader:
  """What a `.npy` header says about the array that follows it."""

  dtype: np.dtype
  shape: tuple
  data_offset: int = 0  # Uncompressed byte where the payload starts.

  @property
  def num_rows(self) -> int:
    """Length of the first axis (1 for a 0-d array)."""
    return self.shape[0] if self.shape else 1

  @property
  def row_shape(self) -> tuple:
    return self.shape[1:]

  @property
  def row_bytes(self) -> int:
    return row_bytes(self.row_shape, self.dtype)

  @property
  def nbytes(self) -> int:
    return self.num_rows * self.row_bytes


def read_header(stream):
  """Parses the `.npy` header at the start of a GzipStream.

  Args:
    stream: GzipStream positioned at the start of the file.

  Returns:
    ArrayHeader.

  Raises:
    CheckpointError: if the header is malformed, or describes an object,
      Fortran-ordered or otherwise unreadable array.
  """
  path = stream.path
  if stream.read(len(_MAGIC)) != _MAGIC:
    raise CheckpointError(path, 'not a .npy array (bad magic bytes)')
  major, _ = stream.read(2)
  fmt = {1: '<H', 2: '<I', 3: '<I'}.get(major)  # The header length's.
  if fmt is None:
    raise CheckpointError(path, f'unsupported .npy format version {major}')
  (header_length,) = struct.unpack(fmt, stream.read(struct.calcsize(fmt)))
  if header_length > _MAX_HEADER_BYTES:
    raise CheckpointError(path, f'.npy header of {header_length} bytes')
  raw = stream.read(header_length)
  try:
    text = raw.decode('utf8' if major == 3 else 'latin1')
    with _PARSE_LOCK:
      fields = ast.literal_eval(text)
    dtype = npy_format.descr_to_dtype(fields['descr'])
    shape = tuple(int(n) for n in fields['shape'])
    fortran_order = bool(fields['fortran_order'])
  except _HEADER_ERRORS as error:
    raise CheckpointError(
      path,
      f'bad .npy header {raw[:200]!r} ({type(error).__name__}: {error})',
    ) from error
  if dtype.hasobject:
    raise CheckpointError(path, f'object arrays are not read ({dtype})')
  if fortran_order and len(shape) > 1:
    raise CheckpointError(path, 'Fortran-ordered arrays are not supported')
  if any(n < 0 for n in shape):
    raise CheckpointError(path, f'negative dimension in shape {shape}')
  header = ArrayHeader(dtype=dtype, shape=shape, data_offset=stream.position)
  _check_fits_file(stream, header)
  return header


def _check_fits_file(stream, header):
  """Refuses a header promising more data than the file can inflate to.

  Checked before anything is allocated for it: a damaged shape must not
  become a huge allocation.
  """
  promised = header.nbytes
  if promised <= 1 << 20:
    return
  limit = stream.compressed_size() * gzip_stream.MAX_INFLATE_RATIO
  if promised > limit:
    raise CheckpointError(
      stream.path,
      f'header promises {promised} bytes ({header.dtype} {header.shape}), '
      f'more than a file of {stream.compressed_size()} bytes can hold',
    )


def read_npy_header(path):
  """Returns the ArrayHeader of a gzip `.npy` file, decompressing only it."""
  with GzipStream(path) as stream:
    return read_header(stream)


def check_header(path, header, dtype=None, row_shape=None):
  """Raises CheckpointError unless the header has the expected dtype/shape."""
  if dtype is not None and header.dtype != np.dtype(dtype):
    raise CheckpointError(
      path, f'dtype is {header.dtype}, expected {np.dtype(dtype)}'
    )
  if row_shape is not None and tuple(header.row_shape) != tuple(row_shape):
    raise CheckpointError(
      path,
      f'rows have shape {tuple(header.row_shape)}, expected '
      f'{tuple(row_shape)} (array shape {header.shape})',
    )


def finish(stream, header):
  """Inflates the rest of a stream and checks the whole file.

  Checks the gzip CRC-32 and length of every member, and that the payload
  after the header is exactly what the header promises. Memory: a fixed
  scratch buffer, whatever the file's size.

  Args:
    stream: GzipStream whose header (and any part of the payload) was read.
    header: its ArrayHeader.

  Raises:
    CheckpointError: on any damage.
  """
  stream.read_to_end()
  payload = stream.position - header.data_offset
  if payload != header.nbytes:
    raise CheckpointError(
      stream.path,
      f'holds {payload} bytes after the header at byte '
      f'{header.data_offset}, header promises {header.nbytes}',
    )


def read_rows(
  path, start=0, count=None, dtype=None, row_shape=None, verify=True
):
  """Returns rows [start, start + count) of a gzip `.npy` file.

  Holds only the result plus a fixed-size decompression buffer. The file is
  checked (gzip CRC-32 and length, payload size) before anything is
  returned: free when the rows reach the end of the file, an inflate of the
  rest otherwise.

  Args:
    path: str, file to read.
    start: int, first row.
    count: int or None, number of rows; None reads to the end.
    dtype: optional expected dtype; a mismatch raises CheckpointError.
    row_shape: optional expected shape of one row.
    verify: bool; False skips inflating what follows a window that ends
      before the file does (for data verified once). A window reaching the
      end of the file is always checked.

  Returns:
    np.ndarray equal to `np.load(path)[start:start + count]`; a 0-d array is
    returned whole.

  Raises:
    CheckpointError: if the file is damaged, too short, or not as expected.
  """
  with GzipStream(path) as stream:
    header = read_header(stream)
    check_header(path, header, dtype, row_shape)
    if not header.shape:
      result = np.empty((), header.dtype)
      stream.readinto(result.reshape(1).view(np.uint8))
      finish(stream, header)
      return result
    if count is None:
      count = header.num_rows - start
    if start < 0 or count < 0 or start + count > header.num_rows:
      raise CheckpointError(
        path,
        f'rows [{start}, {start + count}) asked, but the array has '
        f'{header.num_rows} rows',
      )
    result = np.empty((count,) + header.row_shape, header.dtype)
    stream.skip(start * header.row_bytes)
    if result.nbytes:
      stream.readinto(result.reshape(-1).view(np.uint8))
    if verify or start + count == header.num_rows:
      finish(stream, header)
    return result


def verify(path):
  """Decompresses a whole gzip `.npy` file and checks it is intact.

  Checks the gzip CRC and length, the header, and that the payload size is
  exactly what the header promises.

  Args:
    path: str.

  Returns:
    ArrayHeader of the file.

  Raises:
    CheckpointError: on any damage.
  """
  with GzipStream(path) as stream:
    header = read_header(stream)
    finish(stream, header)
    return header
