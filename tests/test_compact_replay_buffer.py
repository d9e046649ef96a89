"""What FixedReplayBuffer does over a compact store: sets, a block cache.

The transitions themselves are checked against Dopamine in
test_replay_contract.py. CompactReplayBuffer, the name older configs use,
is FixedReplayBuffer with a 1.5 GB default budget.
"""

import logging
import os
import shutil
import zlib

import dopamine_data
import gin
import numpy as np
import pytest
from replay_oracle import as_dict
from replay_oracle import assert_equals_oracle
import tensorflow as tf
import zstandard

from fixed_replay.agents.tf.wrapped_fixed_replay_buffer import (
  WrappedFixedReplayBuffer,
)
from fixed_replay.convert import convert
from fixed_replay.errors import CheckpointError
from fixed_replay.io import mapped
from fixed_replay.io import spill
from fixed_replay.replay import batch_kernels
from fixed_replay.replay import frame_sources
from fixed_replay.replay.compact_replay_buffer import CompactReplayBuffer
from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer
from fixed_replay.sources.dopamine import validity
from fixed_replay.store import checkpoint_tables
from fixed_replay.store import compact_store
from fixed_replay.store import manifest as manifest_lib


@pytest.fixture(scope='module')
def units8_store(dopamine_dir, tmp_path_factory):
  """Format 2 with 8 frames a unit: each batch decodes the units it uses."""
  directory = tmp_path_factory.mktemp('compact_units8')
  options = convert.ConvertOptions(block_rows=8)
  convert.convert(dopamine_dir[0], directory, options, workers=0)
  return directory


def _buffer(store, **kwargs):
  kwargs.setdefault('seed', 0)
  kwargs.setdefault('sampling_threads', 0)
  return FixedReplayBuffer(
    str(store), kwargs.pop('replay_suffix', None), **kwargs
  )


@pytest.mark.parametrize(
  'replay_capacity, start, update_horizon, file_start, file_end',
  [
    (250, 0, 1, 0, None),  # The first K rows of each checkpoint (1%/10%).
    (300, 400, 3, 1, 3),  # Rows in the middle; checkpoints 1 and 3 only.
    (2000, 650, 2, 2, None),  # Clipped to the end of the file.
  ],
)
def test_valid_rows_equal_fixed_replay_buffers(
  dopamine_dir,
  store,
  replay_capacity,
  start,
  update_horizon,
  file_start,
  file_end,
):
  """Same windows and valid rows as FixedReplayBuffer over the gzip files."""
  directory, _, writers = dopamine_dir
  selected = sorted(writers)[file_start:file_end]
  options = dict(
    replay_capacity=replay_capacity,
    replay_transitions_start_index=start,
    update_horizon=update_horizon,
    replay_file_start_index=file_start,
    replay_file_end_index=file_end,
  )
  buffer = _buffer(store, **options)
  assert buffer.loaded_suffixes == selected
  reference = FixedReplayBuffer(
    str(directory),
    num_buffers_to_load=len(selected),
    prefetch=False,
    **options,
  )
  for suffix in selected:
    np.testing.assert_array_equal(
      buffer.shard(suffix).valid_rows,
      reference.shard(suffix).valid_rows,
    )


def test_prefetched_minibatches_mix_checkpoints_uniformly(
  dopamine_dir, store, oracles
):
  _, _, writers = dopamine_dir
  buffer = _buffer(store, sampling_threads=2, batch_size=64)
  counts = {s: buffer.shard(s).num_valid for s in writers}
  batches = [
    as_dict(buffer, buffer.sample_transition_batch()) for _ in range(60)
  ]
  for batch in batches[:3]:
    assert len(np.unique(batch['suffix'])) > 1
    assert_equals_oracle(batch, oracles)
  suffixes = np.concatenate([b['suffix'] for b in batches])
  expected = {s: c / sum(counts.values()) for s, c in counts.items()}
  for s in writers:
    assert abs(np.mean(suffixes == s) - expected[s]) < 0.03
  # The threads draw independent streams: no minibatch comes twice.
  assert len({b['indices'].tobytes() for b in batches}) == len(batches)
  buffer.close()


