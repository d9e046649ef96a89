"""Summarises and verifies the replay checkpoints of a directory.

For every checkpoint suffix we report what a user needs before training on it:
whether all files are there, how many rows the writer held and how many of
them Dopamine would sample, the complete episodes and their returns (and
their game-score returns, where an `unclipped_reward` element records the
game's reward), and how big the files are. Only headers and the small
arrays (terminal, reward, add_count, invalid_range, episode_end_indices) are
read, so summarising the 50 x 7 GB of a DQN Replay Dataset run takes
seconds. `verify=True` also decompresses every file to the end, which checks
every gzip CRC.

Every problem is collected (naming its file, see audit.py) instead of
stopping at the first, so one run tells the user everything that is wrong
with a directory. The result is a summaries.DirectorySummary; `fixed-replay
inspect` renders it. Neither TensorFlow nor Dopamine is imported for local
paths.
"""

from absl import logging

from fixed_replay import progress as progress_lib
from fixed_replay.errors import CheckpointError
from fixed_replay.io import files as storage
from fixed_replay.sources import summaries
from fixed_replay.sources.dopamine import audit
from fixed_replay.sources.dopamine import checkpoints
from fixed_replay.sources.dopamine import checks
from fixed_replay.sources.dopamine import file_names
from fixed_replay.sources.dopamine import validity
from fixed_replay.sources.summaries import CheckpointSummary
from fixed_replay.sources.summaries import DirectorySummary
from fixed_replay.sources.summaries import EpisodeStats
from fixed_replay.sources.summaries import Problem
from fixed_replay.sources.summaries import episode_returns


def _summarize_checkpoint(
  files, stack_size: int, update_horizon: int, verify, other_paths, progress
):
  """Summarises (and optionally verifies) one complete checkpoint.

  `other_paths` are further files of the suffix (e.g. a sum tree), counted in
  disk_bytes and, with verify, checked as gzip.

  Returns:
    (CheckpointSummary, the readable `$store$_` headers); damage is reported
    in the summary's problems, never raised.
  """
  summary = CheckpointSummary(suffix=files.suffix, verified=verify)
  # The storage being unreachable stops the summary: every file would fail.
  collector = checks.Collector(stop_on_remote=True)
  try:
    headers = _fill_summary(
      summary,
      files,
      collector,
      (stack_size, update_horizon),
      other_paths,
      progress if verify else None,
    )
  finally:
    summary.problems += _problems(collector)
  return summary, headers


def _problems(collector):
  return [Problem(str(e.path), e.problem) for e in collector.errors]


def _fill_summary(summary, files, collector, sampling, other_paths, progress):
  """Fills `summary` from what is readable; returns the store headers."""
  verify = summary.verified
  summary.disk_bytes = audit.disk_bytes(
    files.all_paths() + list(other_paths), collector
  )
  headers = audit.store_headers(files, collector, verify, progress)
  rows = audit.common_rows(files, headers, collector)
  if 'observation' in headers:
    summary.observation_shape = tuple(headers['observation'].row_shape)
    summary.observation_dtype = str(headers['observation'].dtype)
  add_count_array, add_count, invalid_range, episode_ends = audit.bookkeeping(
    files, rows, collector, verify, progress
  )
  if verify:
    for path in other_paths:
      audit.verify_file(path, collector, progress, audit.verify_gzip)
  small = (add_count_array, invalid_range)
  if len(headers) == len(files.store_paths) and all(
    a is not None for a in small
  ):
    summary.data_bytes = int(
      sum(h.nbytes for h in headers.values()) + sum(a.nbytes for a in small)
    )
  if rows is None or add_count is None:
    return headers

  summary.rows = rows
  summary.add_count = add_count
  summary.cursor = add_count % rows
  summary.is_full = add_count >= rows
  if files.episode_end_indices_path and episode_ends is None:
    # Unreadable: neither validity nor episodes are known.
    return headers
  terminal = audit.column(files, 'terminal', rows, collector)
  if terminal is None:
    return headers
  if invalid_range is not None:
    stack_size, update_horizon = sampling
    summary.num_valid = len(
      validity.valid_rows(
        terminal,
        0,
        rows,
        add_count,
        invalid_range,
        episode_ends,
        stack_size,
        update_horizon,
      )
    )
  fields = {'reward': 'episodes', file_names.UNCLIPPED_REWARD: 'game_episodes'}
  for name, field in fields.items():
    if name not in files.store_paths:  # No game score recorded.
      continue
    reward = audit.column(files, name, rows, collector)
    if reward is not None:
      returns = episode_returns(terminal, reward, add_count, episode_ends)
      setattr(summary, field, EpisodeStats.from_returns(returns))
  return headers


