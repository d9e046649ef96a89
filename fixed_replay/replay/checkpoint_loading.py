"""Reading checkpoint windows of Dopamine's gzip files into ReplayShards.

A `WindowLoader` decides, once per checkpoint, which rows to read (the
window [replay_transitions_start_index, + replay_capacity), cut by
`subsample`), says what holding them costs before anything is read, and
reads them by streaming. With `verify` a window reaches the samplers only
after every one of its files passed its gzip CRC-32 and length check.
"""

import concurrent.futures
import os
import time

from absl import logging
import numpy as np

from fixed_replay import progress
from fixed_replay.dataset import checkpoints
from fixed_replay.dataset import subsample as subsample_lib
from fixed_replay.dataset import validity
from fixed_replay.replay import memory_budget as memory
from fixed_replay.replay import shard as shard_lib

_SMALL = ['observation', 'action', 'reward', 'terminal']


class WindowLoader:
  """Plans and loads the windows of the selected gzip checkpoints."""

  def __init__(self, files, data_dir, start, settings, verify):
    """Keeps what planning and loading need.

    Args:
      files: dict of suffix to checkpoints.CheckpointFiles.
      data_dir: str, for the messages.
      start: int, replay_transitions_start_index.
      settings: dict with replay_capacity, observation_shape,
        observation_dtype, stack_size, update_horizon, gamma, extra_names,
        subsample, subsample_fraction and seed.
      verify: bool, check every file to its end before a window is used.
    """
    self.files = files
    self._data_dir = data_dir
    self._start = start
    self._s = settings
    self._verify = verify
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
    s, files, start = self._s, self.files[suffix], self._start
    num_file_rows = self._headers_of(suffix)['observation'].num_rows
    if start >= num_file_rows:
      raise ValueError(
        f'replay_transitions_start_index={start} is beyond the '
        f'{num_file_rows} rows of {files.store_paths["observation"]}'
      )
    capacity = s['replay_capacity']
    count = memory.window_rows(num_file_rows, start, capacity)
    if count < capacity and not self._warned_capacity:
      logging.info(
        'replay_capacity=%d reaches past the %d rows of checkpoint %d: '
        'using rows [%d, %d).',
        capacity,
        num_file_rows,
        suffix,
        start,
        start + count,
      )
      self._warned_capacity = True
    plan = (start, count, None)
    if s['subsample'] == 'first_rows':
      where = f'checkpoint {suffix} of {self._data_dir}'
      count = subsample_lib.first_rows_count(
        count, s['subsample_fraction'], where
      )
      plan = (start, count, None)
    elif s['subsample'] in subsample_lib.EPISODE_METHODS:
      plan = subsample_lib.plan_window(
        checkpoints.read_terminal_window(
          files, start, count, verify=self._verify
        ),
        s['stack_size'],
        s['update_horizon'],
        s['subsample'],
        s['subsample_fraction'],
        subsample_lib.episode_rng(s['seed'], suffix),
      )
    self._plans[suffix] = plan
    return plan

  def set_bytes(self, suffixes):
    """Bytes needed to hold the given checkpoints' windows."""
    for suffix in suffixes:
      if suffix not in self._bytes:
        start, count, _ = self._plan(suffix)
        self._bytes[suffix], _ = memory.shard_bytes(
          self._headers_of(suffix),
          start,
          count,
          _SMALL + self._s['extra_names'],
        )
    return memory.total([self._bytes[s] for s in suffixes])

  def load_shard(self, suffix):
    """Reads one checkpoint window and wraps it as a ReplayShard."""
    s = self._s
    start, count, kept = self._plan(suffix)
    began = time.perf_counter()
    window = checkpoints.read_checkpoint(
      self.files[suffix],
      start,
      count,
      observation_shape=s['observation_shape'],
      observation_dtype=s['observation_dtype'],
      elements=s['extra_names'],
      verify=self._verify,
    )
    # Only now, every file checked, may samplers see these rows.
    valid_rows = validity.window_valid_rows(
      window, s['stack_size'], s['update_horizon']
    )
    if kept is not None:  # Only the rows of the episodes kept.
      valid_rows = np.intersect1d(valid_rows, kept)
    shard = shard_lib.ReplayShard(
      window, s['stack_size'], s['update_horizon'], s['gamma'], valid_rows
    )
    logging.info(
      'Loaded checkpoint %d rows [%d, %d): %d valid transitions, %s in '
      '%.1f s (%s)',
      suffix,
      start,
      start + count,
      shard.num_valid,
      memory.format_bytes(shard.nbytes),
      time.perf_counter() - began,
      'files checked to their end'
      if self._verify
      else 'verify_checksums=False: files not checked past the window',
    )
    if not shard.num_valid:
      logging.warning(
        'Checkpoint %d has no valid transition in rows [%d, %d)',
        suffix,
        start,
        start + count,
      )
    return shard

  def load_shards(self, suffixes, parallel=False, reuse=()):
    """Loads checkpoints (reusing already loaded shards), with progress."""
    reusable = {s.suffix: s for s in reuse}
    to_load = [s for s in suffixes if s not in reusable]
    logging.info(
      'Loading checkpoints %s from %s (reusing %s)',
      to_load,
      self._data_dir,
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
