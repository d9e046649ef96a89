"""Summarises (and verifies) a compact store, like `inspect` does gzip runs.

For every checkpoint_<N>/ directory: rows, add_count, cursor, valid rows,
complete episodes and their returns (and game-score returns, where the
store keeps `unclipped_reward`), frame shape, bytes on disk and
uncompressed, from the manifest and the small arrays only (seconds for a
run). `verify=True` also checks the size and CRC-32 of every file the
manifest lists, decodes every frame block against its CRC-32 and the CRC-32
of all frames against the one taken from the source, and checks that the
checkpoints of the store share one frame shape and dtype. Each checkpoint's
format version is reported (`inspect` names it in its title); one of an
earlier version is a problem that names the command that upgrades it.
Problems are collected in summaries.DirectorySummary, each naming its file
(and for frames, the unit and rows).
"""

import os

import numpy as np

from fixed_replay.errors import CheckpointError
from fixed_replay.io import npy_stream
from fixed_replay.sources import layout
from fixed_replay.sources import summaries
from fixed_replay.sources.dopamine import checks
from fixed_replay.sources.dopamine import file_names
from fixed_replay.sources.dopamine import inspection
from fixed_replay.sources.dopamine import validity
from fixed_replay.store import compact_store
from fixed_replay.store import manifest as manifest_lib
from fixed_replay.store import observation_spec


def _valid_count(stored, stack_size: int, update_horizon: int):
  table = stored.valid_rows_table(stack_size, update_horizon)
  if table is not None:
    return len(table)
  terminal = np.asarray(stored.arrays['terminal'])
  return len(
    validity.valid_rows(
      terminal,
      0,
      stored.num_rows,
      stored.add_count,
      stored.invalid_range,
      stored.episode_end_indices,
      stack_size,
      update_horizon,
    )
  )


def _data_bytes(manifest, stored):
  spec = manifest['observation']
  frame_bytes = npy_stream.row_bytes(spec['row_shape'], spec['dtype'])
  return manifest['num_rows'] * (frame_bytes + stored.arrays.row_bytes())


def _compression(manifest):
  """The settings a checkpoint's frames were written with, for a person."""
  spec = manifest['observation']
  shared = spec['run_dictionary']
  return (
    f"{spec['codec']} frame units of {spec['block_rows']}, clevel "
    f"{spec['clevel']}, the run's dictionary of {shared['bytes']:,} bytes, "
    f"CRC-32 {shared['crc32']:#010x}"
  )


def summarize_checkpoint(
  directory: str, stack_size: int, update_horizon: int, verify: bool
) -> summaries.CheckpointSummary:
  """CheckpointSummary of one stored checkpoint; problems never raised."""
  suffix = int(os.path.basename(directory).split('_')[1])
  summary = summaries.CheckpointSummary(suffix=suffix, verified=verify)
  summary.disk_bytes = sum(
    os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory)
  )
  try:
    manifest = manifest_lib.read_manifest(directory, manifest_lib.ALL_VERSIONS)
    if manifest['version'] in manifest_lib.LEGACY_VERSIONS:
      summary.format_version = manifest['version']
      summary.outdated = True
      manifest_lib.read_manifest(directory)  # Names the upgrade's command.
    if verify:
      compact_store.verify_checkpoint(directory, decode=True)
    stored = compact_store.StoredCheckpoint(directory)
  except CheckpointError as error:
    summary.problems.append(summaries.Problem(error.path, error.problem))
    return summary
  try:
    manifest = stored.manifest
    summary.format_version = manifest['version']
    summary.compression = _compression(manifest)
    summary.rows = stored.num_rows
    summary.add_count = stored.add_count
    summary.cursor = stored.add_count % stored.num_rows
    summary.is_full = stored.add_count >= stored.num_rows
    summary.observation_shape = tuple(manifest['observation']['row_shape'])
    summary.observation_dtype = str(np.dtype(manifest['observation']['dtype']))
    summary.data_bytes = _data_bytes(manifest, stored)
    summary.num_valid = _valid_count(stored, stack_size, update_horizon)
    terminal = np.asarray(stored.arrays['terminal'])

    def returns(name):
      return summaries.EpisodeStats.from_returns(
        summaries.episode_returns(
          terminal,
          np.asarray(stored.arrays[name]),
          stored.add_count,
          stored.episode_end_indices,
        )
      )

    summary.episodes = returns('reward')
    if file_names.UNCLIPPED_REWARD in stored.arrays:
      summary.game_episodes = returns(file_names.UNCLIPPED_REWARD)
  except (CheckpointError, KeyError, ValueError) as error:
    path = getattr(error, 'path', directory)
    summary.problems.append(summaries.Problem(path, f'unreadable: {error}'))
  finally:
    stored.close()
  return summary


