"""Gathers frame stacks straight into Dopamine's layout (stack axis last).

Dopamine returns states as (batch, 84, 84, stack): for each pixel, the
`stack` frames sit next to each other. Fancy indexing gives (batch, stack, 84,
84) quickly, but moving the stack axis last is a byte-wise transpose that
numpy does slowly. These compiled kernels read the `stack` source frames of a
state once and write each pixel's stack in a single pass. For the common case
(uint8 frames, stack of 4, little-endian) each output pixel is one uint32
store, which runs as fast as the plain gather.
"""

import sys

import numba
import numpy as np


@numba.njit(nogil=True, cache=True)
def _gather_uint8_stack4(frames, rows, destinations, out):
  """out[d, p] packs frames[rows[b, 0..3], p] as 4 bytes, little-endian."""
  for b in range(rows.shape[0]):
    f0 = frames[rows[b, 0]]
    f1 = frames[rows[b, 1]]
    f2 = frames[rows[b, 2]]
    f3 = frames[rows[b, 3]]
    target = out[destinations[b]]
    for p in range(frames.shape[1]):
      target[p] = (
        np.uint32(f0[p])
        | (np.uint32(f1[p]) << 8)
        | (np.uint32(f2[p]) << 16)
        | (np.uint32(f3[p]) << 24)
      )


@numba.njit(nogil=True, cache=True)
def _gather_any(frames, rows, destinations, out):
  """out[d, p, k] = frames[rows[b, k], p] for any dtype and stack size."""
  for b in range(rows.shape[0]):
    target = out[destinations[b]]
    for k in range(rows.shape[1]):
      frame = frames[rows[b, k]]
      for p in range(frames.shape[1]):
        target[p, k] = frame[p]


def gather_stacks(frames, rows, out, destinations):
  """Writes frame stacks into `out` in Dopamine's layout.

  Args:
    frames: array (num_rows, *observation_shape), C-contiguous.
    rows: int array (b, stack_size), frame rows of each stack, oldest first.
    out: array (batch, *observation_shape, stack_size), C-contiguous; rows
      `destinations` are written.
    destinations: int array (b,), positions in `out`.
  """
  stack_size = rows.shape[1]
  # The kernels do no bounds checks; a bad row must not become a segfault.
  if rows.size and (rows.min() < 0 or rows.max() >= len(frames)):
    raise IndexError(f'frame rows outside [0, {len(frames)})')
  if destinations.size and (
    destinations.min() < 0 or destinations.max() >= len(out)
  ):
    raise IndexError(f'batch positions outside [0, {len(out)})')
  flat_frames = frames.reshape(len(frames), -1)
  rows = np.ascontiguousarray(rows, dtype=np.int64)
  destinations = np.ascontiguousarray(destinations, dtype=np.int64)
  if frames.dtype == np.uint8 and stack_size == 4 and sys.byteorder == 'little':
    packed = out.reshape(len(out), -1).view(np.uint32)
    _gather_uint8_stack4(flat_frames, rows, destinations, packed)
  else:
    _gather_any(
      flat_frames, rows, destinations, out.reshape(len(out), -1, stack_size)
    )