def test_memory_is_bounded_by_the_budget(store):
  with pytest.raises(MemoryError, match='memory_budget'):
    _buffer(store, memory_budget=1 << 20)


@pytest.mark.parametrize('layout', ['store', 'units8_store'])
def test_memory_held_is_the_index_and_the_batches(request, layout):
  buffer = _buffer(request.getfixturevalue(layout), sampling_threads=1)
  for _ in range(5):
    buffer.sample_transition_batch(128)
  batch_bytes = sum(
    np.dtype(e.type).itemsize * np.prod(e.shape)
    for e in buffer.get_transition_elements()
  )
  # A valid row's 4 bytes and the unit index (at most 8 bytes a row, one
  # more anchor a checkpoint), the ready batches, and the units a batch of
  # 32 decodes, in the caller and the thread: the arrays and the run's
  # dictionary are mapped from the store, not held.
  frames = buffer.source._stored[0].frames
  scratch = 32 * frames.block_rows * frames.frame_bytes
  scratch *= frame_sources.units_per_transition(frames.block_rows, 4, 1)
  assert buffer.nbytes <= (
    4 * (1000 * (4 + 8) + 8) + (4 + 1) * batch_bytes + 2 * scratch
  )
  buffer.close()


@pytest.mark.parametrize(
  'layout, damaged_row, match',
  [
    ('store', 490, r'checkpoint 1: unit 490 \(rows 490-490\)'),
    ('units8_store', 490, r'checkpoint 1: unit 61 \(rows 488-495\)'),
  ],
)
def test_damaged_block_error_names_checkpoint_and_rows(
  request, tmp_path, layout, damaged_row, match
):
  damaged = tmp_path / 'store'
  shutil.copytree(request.getfixturevalue(layout), damaged)
  directory = damaged / 'checkpoint_1'
  manifest = manifest_lib.read_manifest(directory)
  unit = damaged_row // manifest['observation']['block_rows']
  start, _ = _unit_span(directory, unit)
  with open(directory / manifest['observation']['file'], 'r+b') as stream:
    stream.seek(start + 5)
    stream.write(b'\xde\xad\xbe\xef')
  buffer = _buffer(damaged)
  with pytest.raises(CheckpointError, match=match):
    buffer.sample_transition_batch(indices=[490], suffixes=1)
  buffer.sample_transition_batch(indices=[520], suffixes=1)  # Others read.
  background = _buffer(
    damaged, replay_suffix=1, sampling_threads=1, batch_size=512
  )
  with pytest.raises(CheckpointError, match=match):
    for _ in range(50):  # Some minibatch soon draws a row of block 30.
      background.sample_transition_batch()
  background.close()


def _unit_span(directory, unit):
  """(start, end) of a unit of a stored checkpoint in its file."""
  stored = compact_store.StoredCheckpoint(directory)
  stored.close()
  starts, ends = stored.frames.unit_spans([unit])
  return int(starts[0]), int(ends[0])


def _skippable_frame(size):
  """A zstd skippable frame of `size` bytes (at least 8), decoded as none."""
  return (
    (0x184D2A50).to_bytes(4, 'little')
    + (size - 8).to_bytes(4, 'little')
    + bytes(size - 8)
  )


@pytest.mark.parametrize('threads', [0, 2])
def test_units_of_several_frames_sample_dopamines_transitions(
  units8_store, oracles, threads
):
  buffer = _buffer(units8_store, sampling_threads=threads, batch_size=64)
  for _ in range(3):
    batch = as_dict(buffer, buffer.sample_transition_batch())
    assert len(np.unique(batch['suffix'])) > 1
    assert_equals_oracle(batch, oracles)
  # Decoded for each batch (some 1.5 units a transition).
  assert buffer.source.units_decoded > 64
  buffer.close()


