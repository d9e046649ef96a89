"""Which rows of a checkpoint an "x% of the data" experiment uses.

Published offline-RL work means three different things by x% of a DQN
Replay Dataset run. All three act on each checkpoint separately, so every
checkpoint contributes the same share:

* 'first_rows': the first x% of the rows of each checkpoint, in file order.
  The CQL code (Kumar et al., 2020) keeps the first 10,000 transitions of
  each of the 50 checkpoints for its 1% setting (in the published layout
  the file order is the writing order).
* 'random_episodes': x% of the episodes of each checkpoint, drawn at random
  without replacement, as in the subsampled experiments of the REM paper
  (Agarwal et al., 2020).
* 'first_episodes': the first x% of the episodes of each checkpoint, in the
  order they were played, as Dopamine's TFDS loader for RL Unplugged does
  (`dopamine/labs/offline_rl/rlu_tfds/tfds_atari_utils.py`,
  `uniformly_subsampled_atari_data`: `split[:int(x / 100 * episodes)]` of
  every checkpoint's split).

For the episode methods an episode is a run of rows ended by a terminal, by
an `episode_end_indices` cut or by the writer's cursor (in a full circular
file the row before the cursor is the newest and the row at it the oldest);
only episodes with at least one transition Dopamine would sample count, and
int(x * count) of them are kept (at least one, or the checkpoint is
refused, as Dopamine's loader refuses a split that would keep none). A kept
row is sampled exactly as Dopamine samples it (its stack and n-step future
are read from the file as they are, whatever episode they touch).
"""

from absl import logging
import numpy as np

from fixed_replay.sources.dopamine import checkpoints
from fixed_replay.sources.dopamine import validity

METHODS = ('first_rows', 'random_episodes', 'first_episodes')
EPISODE_METHODS = ('random_episodes', 'first_episodes')


def check_arguments(method: str | None, fraction: float | None) -> None:
  """Raises ValueError unless (method, fraction) choose a subset.

  Args:
    method: None (all the data) or one of METHODS.
    fraction: float in (0, 1], the x of "x% of the data" (0.01 for 1%); must
      be None when method is None.
  """
  if method is None:
    if fraction is not None:
      raise ValueError(
        f'subsample_fraction={fraction} needs a subsample method, one of '
        f'{list(METHODS)}'
      )
    return
  if method not in METHODS:
    raise ValueError(
      f'subsample={method!r}: choose one of {list(METHODS)} (or None for '
      'all the data)'
    )
  if fraction is None or not 0 < fraction <= 1:
    raise ValueError(
      f'subsample={method!r} needs subsample_fraction in (0, 1] (0.01 for '
      f'1% of the data), got {fraction}'
    )


def first_rows_count(num_rows: int, fraction: float, where: str) -> int:
  """Rows kept by 'first_rows' out of num_rows.

  Raises:
    ValueError: if none would be kept.
  """
  count = int(fraction * num_rows)
  if count < 1:
    raise ValueError(
      f'subsample_fraction={fraction} of the {num_rows} rows of {where} '
      'keeps none'
    )
  return count


def episode_rng(seed: int | None, suffix: int) -> np.random.Generator:
  """The generator choosing random episodes of checkpoint `suffix`.

  Depends only on the buffer's seed (0 when unset) and the suffix, so a
  checkpoint keeps the same episodes when it is loaded again, in this
  process or in a resumed one.
  """
  return np.random.default_rng([0 if seed is None else seed, suffix])


def episode_ids(window: checkpoints.CheckpointWindow) -> np.ndarray:
  """Episode number of each row of a window (see the module docstring).

  Args:
    window: checkpoints.CheckpointWindow (only 'terminal' is read).

  Returns:
    int64 array, one id per window row, increasing along the window.
  """
  rows = window.start + np.arange(window.num_rows)
  ends = np.asarray(window.store['terminal']).astype(bool)
  if window.episode_end_indices is not None:
    ends = ends | np.isin(rows, window.episode_end_indices)
  if window.is_full:
    ends = ends | (rows == (window.cursor - 1) % window.num_file_rows)
  # A row starts a new episode after every end before it.
  ids = np.concatenate([[0], np.cumsum(ends[:-1])]).astype(np.int64)
  circular = window.is_full and window.num_rows == window.num_file_rows
  if circular and not ends[-1]:
    # The episode at the end of the file goes on at row 0.
    ids[ids == ids[-1]] = 0
  return ids


def keep_rows(
  valid_rows: np.ndarray,
  window: checkpoints.CheckpointWindow,
  method: str,
  fraction: float,
  rng: np.random.Generator | None,
) -> np.ndarray:
  """Returns the rows of `valid_rows` in the episodes an episode method keeps.

  Args:
    valid_rows: sorted int array, file rows of the window Dopamine would
      sample.
    window: checkpoints.CheckpointWindow holding at least 'terminal'.
    method: 'random_episodes' or 'first_episodes'.
    fraction: float in (0, 1].
    rng: np.random.Generator ('random_episodes' only).

  Returns:
    sorted int64 array, a subset of valid_rows.

  Raises:
    ValueError: if no episode would be kept.
  """
  valid_rows = np.asarray(valid_rows, dtype=np.int64)
  ids = episode_ids(window)[valid_rows - window.start]
  episodes, position = np.unique(ids, return_inverse=True)
  count = int(fraction * len(episodes))
  if count < 1:
    raise ValueError(
      f'subsample={method!r}, subsample_fraction={fraction}: checkpoint '
      f'{window.suffix} has {len(episodes)} episode(s) with valid '
      'transitions, so none would be kept'
    )
  if method == 'first_episodes':
    age = valid_rows - window.start
    if window.is_full:  # The oldest row of a full file is at the cursor.
      age = (valid_rows - window.cursor) % window.num_file_rows
    # An episode is as old as its oldest row.
    episode_age = np.full(len(episodes), np.iinfo(np.int64).max)
    np.minimum.at(episode_age, position, age)
    kept = episodes[np.argsort(episode_age, kind='stable')[:count]]
  else:
    kept = rng.choice(episodes, count, replace=False)
  rows = valid_rows[np.isin(ids, kept)]
  logging.info(
    'Checkpoint %d: subsample=%r keeps %d of %d episodes (%d of %d valid '
    'transitions)',
    window.suffix,
    method,
    count,
    len(episodes),
    len(rows),
    len(valid_rows),
  )
  return rows


def plan_window(
  window: checkpoints.CheckpointWindow,
  stack_size: int,
  update_horizon: int,
  method: str,
  fraction: float,
  rng: np.random.Generator | None,
) -> tuple[int, int, np.ndarray]:
  """Chooses the rows an episode method keeps, before frames are read.

  Args:
    window: checkpoints.CheckpointWindow with 'terminal' (see
      checkpoints.read_terminal_window).
    stack_size: int.
    update_horizon: int.
    method: 'random_episodes' or 'first_episodes'.
    fraction: float in (0, 1].
    rng: np.random.Generator.

  Returns:
    (start, count, kept): the smallest window [start, start + count) holding
    every kept row's frame stack and n-step future (the given window when
    they wrap around a circular file), and the kept rows.
  """
  valid = validity.window_valid_rows(window, stack_size, update_horizon)
  kept = keep_rows(valid, window, method, fraction, rng)
  low = int(kept[0]) - (stack_size - 1)
  high = int(kept[-1]) + update_horizon + 1
  if low >= window.start and high <= window.start + window.num_rows:
    return low, high - low, kept
  return window.start, window.num_rows, kept
