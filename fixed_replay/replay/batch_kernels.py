"""The compiled kernels that assemble a minibatch, outside the GIL.

All of a batch's work beyond drawing its indices runs here, in numba code
that releases the GIL, so a second sampling thread scales:

* frame stacks in Dopamine's layout, stack axis last ((batch, 84, 84, 4)):
  numpy's transpose of a gather is slow byte-wise work, so each state's
  frames are read once and each pixel's stack written in one pass (for
  uint8 stacks of 4, one uint32 store a pixel, as fast as a plain gather);
* `decode_stacks`: a compact store's units a batch needs, each decoded once,
  and the stacks packed from them (frame_sources.BlockFrames);
* `write_parts`: every element but the frames (n-step discounted reward,
  terminal, next action, ...) for transitions.TransitionAssembler;
* `select_set_bits`: the file rows of drawn positions among a store's valid
  rows, kept as a bit a row (valid_rows.MaskedRows).
"""

import os
import sys
import threading

import numba
import numpy as np

from fixed_replay import kernel_cache
from fixed_replay.store import unit_decoding

kernel_cache.install()  # Before the first njit: see kernel_cache.py.


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
  flat_frames, stack_size = frames.reshape(len(frames), -1), rows.shape[1]
  if not packable(frames.dtype, stack_size):  # Checked once, not per call.
    for stack_rows, target in ((rows, out), (next_rows, next_out)):
      target = target.reshape(len(target), -1, stack_size)
      _gather_any(flat_frames, stack_rows, destinations, target)
    return
  _gather_pairs_uint8_stack4(
    flat_frames,
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
  # One call with the types the buffers pass (uint8 frames, int64 rows), so
  # numba loads (or compiles) those specializations now, not on a batch.
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

  Loading numba's cached code takes about 0.4 s; a buffer starts it before
  inflating its first windows (without the GIL), so the two overlap instead
  of delaying the first batch, which would simply wait for it.
  """
  global _warm_up_thread
  with _warm_up_lock:
    if _warm_up_thread is None:
      _warm_up_thread = threading.Thread(
        target=_load_kernels, name='fixed_replay-kernels-warm-up', daemon=True
      )
      _warm_up_thread.start()


def _finish_warm_up_before_fork():
  # The warm-up holds numba's compiler lock while it loads; a child forked
  # then (a DataLoader's worker) would inherit it held and hang on its first
  # compiled call. A fork waits for the warm-up instead (0.4 s at most).
  if _warm_up_thread is not None:
    _warm_up_thread.join()


os.register_at_fork(before=_finish_warm_up_before_fork)


@numba.njit(nogil=True, cache=True)
def decode_stacks(
  functions,
  table,
  context,
  unit_rows,
  which,
  file_row_shift,
  state_rows,
  next_rows,
  frames,
  states,
  next_states,
  destinations,
  units,
  status,
):
  """Decodes the distinct units of a batch's states and packs the stacks.

  The frames at positions state_rows, next_rows (b, stack) of windows
  `which` (file row: position + file_row_shift[window]) lie in units of
  `unit_rows` frames; each unit they need is decoded once, in (checkpoint,
  unit) order (unit_decoding.decode_units reads runs of consecutive units
  at once), into `frames`, scratch rows of one frame's bytes: unit k fills
  rows [k * unit_rows, (k + 1) * unit_rows). states[d] and next_states[d]
  (uint32 pixels, 4 frames each), d = destinations[b] (checked by the
  caller), are then packed from them. units[0], units[1] get the decoded
  units' table rows and unit numbers, status[4] their count (-1: a table
  row or file row out of range, -2: `frames` too small), status[:4] the
  decoder's status.
  """
  batch, stack = state_rows.shape
  frame_bytes = frames.shape[1]
  # Rows of each checkpoint, from its units; keys are (checkpoint, row).
  sources = table.shape[0]
  num_rows = np.empty(sources, np.int64)
  for s in range(sources):
    if table[s, unit_decoding.UNIT_BYTES] != unit_rows * frame_bytes:
      status[1], status[4] = unit_decoding.NO_SUCH_UNIT, -1
      return
    num_rows[s] = (table[s, unit_decoding.NUM_UNITS] - 1) * unit_rows + (
      table[s, unit_decoding.LAST_BYTES] // frame_bytes
    )
  stride = num_rows.max() + 1
  keys = np.empty(2 * batch * stack, np.int64)
  for b in range(batch):
    source = which[b]
    if not 0 <= source < sources:
      status[1], status[4] = unit_decoding.NO_SUCH_UNIT, -1
      return
    shift = file_row_shift[source]
    for k in range(stack):
      row, next_row = state_rows[b, k] + shift, next_rows[b, k] + shift
      if not (0 <= row < num_rows[source] and 0 <= next_row < num_rows[source]):
        status[1], status[4] = unit_decoding.NO_SUCH_UNIT, -1
        return
      keys[b * stack + k] = source * stride + row
      keys[(batch + b) * stack + k] = source * stride + next_row
  order = np.argsort(keys)
  slots = np.empty(keys.size, np.int64)
  count = 0
  for m in range(keys.size):
    key = keys[order[m]]
    source, row = key // stride, key % stride
    unit = row // unit_rows
    if (
      count == 0 or source != units[0, count - 1] or unit != units[1, count - 1]
    ):
      if (count + 1) * unit_rows > frames.shape[0]:
        status[4] = -2
        return
      units[0, count] = source
      units[1, count] = unit
      count += 1
    slots[order[m]] = (count - 1) * unit_rows + row % unit_rows
  status[4] = count
  unit_decoding.decode_units(
    functions,
    table,
    units[0, :count],
    units[1, :count],
    np.int64(frames.ctypes.data),
    unit_rows * frame_bytes,
    np.empty(0, np.int64),
    context,
    status,
  )
  if status[1] != unit_decoding.OK:
    return
  slots = slots.reshape(2 * batch, stack)
  for b in range(batch):
    pack_stack4(frames, slots[b], states[destinations[b]])
    pack_stack4(frames, slots[batch + b], next_states[destinations[b]])


# Columns of transitions.RowLayout.table, one row per window.
OFFSET, START, FILE_ROWS, CIRCULAR, ROWS = range(5)
# Columns of a table of the windows' terminal, reward and action arrays, one
# row a window: where its first row is, and its dtype's place in KINDS. An
# array mapped from a store keeps the narrow dtype it was stored in.
TERMINAL_AT, TERMINAL_KIND, REWARD_AT, REWARD_KIND = range(4)
ACTION_AT, ACTION_KIND = range(4, 6)
KINDS = tuple(map(np.dtype, '? u1 i1 u2 i2 u4 i4 i8 f4 f8'.split()))


_U1, _I1, _U2, _I2, _U4, _I4, _I8, _F4, _F8 = (
  unit_decoding.loader(numba.from_dtype(kind)) for kind in KINDS[1:]
)


@numba.njit(nogil=True, cache=True, inline='always')
def _copy(address, kind, index, out, at):
  """out[at] = element `index` of an array of kind `kind` (KINDS), read in
  its own type and cast as numpy casts: exact."""
  if kind <= 1:
    out[at] = _U1(address + index)
  elif kind == 2:
    out[at] = _I1(address + index)
  elif kind == 3:
    out[at] = _U2(address + 2 * index)
  elif kind == 4:
    out[at] = _I2(address + 2 * index)
  elif kind == 5:
    out[at] = _U4(address + 4 * index)
  elif kind == 6:
    out[at] = _I4(address + 4 * index)
  elif kind == 7:
    out[at] = _I8(address + 8 * index)
  elif kind == 8:
    out[at] = _F4(address + 4 * index)
  else:
    out[at] = _F8(address + 8 * index)


@numba.njit(nogil=True, cache=True)
def _pairwise_sum(values):
  """numpy's float sum of a 1-D array, in its order (pairwise, 8 lanes).

  np.sum adds blocks of up to 128 with 8 accumulators and splits larger
  ones in two; the same order gives Dopamine's n-step returns bit for bit.
  (numpy also adds the result to +0.0, which only turns -0.0 into +0.0:
  the caller does that.)
  """
  n = values.size
  if n < 8:
    total = values[0]
    for i in range(1, n):
      total += values[i]
    return total
  if n <= 128:
    lanes = values[:8].copy()
    i = 8
    while i < n - n % 8:
      for j in range(8):
        lanes[j] += values[i + j]
      i += 8
    total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + (
      (lanes[4] + lanes[5]) + (lanes[6] + lanes[7])
    )
    for k in range(i, n):
      total += values[k]
    return total
  half = n // 2
  half -= half % 8
  return _pairwise_sum(values[:half]) + _pairwise_sum(values[half:])


@numba.njit(nogil=True, cache=True, inline='always')
def _local(table, window, file_row):
  """The row within `window` of `file_row` (RowLayout); -1 if outside."""
  if table[window, CIRCULAR]:
    local = file_row % table[window, FILE_ROWS]
  else:
    local = file_row - table[window, START]
  return local if 0 <= local < table[window, ROWS] else -1


@numba.njit(nogil=True, cache=True)
def write_parts(
  table,
  suffixes,
  columns,
  discounts,
  reward,
  which,
  file_rows,
  destinations,
  out_reward,
  out_action,
  out_next_action,
  out_next_reward,
  out_terminal,
  out_indices,
  out_suffix,
  rows,
  state_rows,
  next_state_rows,
):
  """TransitionAssembler.write_parts for one batch; False if a row is outside.

  The windows' arrays are read through `columns` (a row a window: see
  TERMINAL_AT); `reward` is one value of the data's reward dtype, each
  reward's type before the n-step sum, as in Dopamine's arrays; reward,
  action and their outputs are 2-D (rows, values per row). rows, state_rows
  and next_state_rows get positions in arrays holding the windows end to
  end (RowLayout).
  """
  horizon = discounts.size
  stack = state_rows.shape[1]
  rewards, actions = out_reward.shape[1], out_action.shape[1]
  reward = reward.copy()  # This call's own: threads write at once.
  products = discounts * reward[0]  # The type of Dopamine's products.
  terminal = np.zeros(1, np.float64)
  trajectory = np.empty(horizon, np.int64)
  for b in range(file_rows.size):
    window, file_row = which[b], file_rows[b]
    if not 0 <= window < table.shape[0]:
      return False
    column = columns[window]
    for k in range(horizon):
      trajectory[k] = _local(table, window, file_row + k)
      if trajectory[k] < 0:
        return False
    # Dopamine's trajectory stops after its first terminal.
    length, is_terminal = horizon, False
    for k in range(horizon):
      _copy(
        column[TERMINAL_AT], column[TERMINAL_KIND], trajectory[k], terminal, 0
      )
      if terminal[0]:
        length, is_terminal = k + 1, True
        break
    next_file_row = file_row + length
    offset = table[window, OFFSET]
    row = trajectory[0]
    next_row = _local(table, window, next_file_row)
    for k in range(stack):
      shift = k - stack + 1
      state = _local(table, window, file_row + shift)
      next_state = _local(table, window, next_file_row + shift)
      if state < 0 or next_state < 0:
        return False
      state_rows[b, k] = state + offset
      next_state_rows[b, k] = next_state + offset
    d = destinations[b]
    at, kind = column[REWARD_AT], column[REWARD_KIND]
    for j in range(rewards):
      for k in range(length):
        _copy(at, kind, trajectory[k] * rewards + j, reward, 0)
        products[k] = discounts[k] * reward[0]
      out_reward[d, j] = _pairwise_sum(products[:length]) + 0.0
      _copy(at, kind, next_row * rewards + j, out_next_reward[d], j)
    at, kind = column[ACTION_AT], column[ACTION_KIND]
    for j in range(actions):
      _copy(at, kind, row * actions + j, out_action[d], j)
      _copy(at, kind, next_row * actions + j, out_next_action[d], j)
    out_terminal[d] = is_terminal
    out_indices[d] = file_row
    out_suffix[d] = suffixes[window]
    rows[b] = row + offset
  return True


# Set bits of each byte value.
POPCOUNT = np.array([bin(value).count('1') for value in range(256)], np.uint8)


@numba.njit(nogil=True, cache=True)
def select_set_bits(
  masks, first_block, block_starts, block_bytes, which, offsets, out
):
  """out[i]: the offsets[i]-th set bit of mask which[i] (0 first).

  masks[w] is the address of a bit mask (little bit order); its blocks of
  `block_bytes` bytes have block_starts[first_block[w]:first_block[w + 1]]
  set bits before each. Offsets must lie below each mask's set bits (the
  caller checks): a search within one block, then at most block_bytes bytes.
  """
  for i in range(offsets.size):
    w, k = which[i], offsets[i]
    starts = block_starts[first_block[w] : first_block[w + 1]]
    block = np.searchsorted(starts, k, side='right') - 1
    k -= starts[block]
    at = block * block_bytes
    bits = _U1(masks[w] + at)
    while k >= POPCOUNT[bits]:
      k -= POPCOUNT[bits]
      at += 1
      bits = _U1(masks[w] + at)
    for bit in range(8):
      if bits >> bit & 1:
        if k == 0:
          out[i] = at * 8 + bit
          break
        k -= 1
