"""Opening the selected checkpoints of a compact store as one BlockFrames.

Plans each checkpoint's window (replay_capacity rows from
replay_transitions_start_index, subsampled), checks the whole selection
against the memory budget before reading anything, then maps the small
arrays (action, reward, terminal: a byte or two a row) of every window
where they lie and takes the valid rows (a bit a row in the store for whole
files, drawn from where it lies; else an int32 table).
"""

import os

from absl import logging
import numpy as np

from fixed_replay import progress
from fixed_replay.errors import CheckpointError
from fixed_replay.io import mapped
from fixed_replay.io import npy_stream
from fixed_replay.io import spill
from fixed_replay.replay import block_checks
from fixed_replay.replay import checkpoint_loading
from fixed_replay.replay import frame_sources
from fixed_replay.replay import replay_shard
from fixed_replay.replay import transitions
from fixed_replay.replay import valid_rows
from fixed_replay.sources.dopamine import checks
from fixed_replay.sources.dopamine import subsample as subsample_lib
from fixed_replay.sources.dopamine import validity
from fixed_replay.store import compact_store
from fixed_replay.store import manifest as manifest_lib


def check_matches(
  stored: compact_store.StoredCheckpoint,
  observation_shape: tuple,
  observation_dtype: np.dtype,
) -> None:
  """Raises CheckpointError unless the frames are those asked for."""
  frames = stored.frames
  if frames.row_shape != observation_shape:
    raise CheckpointError(
      frames.path,
      f'frames of shape {frames.row_shape}, expected {observation_shape}',
    )
  if frames.dtype != observation_dtype:
    raise CheckpointError(
      frames.path,
      f'frames of dtype {frames.dtype}, expected {observation_dtype}',
    )


def check_selection(
  directories: dict, settings: checkpoint_loading.WindowSettings
) -> dict[str, dict]:
  """Raises CheckpointError unless every checkpoint holds what is asked for.

  Reads only the manifests, so a store sampled a few checkpoints at a time
  is checked whole before anything is sampled: the extra storage elements,
  the stack_size a store made from episodes was padded for, and the shape
  and dtype of the frames and arrays, alike in every checkpoint
  (observation_spec checked the first against the configuration).

  Args:
    directories: dict of suffix to the selected checkpoints' directories.
    settings: checkpoint_loading.WindowSettings of the buffer.

  Returns:
    dict of directory to its manifest, for open_store (read once).

  Raises:
    CheckpointError: naming the first checkpoint that differs from most
      others or from the configuration, and both values.
  """
  s = settings.arguments
  compared = ('observation', 'action', 'reward', 'terminal')
  compared += settings.extra_names
  manifests = {}
  for suffix, directory in sorted(directories.items()):
    manifest = manifests[suffix] = manifest_lib.read_manifest(directory)
    stored_stack = manifest['valid_rows']['stack_size']
    # Rows made from episodes (RL Unplugged) hold stack_size - 1 padding
    # rows per episode: another stack would sample them as states. Rows
    # of Dopamine's files are the logger's; only their table is redone.
    if stored_stack != s.stack_size and 'episodes' in manifest['source']:
      raise CheckpointError(
        directory,
        f'converted from episodes for stack_size={stored_stack}, but the '
        f'buffer has stack_size={s.stack_size}: bind the same, or convert '
        f'again with --stack_size={s.stack_size}',
      )
    checkpoint_loading.check_extra_elements(
      os.path.join(directory, manifest_lib.MANIFEST),
      suffix,
      manifest['arrays'],
      settings.extra_names,
    )
  # One rule with Dopamine's directories: what most checkpoints hold.
  errors = checks.same_layout(
    {n: dict.fromkeys(compared, directories[n]) for n in manifests},
    {n: _layout(manifest, compared) for n, manifest in manifests.items()},
  )
  if errors:
    raise errors[0]
  return {directories[n]: manifest for n, manifest in manifests.items()}


def _layout(manifest, names):
  """{name: (row_shape, dtype)} of a stored checkpoint's frames and arrays."""
  specs = dict(manifest['arrays'], observation=manifest['observation'])
  return {
    n: (tuple(specs[n]['row_shape']), np.dtype(specs[n]['dtype']))
    for n in names
  }


def open_store(
  directories: list[str],
  settings: checkpoint_loading.WindowSettings,
  budget: int,
  manifests: dict[str, dict],
) -> frame_sources.BlockFrames:
  """Opens the checkpoints in `directories` as one BlockFrames.

  Args:
    directories: list of the selected checkpoints' directories.
    settings: checkpoint_loading.WindowSettings.
    budget: int, bytes the buffer may hold.
    manifests: dict of directory to manifest, from check_selection.

  Returns:
    frame_sources.BlockFrames; its files are closed again if opening fails.

  Raises:
    CheckpointError, MemoryError, ValueError: see open_windows.
  """
  s = settings.arguments
  mapped.reserve_descriptors(len(directories))  # One a checkpoint's units.
  stored = []
  try:
    windows = []
    for directory in directories:
      stored.append(
        compact_store.StoredCheckpoint(
          directory,
          elements=settings.extra_names,
          manifest=manifests[directory],
        )
      )
      check_matches(stored[-1], s.observation_shape, s.observation_dtype)
      windows.append(
        checkpoint_loading.plan_rows(
          settings, stored[-1].num_rows, stored[-1].suffix
        )
      )
    source = open_windows(settings, stored, windows, budget)
    spill.release_freed_memory()  # The temporaries of open_windows.
    return source
  except BaseException:
    for checkpoint in stored:
      checkpoint.close()
    raise