def _files_by_suffix(directory: str):
  """Returns {suffix: [paths of its `*_ckpt.N.gz` files]}."""
  result = {}
  for entry in sorted(storage.listdir(directory)):
    parsed = file_names.parse(entry)
    if parsed:
      result.setdefault(parsed[1], []).append(storage.join(directory, entry))
  return result


def summarize_directory(
  directory: str,
  stack_size: int = 4,
  update_horizon: int = 1,
  verify: bool = False,
  progress_bar: bool | None = None,
) -> summaries.DirectorySummary:
  """Summarises (and optionally verifies) every checkpoint of a directory.

  Args:
    directory: str, local or gs:// replay directory.
    stack_size: int, frames per state, for the valid row counts.
    update_horizon: int, n of the n-step return, for the valid row counts.
    verify: bool, decompress every file fully (gzip CRC, header, payload
      length) on top of the consistency checks.
    progress_bar: bool, show a tqdm bar while verifying; None: only when
      stderr is a TTY (otherwise each file is logged).

  Returns:
    DirectorySummary; problems are collected in it, never raised.
  """
  directory = str(directory)
  summary = DirectorySummary(
    directory=directory,
    stack_size=stack_size,
    update_horizon=update_horizon,
    verified=verify,
  )
  try:
    _summarize_all(summary, progress_bar)
  except CheckpointError as error:  # No listing, or the storage is gone.
    summary.problems.append(Problem(error.path, error.problem))
  return summary


def _verify_progress(complete, paths_by_suffix, progress_bar):
  """A FilesProgress over the files of the complete checkpoints."""
  sizes = {}
  for suffix in complete:
    for path in paths_by_suffix.get(suffix, []):
      try:
        sizes[path] = storage.size(path)
      except OSError:
        sizes[path] = 0  # Reported by _summarize_checkpoint.
  return progress_lib.FilesProgress(sizes, 'verifying', progress_bar)


def _summarize_all(summary, progress_bar) -> None:
  """Fills summary.checkpoints; raises RemoteError if storage fails."""
  directory, verify = summary.directory, summary.verified
  complete, incomplete = checkpoints.scan_checkpoints(directory)
  paths_by_suffix = _files_by_suffix(directory)
  progress = None
  if verify:
    progress = _verify_progress(complete, paths_by_suffix, progress_bar)
  layouts = {}
  try:
    for suffix in sorted(set(complete) | set(incomplete)):
      if suffix in incomplete:
        summary.checkpoints.append(
          _incomplete_summary(
            directory, suffix, incomplete[suffix], paths_by_suffix
          )
        )
        continue
      files = complete[suffix]
      if progress is None or not progress.has_bar:  # Logs would break a bar.
        logging.info('Summarising checkpoint %d of %s', suffix, directory)
      others = sorted(
        set(paths_by_suffix.get(suffix, [])) - set(files.all_paths())
      )
      checkpoint, headers = _summarize_checkpoint(
        files,
        summary.stack_size,
        summary.update_horizon,
        verify,
        others,
        progress,
      )
      summary.checkpoints.append(checkpoint)
      layouts[suffix] = {
        name: (h.row_shape, str(h.dtype)) for name, h in headers.items()
      }
  finally:
    if progress is not None:
      progress.close()
  _report_layouts(summary, complete, layouts)
  if not complete:
    summary.problems.append(Problem(directory, 'no complete replay checkpoint'))


def _report_layouts(summary, complete, layouts) -> None:
  """Flags arrays whose row shape or dtype differ from the rest of the run."""
  by_suffix = {s.suffix: s for s in summary.checkpoints}
  paths = {suffix: complete[suffix].store_paths for suffix in layouts}
  for error in checks.same_layout(paths, layouts):
    suffix = next(s for s, p in paths.items() if error.path in p.values())
    by_suffix[suffix].problems.append(Problem(error.path, error.problem))


def _incomplete_summary(directory: str, suffix: int, missing, paths_by_suffix):
  summary = CheckpointSummary(suffix=suffix, complete=False, missing=missing)
  collector = checks.Collector(stop_on_remote=True)
  for name in missing:
    collector.add(
      CheckpointError(
        storage.join(directory, name),
        f'missing: checkpoint {suffix} is incomplete',
      )
    )
  summary.disk_bytes = audit.disk_bytes(
    paths_by_suffix.get(suffix, []), collector
  )
  summary.problems += _problems(collector)
  return summary
