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
import threading

import numba
import numpy as np


@numba.njit(nogil=True, cache=True, inline='always')
def pack_stack4(frames, rows, target):
  """target[p] packs frames[rows[0..3], p] as 4 bytes, little-endian.

  Compiled code may call this (frame_sources does); it checks no bounds.
  """
  f0 = frames[rows[0]]
  f1 = frames[rows[1]]
  f2 = frames[rows[2]]
  f3 = frames[rows[3]]
  for p in range(frames.shape[1]):
    target[p] = (
      np.uint32(f0[p])
      | (np.uint32(f1[p]) << 8)
      | (np.uint32(f2[p]) << 16)
      | (np.uint32(f3[p]) << 24)
    )


@numba.njit(nogil=True, cache=True)
def _gather_uint8_stack4(frames, rows, destinations, out):
  for b in range(rows.shape[0]):
    pack_stack4(frames, rows[b], out[destinations[b]])


@numba.njit(nogil=True, cache=True)
def _gather_pairs_uint8_stack4(
  frames, rows, next_rows, destinations, out, next_out
):
  # State and next state one transition at a time: their frames mostly
  # overlap, so the second stack reads frames still in cache.
  for b in range(rows.shape[0]):
    pack_stack4(frames, rows[b], out[destinations[b]])
    pack_stack4(frames, next_rows[b], next_out[destinations[b]])


@numba.njit(nogil=True, cache=True)
def _gather_any(frames, rows, destinations, out):
  """out[d, p, k] = frames[rows[b, k], p] for any dtype and stack size."""
  for b in range(rows.shape[0]):
    target = out[destinations[b]]
    for k in range(rows.shape[1]):
      frame = frames[rows[b, k]]
      for p in range(frames.shape[1]):
        target[p, k] = frame[p]


def _check_bounds(frames, rows, out, destinations):
  # The kernels do no bounds checks; a bad row must not become a segfault.
  if rows.size and (rows.min() < 0 or rows.max() >= len(frames)):
    raise IndexError(f'frame rows outside [0, {len(frames)})')
  if destinations.size and (
    destinations.min() < 0 or destinations.max() >= len(out)
  ):
    raise IndexError(f'batch positions outside [0, {len(out)})')


def packable(dtype: np.dtype, stack_size: int) -> bool:
  """Whether stacks of `dtype` frames pack into uint32s (pack_stack4)."""
  return dtype == np.uint8 and stack_size == 4 and sys.byteorder == 'little'


def gather_state_pairs(frames, rows, next_rows, out, next_out, destinations):
  """Writes states and next states in one pass (see gather_stacks).

  Args:
    frames: array (num_rows, *observation_shape), C-contiguous.
    rows: int array (b, stack_size), frame rows of each state.
    next_rows: int array (b, stack_size), frame rows of each next state.
    out: array (batch, *observation_shape, stack_size) for the states.
    next_out: same shape, for the next states.
    destinations: int array (b,), positions in `out` and `next_out`.
  """
  rows = np.ascontiguousarray(rows, dtype=np.int64)
  next_rows = np.ascontiguousarray(next_rows, dtype=np.int64)
  destinations = np.ascontiguousarray(destinations, dtype=np.int64)
  _check_bounds(frames, rows, out, destinations)
  _check_bounds(frames, next_rows, next_out, destinations)
  if not packable(frames.dtype, rows.shape[1]):
    gather_stacks(frames, rows, out, destinations)
    gather_stacks(frames, next_rows, next_out, destinations)
    return
  _gather_pairs_uint8_stack4(
    frames.reshape(len(frames), -1),
    rows,
    next_rows,
    destinations,
    out.reshape(len(out), -1).view(np.uint32),
    next_out.reshape(len(next_out), -1).view(np.uint32),
  )


def gather_stacks(frames, rows, out, destinations):
  """Writes frame stacks into `out` in Dopamine's layout.

  Args:
    frames: array (num_rows, *observation_shape), C-contiguous.
    rows: int array (b, stack_size), frame rows of each stack, oldest first.
    out: array (batch, *observation_shape, stack_size), C-contiguous; rows
      `destinations` are written.
    destinations: int array (b,), positions in `out`.
  """
  rows = np.ascontiguousarray(rows, dtype=np.int64)
  destinations = np.ascontiguousarray(destinations, dtype=np.int64)
  _check_bounds(frames, rows, out, destinations)
  flat_frames = frames.reshape(len(frames), -1)
  stack_size = rows.shape[1]
  if packable(frames.dtype, stack_size):
    packed = out.reshape(len(out), -1).view(np.uint32)
    _gather_uint8_stack4(flat_frames, rows, destinations, packed)
  else:
    _gather_any(
      flat_frames, rows, destinations, out.reshape(len(out), -1, stack_size)
    )


_warm_up_lock = threading.Lock()
_warm_up_thread = None


def _load_kernels():
  # Calls each kernel once with the argument types the buffers pass (uint8
  # frames, int64 rows, C-contiguous), so numba loads those specializations
  # from its cache (or compiles them) now rather than on the first batch.
  frames = np.zeros((4, 2), np.uint8)
  rows = np.zeros((1, 4), np.int64)
  destinations = np.zeros(1, np.int64)
  packed = np.zeros((1, 2), np.uint32)
  _gather_uint8_stack4(frames, rows, destinations, packed)
  _gather_pairs_uint8_stack4(
    frames, rows, rows, destinations, packed, packed.copy()
  )


def warm_up_in_background() -> None:
  """Loads the stacking kernels in a daemon thread, once per process.

  Loading numba's cached machine code takes about 0.4 s of Python work; a
  buffer starts this before it inflates its first windows (zlib-ng and isal
  inflate without the GIL), so the load overlaps the inflate instead of
  delaying the first batch. A batch that comes first simply waits for it.
  """
  global _warm_up_thread
  with _warm_up_lock:
    if _warm_up_thread is None:
      _warm_up_thread = threading.Thread(
        target=_load_kernels, name='fixed_replay-stacking-warm-up', daemon=True
      )
      _warm_up_thread.start()