def _window_arrays(stored, windows, names):
  """Each window's small arrays: views of the store's files, mapped, their
  blocks checked as batches read them (block_checks.BatchChecks) or whole
  (_valid_rows)."""
  return [
    {
      name: checkpoint.arrays.unchecked(name)[start : start + count]
      for name in names
    }
    for checkpoint, (start, count) in zip(stored, windows, strict=True)
  ]


def _fixed_bytes(stored, windows):
  """Bytes of the valid-row tables and unit indexes."""
  total = 0
  for checkpoint, (_, count) in zip(stored, windows, strict=True):
    total += count * np.dtype(np.int32).itemsize + checkpoint.frames.nbytes
  return total


def open_windows(
  settings: checkpoint_loading.WindowSettings,
  stored: list,
  windows: list[tuple[int, int]],
  budget: int,
) -> frame_sources.BlockFrames:
  """Builds the BlockFrames of `stored` checkpoints' `windows`.

  Args:
    settings: checkpoint_loading.WindowSettings.
    stored: list of compact_store.StoredCheckpoint, matching the request.
    windows: list of (start, count), one per checkpoint.
    budget: int, bytes the buffer may hold.

  Returns:
    frame_sources.BlockFrames.

  Raises:
    CheckpointError: if the checkpoints are stored unlike each other.
    MemoryError: if the selection does not fit in `budget`.
    ValueError: if no window holds a valid transition.
  """
  s = settings.arguments
  names = ['action', 'reward', 'terminal'] + list(settings.extra_names)
  block_rows = {c.frames.block_rows for c in stored}
  if len(block_rows) != 1:  # check_selection compared the rest.
    raise CheckpointError(
      s.data_dir,
      f'checkpoints stored with different block sizes {sorted(block_rows)}',
    )
  block_rows = block_rows.pop()
  frame_bytes = npy_stream.row_bytes(s.observation_shape, s.observation_dtype)
  workers = settings.sampling_threads
  # Each sampling thread (and the caller) decodes a batch's units into a
  # scratch of its own (frame_sources.BlockFrames._scratch).
  scratch = s.batch_size * block_rows * frame_bytes
  scratch *= frame_sources.units_per_transition(
    block_rows, s.stack_size, s.update_horizon
  )
  fixed = (
    _fixed_bytes(stored, windows)
    + (settings.ready_batches + workers) * settings.batch_bytes
    + (workers + 1) * scratch
  )
  what = (
    f'{len(stored)} checkpoint(s) of {s.data_dir} '
    f'({sum(c for _, c in windows):,} rows)'
  )
  checkpoint_loading.check_fits(fixed, budget, what)
  arrays = _window_arrays(stored, windows, names)
  views = [
    stored_checkpoint.window(start, count, arrays=mine)
    for stored_checkpoint, (start, count), mine in zip(
      stored, windows, arrays, strict=True
    )
  ]
  valid = [
    _valid_rows(c, w, s, names) for c, w in zip(stored, views, strict=True)
  ]
  table = valid_rows.ValidRowTable.concatenate(
    [c.suffix for c in stored], valid, dtype=np.int32
  )
  if not table.total:
    raise ValueError(
      f'{what} hold no valid transition for stack_size='
      f'{s.stack_size}, update_horizon={s.update_horizon}'
    )
  shards = [
    replay_shard.ReplayShard(
      window,
      s.stack_size,
      s.update_horizon,
      s.gamma,
      valid_rows=rows,
    )
    for window, rows in zip(views, table.valid_rows, strict=True)
  ]
  assembler = transitions.TransitionAssembler(
    arrays,
    transitions.RowLayout(views),
    s.stack_size,
    s.update_horizon,
    s.gamma,
    reward_dtype=stored[0].arrays.row_type('reward')[0],
  )
  logging.info(
    'Sampling %s of the store: %d valid transitions; %s indexed and '
    'batches, budget %s',
    what,
    table.total,
    progress.format_bytes(fixed),
    progress.format_bytes(budget),
  )
  checks = block_checks.BatchChecks(
    stored, names, s.stack_size + s.update_horizon
  )
  return frame_sources.BlockFrames(
    stored, shards, table, assembler, checks, fixed + checks.nbytes
  )


def _valid_rows(stored, window, s, names):
  """The window's valid rows: the store's mask for a whole file, as it lies
  (valid_rows.MaskedRows), unless episodes are subsampled. Computed from
  the window's rows, those are checked whole first (`names`)."""
  stack_size, horizon = s.stack_size, s.update_horizon
  rows = None
  if (window.start, window.num_rows) == (0, stored.num_rows):
    mask = stored.valid_rows_mask(stack_size, horizon)
    if mask is not None:
      rows = valid_rows.MaskedRows(mask, stored.num_rows)
  if rows is None or s.subsample in subsample_lib.EPISODE_METHODS:
    for name in names:
      stored.tables.check_range(
        name, window.start, window.start + window.num_rows
      )
  if rows is None:
    rows = validity.window_valid_rows(window, stack_size, horizon)
  if s.subsample in subsample_lib.EPISODE_METHODS:
    rows = subsample_lib.keep_rows(
      np.asarray(rows),
      window,
      s.subsample,
      s.subsample_fraction,
      subsample_lib.episode_rng(s.subsample_seed, stored.suffix),
    )
  checkpoint_loading.warn_no_valid(
    stored.suffix, window.start, window.num_rows, len(rows)
  )
  return rows
