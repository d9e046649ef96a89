"""Fuzz: damaged files give an error naming them, or the undamaged data.

Single-bit flips and truncations at random (seeded) offsets in every kind of
file: the gzip arrays, add_count, invalid_range and episode_end_indices of a
Dopamine checkpoint, and the frame blocks, manifest and arrays of a compact
store. Every tool that reads them (checkpoints.read_checkpoint,
FixedReplayBuffer, inspect, convert, CompactReplayBuffer) must either raise a
CheckpointError whose message names the damaged file or return exactly what
it returns for the undamaged copy: never other data, never another
exception, never a hang (each call runs under a time limit).

The data is tiny (64-row checkpoints of 8x8 frames written by Dopamine) so
that the whole fuzz takes seconds.
"""

import contextlib
import faulthandler
import os
import shutil
import signal

import dopamine_data
from dopamine_data import file_digests
import numpy as np
import pytest

from fixed_replay.convert import convert
from fixed_replay.errors import CheckpointError
from fixed_replay.replay.compact_replay_buffer import CompactReplayBuffer
from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer
from fixed_replay.sources.dopamine import checkpoints
from fixed_replay.sources.dopamine import inspection
from fixed_replay.store import manifest as manifest_lib

# FUZZ_SEED and FUZZ_TRIALS widen a run by hand; the suite uses these.
SEED = int(os.environ.get('FUZZ_SEED', 20261130))
TRIALS = int(os.environ.get('FUZZ_TRIALS', 2))
SHAPE = (8, 8)
CAPACITY = 64
# suffix: (adds, seed); 0 wraps around (full), 1 is not full.
WRITTEN = {0: (150, 0), 1: (40, 1)}
CALL_LIMIT_S = 20.0
SOURCE_NAMES = (
  '$store$_observation',
  '$store$_action',
  '$store$_reward',
  '$store$_terminal',
  'add_count',
  'invalid_range',
  'episode_end_indices',
)
LAYOUT_OPTIONS = {
  'units': convert.ConvertOptions(),
}
BUFFER_ARGS = dict(observation_shape=SHAPE, stack_size=4, update_horizon=2)


class CallTimeout(Exception):
  """A call ran past CALL_LIMIT_S."""


@contextlib.contextmanager
def time_limit(seconds):
  """Raises CallTimeout in this (main) thread after `seconds`."""

  def expire(*unused):
    raise CallTimeout(f'no result after {seconds} s')

  previous = signal.signal(signal.SIGALRM, expire)
  signal.setitimer(signal.ITIMER_REAL, seconds)
  try:
    yield
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def _write_run(directory):
  rng = np.random.default_rng(SEED)
  for suffix, (adds, seed) in WRITTEN.items():
    buffer = dopamine_data.make_buffer(
      CAPACITY, update_horizon=2, observation_shape=SHAPE
    )
    local = np.random.default_rng(seed)
    for _ in range(adds):
      terminal = local.random() < 0.05
      buffer.add(
        rng.integers(0, 256, SHAPE, dtype=np.uint8),
        int(local.integers(4)),
        float(local.normal()),
        terminal,
        episode_end=terminal or local.random() < 0.05,
      )
    buffer.save(str(directory), suffix)


def _all_transitions(buffer):
  """Every valid transition of every loaded checkpoint, as bytes."""
  result = {}
  for suffix in buffer.loaded_suffixes:
    rows = buffer.shard(suffix).valid_rows
    batch = buffer.sample_transition_batch(
      len(rows), indices=rows, suffixes=suffix
    )
    result[suffix] = [np.asarray(a).tobytes() for a in batch]
  return result


def _read_checkpoints(directory):
  found = checkpoints.find_checkpoints(directory)
  result = {}
  for suffix, files in found.items():
    for start, count in ((0, None), (8, 20)):
      window = checkpoints.read_checkpoint(
        files, start, count, observation_shape=SHAPE
      )
      result[suffix, start] = (
        {n: a.tobytes() for n, a in window.store.items()},
        window.add_count,
        window.invalid_range.tobytes(),
        None
        if window.episode_end_indices is None
        else window.episode_end_indices.tobytes(),
      )
  return result


def _fixed_buffer(directory):
  buffer = FixedReplayBuffer(
    str(directory),
    None,
    num_buffers_to_load=len(WRITTEN),
    prefetch=False,
    replay_capacity=CAPACITY,
    **BUFFER_ARGS,
  )
  try:
    return _all_transitions(buffer)
  finally:
    buffer.close()


def summary_or_error(summary, problems, directory, where_key):
  """An inspection's summary (less where it was read), or its problems."""
  if problems:
    raise CheckpointError(directory, '; '.join(str(p) for p in problems))
  data = summary.to_dict()
  data.pop(where_key)
  return data


def _inspect(directory):
  summary = inspection.summarize_directory(
    directory, stack_size=4, update_horizon=2, verify=True
  )
  return summary_or_error(summary, summary.all_problems, directory, 'directory')


def _convert(directory, store, options=None):
  convert.convert(directory, store, options, workers=0)
  return file_digests(store)


def _compact_buffer(store):
  buffer = CompactReplayBuffer(str(store), sampling_threads=0, **BUFFER_ARGS)
  try:
    return _all_transitions(buffer)
  finally:
    buffer.close()