def _check_shapes(checkpoints) -> None:
  """Flags checkpoints whose frames differ from most of the store's."""
  named = {
    manifest_lib.checkpoint_dirname(s.suffix): s
    for s in checkpoints
    if s.observation_shape is not None
  }
  layouts = {
    name: {'observation': (s.observation_shape, s.observation_dtype)}
    for name, s in named.items()
  }
  for error in checks.same_layout(
    {n: {'observation': n} for n in named}, layouts
  ):
    named[error.path].problems.append(
      summaries.Problem(error.path, error.problem)
    )


def summarize_store(
  store_dir: str,
  stack_size: int = 4,
  update_horizon: int = 1,
  verify: bool = False,
) -> summaries.DirectorySummary:
  """Summarises (and optionally verifies) every checkpoint of a store.

  Returns:
    summaries.DirectorySummary.
  """
  store_dir = str(store_dir)
  summary = summaries.DirectorySummary(
    directory=store_dir,
    stack_size=stack_size,
    update_horizon=update_horizon,
    verified=verify,
  )
  try:
    found = manifest_lib.find_stored_checkpoints(store_dir)
  except CheckpointError as error:
    summary.problems.append(summaries.Problem(error.path, error.problem))
    found = {}
  partial = {}
  for name in os.listdir(store_dir) if os.path.isdir(store_dir) else []:
    suffix = manifest_lib.partial_suffix(name)
    if suffix is not None:
      partial[suffix] = name
  for suffix in sorted(set(found) | set(partial)):
    if suffix in found:
      summary.checkpoints.append(
        summarize_checkpoint(found[suffix], stack_size, update_horizon, verify)
      )
      continue
    incomplete = summaries.CheckpointSummary(
      suffix=suffix, complete=False, missing=[manifest_lib.MANIFEST]
    )
    incomplete.problems.append(
      summaries.Problem(
        os.path.join(store_dir, partial[suffix]),
        'left by an interrupted conversion: run `fixed-replay convert` again',
      )
    )
    summary.checkpoints.append(incomplete)
  if verify:
    _check_shapes(summary.checkpoints)
  return summary


def summarize_data(
  data: 'str | layout.Layout',
  stack_size: int | None = None,
  update_horizon: int | None = None,
  verify: bool = False,
) -> summaries.DirectorySummary:
  """Summarises a compact store or Dopamine's files, whichever is there.

  Args:
    data: a directory, or what layout.detect found there.
    stack_size, update_horizon, verify: as for summarize_store; None takes
      the data's (observation_spec.resolve), or 4 and 1 when its first
      checkpoint cannot be read (the summary then lists the damage).

  Raises:
    CheckpointError: if it holds neither (layout's error, naming what it
      found), or remote storage does not answer.
  """
  found = data if isinstance(data, layout.Layout) else layout.detect(data)
  asked = {'stack_size': stack_size, 'update_horizon': update_horizon}
  try:
    asked = observation_spec.resolve_directory(found.data_dir, asked)
  except CheckpointError:  # Unreadable: the summary says what is damaged.
    asked = {
      'stack_size': stack_size or observation_spec.ATARI.stack_size,
      'update_horizon': update_horizon,
    }
  stack_size, update_horizon = asked['stack_size'], asked['update_horizon'] or 1
  if layout.Kind.STORE in (found.kind, found.partial_of):
    return summarize_store(found.data_dir, stack_size, update_horizon, verify)
  if found.kind in (layout.Kind.DOPAMINE, layout.Kind.DOPAMINE_RUN) or (
    found.partial_of is layout.Kind.DOPAMINE
  ):
    return inspection.summarize_directory(
      found.data_dir, stack_size, update_horizon, verify
    )
  raise found.error()


def data_scores(data_dirs: list[str]) -> str:
  """Markdown of the data's own game score per checkpoint of each dataset.

  Args:
    data_dirs: compact stores or directories of Dopamine's files.

  Raises:
    CheckpointError: if one holds neither.
  """
  lines = [
    '',
    "The data's own game score: the mean game-score return (sum of the "
    '`unclipped_reward` element) and the mean clipped return of the '
    'complete episodes in each checkpoint.',
    '',
  ] + summaries.GAME_SCORE_HEADER
  for directory in data_dirs:
    lines += summaries.format_game_scores(summarize_data(directory))
  return '\n'.join(lines) + '\n'
