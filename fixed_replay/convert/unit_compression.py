"""Compressing frames into the store's units: zstd's parameters and header.

The writer's half of store/frame_units.py: a unit is a zstd frame of
`block_rows` frames against the run's dictionary, written without content
size, checksum, dictionary id or its first 6 bytes, which every unit shares
and the reader puts back (store/unit_decoding.py).
"""

import numpy as np
import zstandard

# Units are written without the 6 bytes they all begin with: zstd's magic
# number, the frame header descriptor and the window
# descriptor. On busy Atari frames, about 160 bytes a unit, that is 4% of
# the store; on Breakout's 64, 9%. Compressed as of unknown size, every unit
# declares the level's window, so they are the same in every unit (a known
# size would shrink the window of a short last unit). The manifest keeps the
# 2 header bytes (`unit_header`, as a little-endian int) and the decoder
# puts all 6 back (unit_decoding.py); zstd's own tools would need them put
# back too.
_FORMAT = zstandard.FORMAT_ZSTD1_MAGICLESS


def zstd_level(clevel: int) -> int:
  """The zstd level of a store's clevel (0-9): 3 x clevel, at most 19.

  The default clevel 5 is zstd 15, with the parser of `unit_parameters`.
  """
  return min(max(1, 3 * clevel), 19)


# From zstd 15 (clevel 5) up, units are compressed with zstd's optimal
# parser (btopt, or the level's own if stronger), matches from 3 bytes, and
# the search going on until a match of 256 bytes. A one-frame unit is mostly
# long copies from the dictionary; level 15's lazy parser stops at 32 bytes.
# Converting the benchmark's checkpoints (2026-12-02, all the store's files
# against Dopamine's gzip; Seaquest, MsPacman, Asterix, Breakout):
#   zstd 15 as is:  1.28x, 1.19x, 1.08x, 1.58x at 12,100-20,400 frames/CPU-s;
#   this parser:    1.22x, 1.12x, 1.02x, 1.50x at 2,500-11,300.
# On every 40th frame, zstd 19 stores 1% less at half this parser's speed,
# and zstd 16-18 as they are store more than zstd 15. Decoding takes the
# same 1.0-1.8 us a frame with all of them.
_OPTIMAL_FROM_LEVEL = 15
_MIN_MATCH = 3
_TARGET_LENGTH = 256
_SEARCH_LOG = 6


def unit_parameters(level: int) -> zstandard.ZstdCompressionParameters:
  """zstd's parameters for units at `level` (see _OPTIMAL_FROM_LEVEL)."""
  base = zstandard.ZstdCompressionParameters.from_level(level)
  optimal = level >= _OPTIMAL_FROM_LEVEL  # The others are all positive.
  return zstandard.ZstdCompressionParameters(
    window_log=base.window_log,
    chain_log=base.chain_log,
    hash_log=base.hash_log,
    search_log=max(base.search_log, _SEARCH_LOG * optimal),
    min_match=_MIN_MATCH if optimal else base.min_match,
    target_length=max(base.target_length, _TARGET_LENGTH * optimal),
    strategy=max(base.strategy, zstandard.STRATEGY_BTOPT * optimal),
    format=_FORMAT,
    write_content_size=False,
    write_checksum=False,
    write_dict_id=False,
  )


class UnitCompressor:
  """Compresses units against one dictionary; one per thread."""

  def __init__(self, dictionary, level):
    params = unit_parameters(level)
    digested = None
    if dictionary:
      digested = zstandard.ZstdCompressionDict(dictionary)
      digested.precompute_compress(compression_params=params)
    self._compressor = zstandard.ZstdCompressor(
      dict_data=digested, compression_params=params
    )
    # The 2 header bytes every unit begins with (magic number aside).
    self._header = self._whole(b'\0')[:2]
    self.header = int.from_bytes(self._header, 'little')

  def _whole(self, data):
    stream = self._compressor.compressobj(size=-1)  # Size unknown: see above.
    return stream.compress(data) + stream.flush()

  def compress(self, frames):
    """The unit (bytes) of C-contiguous frames, its header bytes stripped."""
    unit = self._whole(np.ascontiguousarray(frames))
    if unit[:2] != self._header:
      raise RuntimeError(
        f'zstd began a unit with {unit[:2].hex()}, not {self._header.hex()}'
      )
    return unit[2:]
