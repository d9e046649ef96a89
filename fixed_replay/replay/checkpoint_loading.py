"""Planning checkpoint windows, and reading Dopamine's gzip files into them.

`WindowSettings` is what every source's windows are planned and read with;
`plan_rows` is the one window plan (for gzip files and stores alike), and
the memory estimates and budget checks made before anything is allocated
live here too. A `WindowLoader` decides, once per checkpoint, which rows
to read (the window [replay_transitions_start_index, + replay_capacity),
cut by `subsample`), says what holding them costs before anything is read, and
reads them by streaming. With `verify` a window reaches the samplers only
after every one of its files passed its gzip CRC-32 and length check.
"""

from collections.abc import Collection
from collections.abc import Sequence
import concurrent.futures
import dataclasses
import os
import time

from absl import logging
import numpy as np
import psutil

from fixed_replay import progress
from fixed_replay.errors import CheckpointError
from fixed_replay.progress import format_bytes
from fixed_replay.replay import buffer_arguments
from fixed_replay.replay import replay_shard
from fixed_replay.sources.dopamine import checkpoints
from fixed_replay.sources.dopamine import file_names
from fixed_replay.sources.dopamine import subsample as subsample_lib
from fixed_replay.sources.dopamine import validity

_SMALL = ['observation', 'action', 'reward', 'terminal']
# Extra elements only conversions of RL Unplugged data hold (for the hint).
_RLU_ELEMENTS = (file_names.UNCLIPPED_REWARD, file_names.EPISODE_IDX)


# Bytes per row beyond the stored arrays: the table of valid rows (int64).
_INDEX_BYTES_PER_ROW = 8


def shard_bytes(
  headers: dict, start: int, count: int | None, elements: list | None = None
) -> tuple[int, int]:
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
  num_rows = checkpoints.window_rows(
    headers['observation'].num_rows, start, count
  )
  names = elements or headers
  row_bytes = sum(headers[name].row_bytes for name in names)
  return num_rows * (row_bytes + _INDEX_BYTES_PER_ROW), num_rows


def plan_rows(
  settings: 'WindowSettings', num_file_rows: int, suffix: int
) -> tuple[int, int]:
  """(start, count): the rows of checkpoint `suffix` a buffer uses.

  The one window plan of every source: replay_capacity rows from
  replay_transitions_start_index, clipped to the file, cut to their first
  rows by subsample='first_rows'. (The episode methods then choose among
  these rows' episodes, which needs their terminal flags.)

  Raises:
    ValueError: if start lies beyond the file, or the fraction keeps nothing.
  """
  s, start = settings.arguments, settings.start
  where = f'checkpoint {suffix} of {s.data_dir}'
  if start >= num_file_rows:
    raise ValueError(
      f'replay_transitions_start_index={start} is beyond the '
      f'{num_file_rows} rows of {where}'
    )
  count = checkpoints.window_rows(num_file_rows, start, s.replay_capacity)
  if s.subsample == 'first_rows':
    count = subsample_lib.first_rows_count(count, s.subsample_fraction, where)
  return start, count


def available_bytes() -> int:
  """Memory the OS can give us now without swapping."""
  return psutil.virtual_memory().available


def check_fits(needed: int, budget: int, what: str) -> None:
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


def warn_no_valid(suffix: int, start: int, count: int, valid: int) -> None:
  """Warns if `valid`, the count of valid rows in [start, +count), is 0."""
  if not valid:
    logging.warning(
      'Checkpoint %d has no valid transition in rows [%d, %d)',
      suffix,
      start,
      start + count,
    )


def check_extra_elements(
  path: str, suffix: int, stored: Collection[str], names: Sequence[str]
) -> None:
  """Raises CheckpointError if a checkpoint lacks an asked-for element.

  Args:
    path: str, the checkpoint's file the error names (where the element
      would be listed or stored).
    suffix: int, the checkpoint.
    stored: names of the elements it holds.
    names: the extra_storage_types' names.
  """
  for name in names:
    if name not in stored:
      hint = ''
      if name in _RLU_ELEMENTS:
        hint = (
          f'; {name} is recorded only by conversions of RL Unplugged data '
          '(`fixed-replay convert` of its shards or TFDS form)'
        )
      raise CheckpointError(
        path,
        f'checkpoint {suffix} has no element {name!r}, which '
        f'extra_storage_types asks for (it holds {sorted(stored)}){hint}',
      )


def check_gzip_extras(files: dict, names: Sequence[str]) -> None:
  """check_extra_elements over Dopamine checkpoints, from their file names.

  Args:
    files: dict of suffix to file_names.CheckpointFiles.
    names: the extra_storage_types' names.
  """
  for suffix, checkpoint in files.items():
    missing = [n for n in names if n not in checkpoint.store_paths]
    if missing:
      check_extra_elements(
        file_names.checkpoint_filename(
          checkpoint.directory, file_names.STORE_PREFIX + missing[0], suffix
        ),
        suffix,
        checkpoint.store_paths,
        names,
      )


@dataclasses.dataclass(frozen=True)
class WindowSettings:
  """What a buffer's checkpoint windows are planned, read and sampled with.

  Built once by the buffer; every source (Dopamine's files, a compact store)
  reads the same settings.

  Attributes:
    arguments: buffer_arguments.BufferArguments, the buffer's checked
      arguments (their data_dir the directory read).
    start: int, replay_transitions_start_index.
    verify: bool, check files (or a store's small files) before use.
    sampling_threads: int, threads that may hold a batch (stores only).
    ready_batches: int, batches those threads keep ready (stores only).
    batch_bytes: int, bytes of one default-size batch (stores only).
  """

  arguments: buffer_arguments.BufferArguments
  start: int
  verify: bool = True
  sampling_threads: int = 0
  ready_batches: int = 0
  batch_bytes: int = 0

  @property
  def extra_names(self) -> tuple[str, ...]:
    """Names of the extra stored elements (extra_storage_types)."""
    return tuple(e.name for e in self.arguments.extra_storage_types)


