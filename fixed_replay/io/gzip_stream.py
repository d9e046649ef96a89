"""Incremental gzip decompression that stops as soon as it has enough bytes.

The fastest inflate implementation available is used: zlib-ng, then
python-isal, then the standard library's zlib (`benchmarks/inflate_backends.py`
on a 1M-row Breakout observation file: 4.6, 3.6 and 0.6 GB/s; on Enduro,
zlib-ng and isal are level). All three expose zlib's
`decompressobj` interface, including `max_length`, which is what keeps memory
bounded: no call ever produces more bytes than the caller still needs.
"""

import os
import zlib

from fixed_replay.errors import CheckpointError
from fixed_replay.errors import RemoteError
from fixed_replay.io import files as storage

_GZIP_WBITS = 31  # 16 + MAX_WBITS: expect a gzip header and trailer.
INPUT_CHUNK_BYTES = 1 << 20  # Compressed bytes read from disk per call.
# Most decompressed bytes produced per call, i.e. the fixed buffer a read
# holds besides its result. Each call re-acquires the GIL, which a busy
# training thread holds for up to 5 ms at a time, so bigger is better for a
# background load; but each call also allocates its output afresh, and past
# a few MB that costs new pages (measured: 16 MB chunks make the copy into the
# result twice as slow as 4 MB). Discarded output (skip) has no copy.
READ_CHUNK_BYTES = 4 << 20
SKIP_CHUNK_BYTES = 16 << 20
# Deflate never inflates more than 1032 bytes per compressed byte (zlib's
# technical notes), so a header promising more than this per byte of the file
# is damaged, whatever it says.
MAX_INFLATE_RATIO = 1032


def _load_backends():
  backends = []
  try:
    from zlib_ng import zlib_ng

    backends.append(('zlib-ng', zlib_ng))
  except ImportError:
    pass
  try:
    from isal import isal_zlib

    backends.append(('isal', isal_zlib))
  except ImportError:
    pass
  backends.append(('zlib', zlib))
  return dict(backends)


BACKENDS = _load_backends()
DEFAULT_BACKEND = next(iter(BACKENDS))


class GzipStream:
  """Reads exact byte counts from a gzip file, decompressing on demand.

  Multi-member gzip files are read as one stream, as `gzip.GzipFile` does.
  Every member's CRC-32 and length (the gzip trailer) are checked when the
  decompressor reaches them, i.e. once everything before was read:
  `read_to_end` gets there. Every failure raises `CheckpointError` naming the
  file.
  """

  def __init__(self, path, backend=None):
    """Opens `path`.

    Args:
      path: str, a local path or any path `tf.io.gfile` reads.
      backend: str or None, a key of `BACKENDS`; None picks the fastest.
    """
    self.path = str(path)
    self._module = BACKENDS[backend or DEFAULT_BACKEND]
    try:
      self._raw = storage.open_read(self.path)
    except OSError as error:
      raise CheckpointError(self.path, f'cannot open: {error}') from error
    self._decompressor = self._module.decompressobj(_GZIP_WBITS)
    self._input = b''  # Compressed bytes not yet given to the decompressor.
    self._finished = False
    self.position = 0  # Decompressed bytes delivered so far.

  def close(self):
    self._raw.close()

  def __enter__(self):
    return self

  def __exit__(self, *unused_exc_info):
    self.close()

  def _next_input(self):
    """Returns compressed input for the decompressor, or b'' at file end."""
    if self._decompressor.unconsumed_tail:
      return self._decompressor.unconsumed_tail
    if self._input:
      data, self._input = self._input, b''
      return data
    return self._read_raw()

  def _read_raw(self):
    try:
      return self._raw.read(INPUT_CHUNK_BYTES)
    except RemoteError:
      raise
    except OSError as error:
      raise CheckpointError(self.path, f'cannot read: {error}') from error

  def compressed_size(self):
    """Size of the file in bytes (what is on disk, compressed)."""
    if hasattr(self._raw, 'fileno'):
      return os.fstat(self._raw.fileno()).st_size
    return self._raw.size()

  def _decompress_some(self, max_length):
    """Returns up to max_length (> 0) new bytes; b'' at the end of the data."""
    while not self._finished:
      if self._decompressor.eof:
        # End of one gzip member: another may follow, or zero padding.
        self._input = self._decompressor.unused_data + self._input
        if not self._input:
          self._input = self._read_raw()
        if not self._input.strip(b'\0'):
          self._finished = True
          break
        self._decompressor = self._module.decompressobj(_GZIP_WBITS)
      data = self._next_input()
      if not data:
        raise CheckpointError(
          self.path,
          f'truncated gzip data: the file ends after '
          f'{self.position} uncompressed bytes',
        )
      try:
        out = self._decompressor.decompress(data, max_length)
      except self._module.error as error:
        raise CheckpointError(
          self.path,
          f'corrupt gzip data after {self.position} '
          f'uncompressed bytes: {error}',
        ) from error
      if out:
        self.position += len(out)
        return out
    return b''

  def readinto(self, buffer):
    """Fills `buffer` (any writable buffer) completely.

    Args:
      buffer: a writable object supporting the buffer protocol.

    Raises:
      CheckpointError: if the data ends first or is corrupt.
    """
    view = memoryview(buffer).cast('B')
    filled = 0
    while filled < len(view):
      chunk = self._decompress_some(min(len(view) - filled, READ_CHUNK_BYTES))
      if not chunk:
        raise CheckpointError(
          self.path,
          f'data ends after {self.position} uncompressed bytes, '
          f'{len(view) - filled} bytes short of what its header promises',
        )
      view[filled : filled + len(chunk)] = chunk
      filled += len(chunk)

  def read(self, num_bytes):
    """Returns exactly num_bytes bytes (small reads such as headers)."""
    buffer = bytearray(num_bytes)
    self.readinto(buffer)
    return bytes(buffer)

  def skip(self, num_bytes):
    """Decompresses and discards num_bytes bytes."""
    while num_bytes > 0:
      chunk = self._decompress_some(min(num_bytes, SKIP_CHUNK_BYTES))
      if not chunk:
        raise CheckpointError(
          self.path, f'data ends after {self.position} uncompressed bytes'
        )
      num_bytes -= len(chunk)

  def read_remaining(self, limit):
    """Returns all remaining decompressed bytes, refusing more than `limit`.

    Args:
      limit: int, the most bytes the file may hold (memory stays bounded by
        it whatever the file inflates to).

    Raises:
      CheckpointError: if the data is damaged or longer than `limit`.
    """
    data = bytearray()
    while chunk := self._decompress_some(min(READ_CHUNK_BYTES, limit + 1)):
      data += chunk
      if len(data) > limit:
        raise CheckpointError(
          self.path,
          f'inflates to more than {limit} bytes, more than such a file can '
          'hold: refused',
        )
    return bytes(data)

  def read_to_end(self):
    """Decompresses the rest, checking CRCs; returns the bytes it skipped."""
    start = self.position
    while self._decompress_some(SKIP_CHUNK_BYTES):
      pass
    return self.position - start