def test_stacks_that_do_not_pack_sample_dopamines_transitions(
  store, units8_store, oracles, monkeypatch
):
  """Frames whose stacks the compiled kernel does not pack (any dtype but
  uint8, a stack of any size but 4) go through the units a batch decodes,
  gathered by numpy: forced here on Atari frames, in units of 1 and 8."""
  monkeypatch.setattr(batch_kernels, 'packable', lambda *unused: False)
  for data in (store, units8_store):
    buffer = _buffer(data, batch_size=64)
    assert not buffer.source._compiled
    for _ in range(3):
      batch = as_dict(buffer, buffer.sample_transition_batch())
      assert_equals_oracle(batch, oracles)
    buffer.close()


@pytest.mark.parametrize(
  'problem, match',
  [
    ('garbage', r'unit 490 \(rows 490-490\) is damaged: zstd cannot decode'),
    ('short', r'unit 490 \(rows 490-490\) is damaged: decodes to 3528 bytes'),
  ],
)
def test_unit_with_a_matching_crc_that_does_not_decode_is_named(
  store, tmp_path, problem, match
):
  """The decoder's own checks, behind a CRC-32 rewritten to match."""
  damaged = tmp_path / 'store'
  shutil.copytree(store, damaged)
  directory = damaged / 'checkpoint_1'
  manifest = manifest_lib.read_manifest(directory)
  start, stop = _unit_span(directory, 490)
  if problem == 'garbage':
    unit = bytes(range(stop - start))
  else:  # A valid frame of half a frame's bytes, padded to the same length.
    # Without the 6 bytes format version 3 strips (magic number, header
    # descriptor, window descriptor), as units are written.
    magicless = zstandard.ZstdCompressionParameters.from_level(
      3, format=zstandard.FORMAT_ZSTD1_MAGICLESS
    )
    stream = zstandard.ZstdCompressor(compression_params=magicless).compressobj(
      size=-1
    )
    half = stream.compress(bytes(84 * 84 // 2)) + stream.flush()
    half = half[2:]
    unit = half + _skippable_frame(stop - start - len(half))
  with open(directory / manifest['observation']['file'], 'r+b') as stream:
    stream.seek(start)
    stream.write(unit)
  crcs = np.array(
    checkpoint_tables.CheckpointTables(str(directory), manifest)['unit_crc32']
  )
  crcs[490] = zlib.crc32(unit)
  dopamine_data.rewrite_tables(directory, unit_crc32=crcs)
  buffer = _buffer(damaged)
  with pytest.raises(CheckpointError, match=match):
    buffer.sample_transition_batch(indices=[490], suffixes=1)
  frames = buffer.source._stored[1].frames
  with pytest.raises(CheckpointError, match=match):
    frames.read_frames([490])
  buffer.close()


def test_store_must_match_what_the_agent_asks(store):
  with pytest.raises(
    CheckpointError, match=r'holds observation_shape=\(84, 84\), but obs'
  ):
    _buffer(store, observation_shape=(42, 42))
  with pytest.raises(
    CheckpointError, match=r'holds observation_dtype=uint8, but observation_'
  ):
    _buffer(store, observation_dtype=np.float32)


def test_checkpoints_that_disagree_are_refused_before_sampling(mixed_store):
  """A store mixing frames of two shapes: an error naming both."""
  mixed = mixed_store
  # Sampling two checkpoints at a time still checks all four first.
  with pytest.raises(CheckpointError) as raised:
    _buffer(mixed, num_buffers_to_load=2)
  message = str(raised.value)
  # Named against what the other checkpoints hold (one rule with Dopamine's
  # directories, checks.same_layout).
  assert 'checkpoint_1' in message, message
  assert 'rows of shape (4, 1) float64' in message, message
  assert 'checkpoints [0, 3, 7] of the run have (84, 84) uint8' in message


def test_a_store_with_no_complete_checkpoint_is_refused(store, tmp_path):
  partial = tmp_path / 'partial'
  partial.mkdir()
  shutil.copytree(
    store / 'checkpoint_1', partial / manifest_lib.partial_dirname(1)
  )
  # The layout names the half-written checkpoint and what to do about it.
  with pytest.raises(
    CheckpointError, match=r'compact store with no complete checkpoint.*rerun'
  ):
    _buffer(partial)


def test_unbound_num_buffers_samples_every_checkpoint(store, dopamine_dir):
  buffer = _buffer(store)
  assert buffer.loaded_suffixes == sorted(dopamine_dir[2])
  buffer.reload_buffer()
  buffer.reload_data()
  assert buffer.loaded_suffixes == sorted(dopamine_dir[2])
  buffer.close()


def test_bound_num_buffers_samples_that_many_per_iteration(
  store, oracles, caplog
):
  """batch_rl's meaning kept: N checkpoints, drawn anew at each reload."""
  with caplog.at_level(logging.INFO):
    buffer = _buffer(store, num_buffers_to_load=2, sampling_threads=1)
  assert 'num_buffers_to_load=2: sampling 2 of the 4 checkpoints' in (
    caplog.text
  )
  assert 'num_buffers_to_load = None' in caplog.text
  seen = set()
  for _ in range(8):
    loaded = buffer.loaded_suffixes
    assert len(loaded) == 2
    seen.update(loaded)
    for _ in range(3):  # Batches from threads: never from an old set.
      batch = as_dict(buffer, buffer.sample_transition_batch())
      assert set(batch['suffix'].tolist()) <= set(loaded)
      assert_equals_oracle(batch, oracles)
    buffer.reload_buffer()
  assert len(seen) > 2
  buffer.reload_buffer(num_buffers=3)
  assert len(buffer.loaded_suffixes) == 3
  buffer.close()


def test_tables_are_mapped_from_the_store(
  store, oracles, tmp_path, monkeypatch
):
  """Nothing is spilled: the run's dictionary and each checkpoint's tables
  (unit sizes, anchors, valid-row mask, actions, rewards and terminals) are
  mapped from the store itself, one map a checkpoint, and the transitions
  are Dopamine's."""
  monkeypatch.setattr(spill, 'SMALLEST_BYTES', 0)  # This store's are small.
  monkeypatch.setenv(spill.DIRECTORY_VARIABLE, str(tmp_path))
  buffer = _buffer(store, seed=3)
  with open('/proc/self/maps') as maps:
    lines = list(maps)
  assert not [line for line in lines if f' {tmp_path}/' in line]
  dictionary = f'{store}/{manifest_lib.RUN_DICTIONARY_FILE}\n'
  assert sum(line.endswith(dictionary) for line in lines) == 1
  paths = [line.split()[-1] for line in lines]
  for suffix in (0, 1, 3, 7):  # One map a checkpoint holds all its tables.
    assert paths.count(f'{store}/checkpoint_{suffix}/tables') == 1
  for _ in range(3):
    batch = as_dict(buffer, buffer.sample_transition_batch())
    assert_equals_oracle(batch, oracles)
  buffer.close()
  assert not list(tmp_path.iterdir())


def test_compact_replay_buffer_is_fixed_replay_buffer(store):
  buffer = CompactReplayBuffer(str(store), sampling_threads=0)
  assert isinstance(buffer, FixedReplayBuffer)
  assert buffer.loaded_suffixes == [0, 1, 3, 7]
  buffer.close()


def test_gin_binding_selects_it_for_tf_agents(dopamine_dir, store, oracles):
  import fixed_replay.replay.compact_replay_buffer  # noqa: F401 - registers it.

  gin.parse_config(
    [
      'WrappedFixedReplayBuffer.memory_class = @CompactReplayBuffer',
      'CompactReplayBuffer.sampling_threads = 1',
      'CompactReplayBuffer.batch_size = 16',
    ]
  )
  try:
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
      replay = WrappedFixedReplayBuffer(
        data_dir=str(store),
        replay_suffix=None,
        observation_shape=(84, 84),
        stack_size=4,
      )
      assert isinstance(replay.memory, CompactReplayBuffer)
      assert replay.states.shape.as_list() == [16, 84, 84, 4]
      first = session.run(replay.transition)
      second = session.run(replay.transition)
  finally:
    gin.clear_config()
  assert not np.array_equal(first['indices'], second['indices'])
  assert_equals_oracle(first, oracles)
  replay.memory.close()


def test_valid_rows_of_other_horizons_are_computed(dopamine_dir, store):
  """The table is precomputed for n=1; other horizons match validity.py."""
  buffer = _buffer(store, update_horizon=4, replay_suffix=7)
  stored = compact_store.StoredCheckpoint(store / 'checkpoint_7')
  expected = validity.valid_rows(
    np.asarray(stored.arrays['terminal']),
    0,
    stored.num_rows,
    stored.add_count,
    stored.invalid_range,
    stored.episode_end_indices,
    4,
    4,
  )
  np.testing.assert_array_equal(buffer.shard(7).valid_rows, expected)
  stored.close()


def test_one_gin_binding_selects_it_for_jax_and_tf_agents(store):
  """`replay_buffer_class.memory_class` reaches the JAX agents too."""
  from dopamine.discrete_domains import atari_lib

  from fixed_replay import agents

  agents.agent_class('jax_dqn')
  gin.parse_config(
    [
      'import fixed_replay.replay.compact_replay_buffer',
      'replay_buffer_class.memory_class = @CompactReplayBuffer',
      'CompactReplayBuffer.sampling_threads = 1',
      'CompactReplayBuffer.batch_size = 8',
    ]
  )
  try:
    environment = atari_lib.create_atari_environment('Pong')
    agent = agents.create_agent(None, environment, 'jax_dqn', str(store))
    try:
      assert isinstance(agent.replay, CompactReplayBuffer)
      for _ in range(2 * agent.update_period):
        agent.train_step()
      assert agent.replay_batches == 2
      assert np.isfinite(float(next(iter(agent.last_losses.values()))))
    finally:
      agent.close()
      agent.replay.close()
    with tf.Graph().as_default():
      replay = WrappedFixedReplayBuffer(
        data_dir=str(store),
        replay_suffix=None,
        observation_shape=(84, 84),
        stack_size=4,
      )
      assert isinstance(replay.memory, CompactReplayBuffer)
      replay.memory.close()
  finally:
    gin.clear_config()


def test_no_binding_trains_tf_and_jax_agents_on_a_store(store):
  """A store needs no gin binding: the agents' buffer reads it as it is."""
  from dopamine.discrete_domains import atari_lib

  from fixed_replay import agents

  agents.agent_class('jax_dqn')
  gin.parse_config(['FixedReplayBuffer.batch_size = 8'])
  try:
    environment = atari_lib.create_atari_environment('Pong')
    agent = agents.create_agent(None, environment, 'jax_dqn', str(store))
    try:
      assert type(agent.replay) is FixedReplayBuffer
      assert agent.replay.loaded_suffixes == [0, 1, 3, 7]
      # The buffer's sampling threads prepare the batches; the agent does
      # not queue them a second time.
      assert agent.replay.sampling_threads > 0
      assert agent._prefetcher is None
      for _ in range(2 * agent.update_period):
        agent.train_step()
      assert agent.replay_batches == 2
    finally:
      agent.close()
    with tf.Graph().as_default():
      replay = WrappedFixedReplayBuffer(
        data_dir=str(store), observation_shape=(84, 84), stack_size=4
      )
      assert type(replay.memory) is FixedReplayBuffer
      assert replay.memory.batch_size == 8
      replay.memory.close()
  finally:
    gin.clear_config()


@pytest.mark.parametrize('source', ['store', 'dopamine_dir'])
def test_n_step_sums_are_taken_in_the_datas_reward_dtype(
  request, source, oracles
):
  """Bound to another reward dtype, a batch holds Dopamine's sums of the
  data's float32 rewards, cast: not sums taken in the batch's dtype."""
  data = request.getfixturevalue(source)
  data = data[0] if source == 'dopamine_dir' else data
  buffer = _buffer(
    data,
    update_horizon=3,
    reward_dtype=np.float64,
    batch_size=256,
    num_buffers_to_load=4,
  )
  batch = as_dict(buffer, buffer.sample_transition_batch())
  assert batch['reward'].dtype == np.float64
  for suffix in np.unique(batch['suffix']):
    members = batch['suffix'] == suffix
    oracle = oracles(int(suffix), update_horizon=3)
    expected = oracle.sample_transition_batch(
      int(members.sum()), indices=batch['indices'][members]
    )[2]
    assert expected.dtype == np.float32
    np.testing.assert_array_equal(
      batch['reward'][members], expected.astype(np.float64)
    )
  buffer.close()


_OPEN_FILES = """
import os, resource, sys
from absl import logging
from fixed_replay import batches
logging.set_verbosity(logging.INFO)
buffer = batches.open_buffer(sys.argv[1], {'sampling_threads': 0})
batches.named(buffer, buffer.sample_transition_batch())
soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
print(len(os.listdir('/proc/self/fd')), soft)
"""


def _hard_linked_checkpoints(store, many, count):
  """A store of `count` checkpoints, each hard links of store's 7th."""
  origin = store / manifest_lib.checkpoint_dirname(7)
  manifest = manifest_lib.read_manifest(origin)
  for suffix in range(count):
    target = many / manifest_lib.checkpoint_dirname(suffix)
    target.mkdir(parents=True)
    for name in os.listdir(origin):
      if name != manifest_lib.MANIFEST:
        os.link(origin / name, target / name)
    manifest_lib.write_manifest(target, dict(manifest, suffix=suffix))
  dictionary = manifest_lib.RUN_DICTIONARY_FILE
  os.link(store / dictionary, many / dictionary)
  return many


@pytest.mark.parametrize(
  'checkpoints_held, raised', [(100, False), (400, True)]
)
def test_many_checkpoints_open_under_a_low_limit_on_open_files(
  store, tmp_path, checkpoints_held, raised
):
  """Under a soft limit of 256 open files: a checkpoint holds one
  descriptor (its units'; its other files are mapped without one), and
  past the limit the library raises it, saying so."""
  import resource
  import subprocess
  import sys

  many = _hard_linked_checkpoints(store, tmp_path / 'many', checkpoints_held)
  hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
  completed = subprocess.run(
    [sys.executable, '-c', _OPEN_FILES, str(many)],
    capture_output=True,
    text=True,
    timeout=120,
    preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)),
  )
  assert completed.returncode == 0, completed.stderr[-2000:]
  descriptors, soft = map(int, completed.stdout.split()[-2:])
  assert descriptors < checkpoints_held + 100
  message = 'Raised the soft limit on open files from 256 to '
  assert (message in completed.stderr) == raised
  assert (soft > checkpoints_held) if raised else soft == 256