def _source_tools(directory, scratch):
  return {
    'read_checkpoint': lambda: _read_checkpoints(directory),
    'FixedReplayBuffer': lambda: _fixed_buffer(directory),
    'inspect': lambda: _inspect(directory),
    'convert': lambda: _convert(directory, scratch / 'store'),
  }


def _store_tools(store, source, layout='units'):
  return {
    'CompactReplayBuffer': lambda: _compact_buffer(store),
    # A rerun checks every stored checkpoint before skipping it.
    'convert (rerun)': lambda: _convert(source, store, LAYOUT_OPTIONS[layout]),
  }


def _damage(path, rng):
  """Flips one bit or truncates, at a random offset; says which."""
  data = bytearray(open(path, 'rb').read())
  offset = int(rng.integers(len(data)))
  if rng.random() < 0.5:
    bit = int(rng.integers(8))
    data[offset] ^= 1 << bit
    what = f'bit {bit} of byte {offset} flipped'
  else:
    del data[offset:]
    what = f'truncated to {offset} bytes'
  os.remove(path)  # May be a hard link: never write through it.
  with open(path, 'wb') as stream:
    stream.write(data)
  return what


def _check(tools, baselines, damaged, what):
  """Runs every tool; each must name `damaged` or match its baseline."""
  outcomes = []
  for name, function in tools.items():
    where = f'{name} with {damaged} {what}'
    try:
      with time_limit(CALL_LIMIT_S):
        result = function()
    except CheckpointError as error:
      assert str(damaged) in str(error), f'{where}: {error}'
      outcomes.append('error')
      continue
    except CallTimeout:
      pytest.fail(f'{where}: hung')
    except Exception as error:  # noqa: BLE001 - the failure being tested.
      pytest.fail(f'{where}: {type(error).__name__}: {error}')
    assert result == baselines[name], f'{where}: different data'
    outcomes.append('same')
  return outcomes


@pytest.fixture(scope='module')
def undamaged(tmp_path_factory):
  """The run, its store, and what every tool returns for them."""
  base = tmp_path_factory.mktemp('fuzz')
  source = base / 'source'
  source.mkdir()
  _write_run(source)
  baselines = {
    name: function()
    for name, function in _source_tools(source, base / 'baseline').items()
  }
  stores = {}
  for layout, options in LAYOUT_OPTIONS.items():
    store = stores[layout] = base / f'store_{layout}'
    convert.convert(source, store, options, workers=0)
    baselines[layout] = {
      name: function()
      for name, function in _store_tools(store, source, layout).items()
    }
  return source, stores, baselines


@pytest.mark.parametrize('layout', sorted(LAYOUT_OPTIONS))
def test_damage_is_named_or_harmless(undamaged, tmp_path, layout):
  source, stores, all_baselines = undamaged
  store = stores[layout]
  baselines = {**all_baselines, **all_baselines[layout]}
  # Every file the checkpoints hold (in each format version its own).
  store_names = sorted(
    set.intersection(
      *(
        set(os.listdir(store / manifest_lib.checkpoint_dirname(s)))
        for s in WRITTEN
      )
    )
  )
  # The run's files (its dictionary; empty for these random 8x8 frames,
  # nothing to damage: test_compact_store damages a real one).
  run_names = [
    name
    for name in os.listdir(store)
    if not name.startswith(('.', 'check')) and os.path.getsize(store / name)
  ]
  rng = np.random.default_rng(SEED)
  faulthandler.dump_traceback_later(300, exit=True)  # A hang in C code.
  seen = []
  try:
    for trial in range(TRIALS):
      for name in SOURCE_NAMES:
        suffix = int(rng.choice(sorted(WRITTEN)))
        copy = tmp_path / f'source_{trial}_{len(seen)}'
        shutil.copytree(source, copy)
        damaged = copy / f'{name}_ckpt.{suffix}.gz'
        what = _damage(damaged, rng)
        seen += _check(
          _source_tools(copy, tmp_path / f'scratch_{len(seen)}'),
          baselines,
          damaged,
          what,
        )
      for name in store_names + run_names:
        suffix = int(rng.choice(sorted(WRITTEN)))
        copy = tmp_path / f'store_{trial}_{len(seen)}'
        shutil.copytree(store, copy)
        damaged = copy / manifest_lib.checkpoint_dirname(suffix) / name
        if name in run_names:  # The run's own, beside its checkpoints.
          damaged = copy / name
        what = _damage(damaged, rng)
        seen += _check(
          _store_tools(copy, source, layout), baselines, damaged, what
        )
  finally:
    faulthandler.cancel_dump_traceback_later()
  # The fuzz must mostly find damage, not only harmless flips.
  assert seen.count('error') > len(seen) // 2, seen


def test_harmless_damage_changes_nothing(undamaged, tmp_path):
  """A flip in a gzip header's timestamp changes no data: no tool refuses."""
  source, _, baselines = undamaged
  for name in SOURCE_NAMES:
    copy = tmp_path / name
    shutil.copytree(source, copy)
    path = copy / f'{name}_ckpt.0.gz'
    data = bytearray(path.read_bytes())
    data[5] ^= 0x10  # MTIME, bytes 4-7 of the gzip header.
    path.write_bytes(data)
    outcomes = _check(
      _source_tools(copy, tmp_path / f'scratch_{name}'),
      baselines,
      path,
      'mtime flipped',
    )
    assert outcomes == ['same'] * 4, (name, outcomes)
