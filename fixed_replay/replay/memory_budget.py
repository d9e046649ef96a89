"""Memory estimates and budget checks, made before anything is allocated."""

import numpy as np
import psutil

from fixed_replay.progress import format_bytes

# Bytes per row beyond the stored arrays: the table of valid rows (int64).
_INDEX_BYTES_PER_ROW = 8


def shard_bytes(headers, start, count, elements=None):
  """Returns the bytes a shard of rows [start, start + count) will hold.

  Args:
    headers: dict of store element name to npy_stream.ArrayHeader (see
      checkpoints.read_store_headers).
    start: int, first row (clipped to the file like the loader does).
    count: int or None, rows wanted (None: to the end of the file).
    elements: optional store element names to count (default: all).

  Returns:
    (num_bytes, num_rows): the estimate and the window's row count.
  """
  num_rows = window_rows(headers['observation'].num_rows, start, count)
  names = elements or headers
  row_bytes = sum(headers[name].row_bytes for name in names)
  return num_rows * (row_bytes + _INDEX_BYTES_PER_ROW), num_rows


def window_rows(num_file_rows, start, count):
  """Rows of [start, start + count) that lie inside a file of given rows."""
  end = num_file_rows if count is None else min(start + count, num_file_rows)
  return max(end - start, 0)


def available_bytes():
  """Memory the OS can give us now without swapping."""
  return psutil.virtual_memory().available


def check_fits(needed, budget, what):
  """Raises MemoryError with the numbers when `needed` exceeds `budget`.

  Args:
    needed: int, bytes the configuration needs.
    budget: int, bytes allowed.
    what: str, description of the configuration, for the message.
  """
  if needed > budget:
    raise MemoryError(
      f'{what} needs {format_bytes(needed)} but only '
      f'{format_bytes(budget)} is allowed (memory_budget, or the memory '
      f'available now). Lower num_buffers_to_load or replay_capacity, or '
      f'raise memory_budget.'
    )


def total(values):
  return int(np.sum(values, dtype=np.int64))