class WindowLoader:
  """Plans and loads the windows of the selected gzip checkpoints."""

  def __init__(self, files: dict, settings: WindowSettings) -> None:
    """Keeps what planning and loading need.

    Args:
      files: dict of suffix to file_names.CheckpointFiles.
      settings: WindowSettings; with `verify`, every file is checked to its
        end before a window is used.
    """
    self.files = files
    self._settings = settings
    self._extra_names = list(settings.extra_names)
    self._verify = settings.verify
    self._headers = {}
    self._plans = {}
    self._bytes = {}
    self._warned_capacity = False

  def _headers_of(self, suffix):
    """The checkpoint's `$store$_` headers, read once (remote reads cost)."""
    if suffix not in self._headers:
      self._headers[suffix] = checkpoints.read_store_headers(self.files[suffix])
    return self._headers[suffix]

  def _plan(self, suffix):
    """(start, count, kept rows or None) of a checkpoint, decided once.

    The window is replay_capacity rows from replay_transitions_start_index,
    cut to its first rows by subsample='first_rows'; the episode methods
    read the window's terminal flags (not its frames), choose the kept
    episodes and shrink the window to the rows they need.
    """
    if suffix in self._plans:
      return self._plans[suffix]
    s, start = self._settings.arguments, self._settings.start
    files = self.files[suffix]
    num_file_rows = self._headers_of(suffix)['observation'].num_rows
    capacity = s.replay_capacity
    _, count = plan_rows(self._settings, num_file_rows, suffix)
    clipped = checkpoints.window_rows(num_file_rows, start, capacity)
    if clipped < capacity and not self._warned_capacity:
      logging.info(
        'replay_capacity=%d reaches past the %d rows of checkpoint %d: '
        'using rows [%d, %d).',
        capacity,
        num_file_rows,
        suffix,
        start,
        start + clipped,
      )
      self._warned_capacity = True
    plan = (start, count, None)
    if s.subsample in subsample_lib.EPISODE_METHODS:
      plan = subsample_lib.plan_window(
        checkpoints.read_terminal_window(
          files, start, count, verify=self._verify
        ),
        s.stack_size,
        s.update_horizon,
        s.subsample,
        s.subsample_fraction,
        subsample_lib.episode_rng(s.subsample_seed, suffix),
      )
    self._plans[suffix] = plan
    return plan

  def set_bytes(self, suffixes: list[int]) -> int:
    """Bytes needed to hold the given checkpoints' windows."""
    for suffix in suffixes:
      if suffix not in self._bytes:
        start, count, _ = self._plan(suffix)
        self._bytes[suffix], _ = shard_bytes(
          self._headers_of(suffix),
          start,
          count,
          _SMALL + self._extra_names,
        )
    return sum(self._bytes[s] for s in suffixes)

  def load_shard(self, suffix: int) -> replay_shard.ReplayShard:
    """Reads one checkpoint window and wraps it as a ReplayShard."""
    s = self._settings.arguments
    start, count, kept = self._plan(suffix)
    began = time.perf_counter()
    window = checkpoints.read_checkpoint(
      self.files[suffix],
      start,
      count,
      observation_shape=s.observation_shape,
      observation_dtype=s.observation_dtype,
      elements=self._extra_names,
      verify=self._verify,
    )
    # Only now, every file checked, may samplers see these rows.
    valid_rows = validity.window_valid_rows(
      window, s.stack_size, s.update_horizon
    )
    if kept is not None:  # Only the rows of the episodes kept.
      valid_rows = np.intersect1d(valid_rows, kept)
    shard = replay_shard.ReplayShard(
      window, s.stack_size, s.update_horizon, s.gamma, valid_rows
    )
    logging.info(
      'Loaded checkpoint %d of %s rows [%d, %d): %d valid transitions, %s '
      'in %.1f s (%s)',
      suffix,
      self._settings.arguments.data_dir,
      start,
      start + count,
      shard.num_valid,
      format_bytes(shard.nbytes),
      time.perf_counter() - began,
      'files checked to their end'
      if self._verify
      else 'verify_checksums=False: files not checked past the window',
    )
    warn_no_valid(suffix, start, count, shard.num_valid)
    return shard

  def load_shards(
    self, suffixes: list[int], parallel: bool = False, reuse=()
  ) -> list[replay_shard.ReplayShard]:
    """Loads checkpoints (reusing already loaded shards), with progress."""
    reusable = {s.suffix: s for s in reuse}
    to_load = [s for s in suffixes if s not in reusable]
    logging.info(
      'Loading checkpoints %s from %s (reusing %s)',
      to_load,
      self._settings.arguments.data_dir,
      sorted(set(suffixes) & set(reusable)),
    )
    workers = min(len(to_load), os.cpu_count() or 1) if parallel else 1
    with progress.bar(
      total=len(to_load), unit='ckpt', desc='loading checkpoints'
    ) as bar:
      if workers > 1:
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
          loaded = list(pool.map(self.load_shard, to_load))
          bar.update(len(to_load))
      else:
        loaded = []
        for suffix in to_load:
          loaded.append(self.load_shard(suffix))
          bar.update(1)
    reusable.update({s.suffix: s for s in loaded})
    return [reusable[s] for s in suffixes]
