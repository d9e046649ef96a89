"""Writes Dopamine replay checkpoint files without holding the arrays.

Dopamine's `OutOfGraphReplayBuffer.save` writes `{name}_ckpt.{suffix}.gz`
files (file_names.py names them): gzip of `np.save` output for the
`$store$_` arrays, `add_count` and `invalid_range`, gzip of a pickle for
`episode_end_indices`; its `load` reads them back with `gzip.GzipFile` and
`np.load` / `pickle.load`. Holding a 1M-row checkpoint to call `save` takes
7 GB; this module writes the same files from row slices.

`GzipNpyWriter` does not know the number of rows, which the `.npy` header
states first, until it is closed. So the file is two gzip members (RFC 1952
allows any number; Python's gzip, numpy through it, and our GzipStream read
them as one stream): a fixed-size header member, written as a placeholder
and overwritten in place on close, then the rows, compressed in members of
`MEMBER_ROWS` rows (so several threads can compress them). Files are
deterministic: no name, mtime 0, the same bytes for the same rows.
"""

from collections.abc import Iterable
import concurrent.futures
import io
import os
import pickle
import zlib

import numpy as np
import numpy.typing as npt

from fixed_replay.io import gzip_stream

MEMBER_ROWS = 1024
_GZIP_WBITS = 31
_HEADER_BYTES = 128  # Of the .npy header: room for any shape of rows.
_PICKLE_PROTOCOL = 4
# zlib-ng compresses Atari frames ~3x faster than zlib at the same level.
_zlib = gzip_stream.BACKENDS[gzip_stream.DEFAULT_BACKEND]


def gzip_bytes(data: bytes | memoryview, level: int) -> bytes:
  """One gzip member of `data` (bytes-like)."""
  compressor = _zlib.compressobj(level, zlib.DEFLATED, _GZIP_WBITS)
  return compressor.compress(data) + compressor.flush()


def npy_header(dtype: npt.DTypeLike, shape: tuple[int, ...]) -> bytes:
  """A version 1.0 `.npy` header of exactly _HEADER_BYTES bytes."""
  text = (
    f"{{'descr': {np.lib.format.dtype_to_descr(np.dtype(dtype))!r}, "
    f"'fortran_order': False, 'shape': {tuple(shape)!r}, }}"
  )
  room = _HEADER_BYTES - 10  # Magic (6), version (2), length (2).
  if len(text) + 1 > room:
    raise ValueError(f'.npy header for shape {shape} does not fit')
  text = text.ljust(room - 1) + '\n'
  return (
    b'\x93NUMPY\x01\x00' + (room).to_bytes(2, 'little') + text.encode('latin1')
  )


def _header_member(dtype, shape):
  # Level 0 stores the bytes: the member's size depends only on theirs.
  return gzip_bytes(npy_header(dtype, shape), 0)


class GzipNpyWriter:
  """Writes a gzip `.npy` file of rows appended slice by slice.

  Attributes:
    num_rows: int, rows written so far.
    crc32: int, CRC-32 of the row bytes written so far.
  """

  def __init__(
    self,
    path: str,
    dtype: npt.DTypeLike,
    row_shape: tuple[int, ...],
    level: int,
    threads: int = 1,
  ) -> None:
    self._path = path
    self._dtype = np.dtype(dtype)
    self._row_shape = tuple(row_shape)
    self._level = level
    self._pool = concurrent.futures.ThreadPoolExecutor(max(1, threads))
    self._file = open(path, 'wb')
    self._header_size = len(_header_member(self._dtype, (0,) + self._row_shape))
    self._file.write(_header_member(self._dtype, (0,) + self._row_shape))
    self.num_rows = 0
    self.crc32 = 0

  def write(self, rows: np.ndarray) -> None:
    """Appends rows (array of the writer's dtype and row shape)."""
    rows = np.ascontiguousarray(rows, dtype=self._dtype)
    if rows.shape[1:] != self._row_shape:
      raise ValueError(f'rows of shape {rows.shape[1:]}, not {self._row_shape}')
    parts = [
      memoryview(rows[i : i + MEMBER_ROWS]).cast('B')
      for i in range(0, len(rows), MEMBER_ROWS)
    ]
    compress = lambda part: gzip_bytes(part, self._level)
    for part, member in zip(
      parts, self._pool.map(compress, parts), strict=True
    ):
      self.crc32 = _zlib.crc32(part, self.crc32)
      self._file.write(member)
    self.num_rows += len(rows)

  def close(self) -> None:
    """Finishes the file: rewrites the header with the final row count."""
    if self._file is None:
      return
    try:
      header = _header_member(self._dtype, (self.num_rows,) + self._row_shape)
      if len(header) != self._header_size:
        raise AssertionError('the .npy header member changed size')
      self._file.seek(0)
      self._file.write(header)
      self._file.flush()
      os.fsync(self._file.fileno())
    finally:
      self.abort()

  def abort(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None
      self._pool.shutdown()


def write_array(path: str, array: np.ndarray, level: int) -> None:
  """Writes an array whole, as Dopamine's save does (np.save in gzip)."""
  buffer = io.BytesIO()
  np.save(buffer, np.asarray(array), allow_pickle=False)
  _write_synced(path, gzip_bytes(buffer.getvalue(), level))


def write_episode_end_indices(
  path: str, rows: Iterable[int], level: int
) -> None:
  """Writes episode_end_indices as Dopamine does: a pickled set of ints."""
  indices = {int(row) for row in sorted(rows)}
  data = pickle.dumps(indices, protocol=_PICKLE_PROTOCOL)
  _write_synced(path, gzip_bytes(data, level))


def _write_synced(path: str, data) -> None:
  with open(path, 'wb') as stream:
    stream.write(data)
    stream.flush()
    os.fsync(stream.fileno())