_MAPS_TO_THE_LIMIT = """
import sys

from fixed_replay import batches
from fixed_replay.io import mapped

# Once first: what opening loads for good (modules, libraries) is loaded.
batches.open_buffer(sys.argv[1], {'sampling_threads': 0}).close()
with open(sys.argv[2], 'wb') as page:
  page.write(bytes(4096))
held = []
try:
  while True:  # A map each: a process's maps up to Linux's limit.
    held.append(mapped.map_file(sys.argv[2]))
except mapped.LimitError as error:
  print('mapping:', error)
del held[-100:]  # Room for a few checkpoints' tables, not for all of them.
try:
  batches.open_buffer(sys.argv[1], {'sampling_threads': 0})
except mapped.LimitError as error:
  print('opening:', error)
del held
"""


def test_a_process_out_of_maps_is_told_the_limit_and_its_fix(store, tmp_path):
  """Linux says "Cannot allocate memory" when a process holds
  vm.max_map_count maps; opening a store then names the limit and the
  fix instead."""
  import subprocess
  import sys

  with open('/proc/sys/vm/max_map_count') as limit_file:
    limit = int(limit_file.read())
  if limit > 300_000:
    pytest.skip(f'vm.max_map_count = {limit}: too many maps to fill here')
  many = _hard_linked_checkpoints(store, tmp_path / 'many', 100)
  completed = subprocess.run(
    [sys.executable, '-c', _MAPS_TO_THE_LIMIT, str(many), tmp_path / 'page'],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert completed.returncode == 0, completed.stderr[-2000:]
  lines = completed.stdout.splitlines()
  assert [line.split(':')[0] for line in lines] == ['mapping', 'opening']
  for line in lines:
    assert f'vm.max_map_count = {limit:,}' in line, line
    assert 'sudo sysctl -w vm.max_map_count=' in line
    assert 'Cannot allocate memory' not in line


def _mapped_pages(directory):
  """{path: (size kB, resident kB)} of this process's maps of files under
  `directory` (/proc/self/smaps)."""
  found, path = {}, None
  with open('/proc/self/smaps') as smaps:
    for line in smaps:
      fields = line.split()
      if '-' in fields[0] and len(fields) >= 5:  # A mapping's first line.
        name = fields[5] if len(fields) > 5 else ''
        path = name if name.startswith(str(directory)) else None
      elif path and fields[0] in ('Size:', 'Rss:'):
        size, resident = found.get(path, (0, 0))
        kilobytes = int(fields[1])
        found[path] = (
          (size + kilobytes, resident)
          if fields[0] == 'Size:'
          else (size, resident + kilobytes)
        )
  return found


def test_tables_in_the_page_cache_are_in_the_page_table_at_once(store):
  """A store whose tables are in the page cache is checked whole when it
  opens, through its maps: their pages enter the page table then, and
  sampling takes no minor fault on them (a 40-run mixture took one on most
  transitions)."""
  from fixed_replay import batches

  buffer = batches.open_buffer(str(store), {'sampling_threads': 0})
  tables = _mapped_pages(store)
  assert {os.path.basename(p) for p in tables} == {'tables', 'observation.dict'}
  for path, (size, resident) in tables.items():
    assert resident == size, (path, size, resident)
  buffer.close()


def _drop_from_page_cache(path):
  """Writes a file's pages back and drops them: the next read is from
  disk, as for a store larger than RAM."""
  descriptor = os.open(path, os.O_RDONLY)
  try:
    os.fsync(descriptor)
    os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
  finally:
    os.close(descriptor)
  assert not mapped.in_page_cache(mapped.map_file(str(path))), path


def test_a_store_on_disk_checks_each_block_when_a_batch_reads_it(
  store, oracles, tmp_path
):
  """Opened out of the page cache, a store reads no table but what opening
  uses (the valid-row mask, the ends of the unit index), and checks each
  block of its tables the first time a batch reads it: a damaged block
  is named by the batch that reads it, and batches that do not read it
  are Dopamine's transitions."""
  cold = tmp_path / 'store'
  shutil.copytree(store, cold)
  damaged = cold / 'checkpoint_3' / checkpoint_tables.FILE
  layout = manifest_lib.read_manifest(damaged.parent)['tables']['layout']
  with open(damaged, 'r+b') as stream:
    stream.seek(layout['reward']['offset'] + 500)
    byte = stream.read(1)
    stream.seek(-1, os.SEEK_CUR)
    stream.write(bytes([byte[0] ^ 0x10]))
  for suffix in (0, 1, 3, 7):
    _drop_from_page_cache(
      cold / f'checkpoint_{suffix}' / checkpoint_tables.FILE
    )
  buffer = _buffer(cold, prefetch=False)
  try:
    for stored in buffer.source._stored:  # Tables no batch read yet.
      tables = stored.tables
      for name in ('action', 'reward', 'terminal', 'unit_crc32'):
        block = tables.region(name)[0] // tables.block_bytes
        assert not tables.checked[block], (stored.suffix, name)
    table = buffer.source.table
    sound = np.asarray(table.valid_rows[table.position_of(1)])[::9]
    batch = buffer.sample_transition_batch(indices=sound, suffixes=1)
    assert_equals_oracle(as_dict(buffer, batch), oracles)
    # What the batch checked, its checkpoint's tables know: not read again.
    tables = buffer.source._stored[table.position_of(1)].tables
    assert tables.checked[tables.region('reward')[0] // tables.block_bytes]
    row = int(np.asarray(table.valid_rows[table.position_of(3)])[100])
    with pytest.raises(
      CheckpointError,
      match=r'checkpoint 3: block \d+ .*table reward\) is damaged',
    ) as raised:
      buffer.sample_transition_batch(indices=[row], suffixes=3)
    assert raised.value.path == str(damaged)
  finally:
    buffer.close()
