"""Checkpoints written by Dopamine's own replay buffer, for use as oracles.

Frames come from a real Atari game (Pong through Dopamine's `atari_lib`), so
the files are what Dopamine writes for Atari, compressed like real data.
"""

# ruff: noqa: I001  (fixed_replay must be imported before Dopamine)
import functools
import hashlib
import os

import fixed_replay  # noqa: F401
from dopamine.discrete_domains import atari_lib
from dopamine.tf.replay_memory import circular_replay_buffer
import numpy as np

ATARI_SHAPE = (84, 84)


@functools.lru_cache(maxsize=4)
def pong_frames(num_frames, seed=0):
  """Returns (frames, rewards) from playing Pong with random actions."""
  rng = np.random.default_rng(seed)
  env = atari_lib.create_atari_environment('Pong', sticky_actions=True)
  env.environment.reset(seed=seed)
  frames = np.empty((num_frames,) + ATARI_SHAPE, np.uint8)
  rewards = np.empty(num_frames, np.float32)
  observation = env.reset()
  for i in range(num_frames):
    frames[i] = observation[..., 0]
    observation, rewards[i], terminal, _ = env.step(rng.integers(6))
    if terminal:
      observation = env.reset()
  return frames, rewards


def make_buffer(
  capacity,
  stack_size=4,
  update_horizon=1,
  gamma=0.99,
  observation_shape=ATARI_SHAPE,
  extra_storage_types=None,
):
  """Returns a Dopamine OutOfGraphReplayBuffer that never deletes files."""
  return circular_replay_buffer.OutOfGraphReplayBuffer(
    observation_shape=observation_shape,
    stack_size=stack_size,
    replay_capacity=capacity,
    batch_size=32,
    update_horizon=update_horizon,
    gamma=gamma,
    extra_storage_types=extra_storage_types,
    checkpoint_duration=10**9,
  )


def fill(buffer, num_adds, seed=0, terminal_prob=0.01, episode_end_prob=0.0):
  """Adds num_adds real Pong transitions the way a Dopamine agent does.

  Args:
    buffer: OutOfGraphReplayBuffer with observation shape (84, 84).
    num_adds: int, calls to `add` (Dopamine adds padding rows on top).
    seed: int.
    terminal_prob: float, chance that a transition ends its episode.
    episode_end_prob: float, chance that an episode is cut without terminal
      (recorded only in episode_end_indices).

  Returns:
    The buffer.
  """
  rng = np.random.default_rng(seed)
  frames, rewards = pong_frames(num_adds, seed)
  for i in range(num_adds):
    terminal = rng.random() < terminal_prob
    episode_end = terminal or rng.random() < episode_end_prob
    buffer.add(
      frames[i],
      int(rng.integers(6)),
      float(rewards[i] or rng.normal()),
      terminal,
      episode_end=episode_end,
    )
  return buffer


def write_checkpoint(
  directory, suffix, capacity, num_adds, seed=0, **buffer_kwargs
):
  """Fills a Dopamine buffer with Pong transitions and saves it.

  Returns:
    The Dopamine buffer that wrote the files (the oracle).
  """
  terminal_prob = buffer_kwargs.pop('terminal_prob', 0.01)
  episode_end_prob = buffer_kwargs.pop('episode_end_prob', 0.0)
  buffer = fill(
    make_buffer(capacity, **buffer_kwargs),
    num_adds,
    seed,
    terminal_prob,
    episode_end_prob,
  )
  buffer.save(str(directory), suffix)
  return buffer


def load_oracle(directory, suffix, capacity, **buffer_kwargs):
  """Loads a checkpoint with Dopamine's own `load`."""
  buffer = make_buffer(capacity, **buffer_kwargs)
  buffer.load(str(directory), suffix)
  return buffer


def write_published_checkpoint(directory, suffix, capacity, index=0, seed=0):
  """Writes checkpoint `index` of a run in the published layout.

  batch_rl's logger dumps its buffer when add_count % capacity == capacity -
  1: checkpoint k has add_count (k + 1) * capacity - 1 and its cursor at the
  last row.

  Returns:
    The Dopamine buffer that wrote the files.
  """
  target = (index + 1) * capacity - 1
  buffer = make_buffer(capacity)
  rng = np.random.default_rng(seed)
  frames, rewards = pong_frames(target, seed)
  step = 0
  while buffer.add_count < target:
    # Near the target no episode may end: a new one would add padding rows
    # and overshoot.
    terminal = target - buffer.add_count > 8 and rng.random() < 0.01
    buffer.add(
      frames[step % len(frames)],
      int(rng.integers(6)),
      float(np.clip(rewards[step % len(frames)], -1, 1)),
      terminal,
    )
    step += 1
  assert buffer.add_count == target
  buffer.save(str(directory), suffix)
  return buffer


CARTPOLE_SHAPE = (4, 1)


def write_cartpole_run(directory, rows, num_checkpoints=2, seed=0):
  """Writes checkpoints 0..n-1 of random CartPole play with Dopamine's buffer.

  One buffer of `rows` rows (stack 1, float64 observations, as Dopamine's
  CartPole configs) is saved after every `rows` adds.
  """
  from dopamine.discrete_domains import gym_lib

  env = gym_lib.create_gym_environment('CartPole', 'v0')
  rng = np.random.default_rng(seed)
  env.environment.reset(seed=seed)
  buffer = circular_replay_buffer.OutOfGraphReplayBuffer(
    observation_shape=CARTPOLE_SHAPE,
    stack_size=1,
    replay_capacity=rows,
    batch_size=32,
    observation_dtype=np.float64,
    checkpoint_duration=10**9,
  )
  observation = env.reset()
  for suffix in range(num_checkpoints):
    for _ in range(rows):
      action = int(rng.integers(2))
      next_observation, reward, terminal, _ = env.step(action)
      buffer.add(
        np.reshape(observation, CARTPOLE_SHAPE), action, reward, terminal
      )
      observation = env.reset() if terminal else next_observation
    buffer.save(str(directory), suffix)


def file_digests(directory, skip_prefix='.convert'):
  """{relative path: sha256} of every file under directory.

  Files whose name starts with skip_prefix (a converter's locks and job
  token by default; None keeps every file) are left out.
  """
  digests = {}
  for root, _, names in os.walk(directory):
    for name in names:
      if skip_prefix and name.startswith(skip_prefix):
        continue
      path = os.path.join(root, name)
      with open(path, 'rb') as stream:
        digests[os.path.relpath(path, directory)] = hashlib.sha256(
          stream.read()
        ).hexdigest()
  return digests


# What the run's dictionary decides: the units, their index (in the tables)
# and the manifest.
_DICTIONARY_BOUND = ('observation.dict', 'observation.units', 'manifest.json')
_UNIT_TABLES = ('unit_sizes', 'unit_anchors', 'unit_crc32')


def content_digests(store):
  """file_digests of a compact store but what its run's dictionary decides,
  with each table of a checkpoint's tables file apart (its unit index left
  out), plus each checkpoint's CRC-32 of its frames, decoded: equal for
  stores of the same rows and frames, whatever dictionary compressed them.
  `store` may be a checkpoint's directory."""
  from fixed_replay.store import checkpoint_tables
  from fixed_replay.store import manifest as manifest_lib

  digests = {}
  for path, digest in file_digests(store).items():
    name = os.path.basename(path)
    if name == checkpoint_tables.FILE:
      directory = os.path.join(store, os.path.dirname(path))
      manifest = manifest_lib.read_manifest(directory)
      tables = checkpoint_tables.CheckpointTables(directory, manifest)
      for table in manifest['tables']['layout']:
        if table not in _UNIT_TABLES:
          digests[f'{path}:{table}'] = hashlib.sha256(
            tables[table].tobytes()
          ).hexdigest()
      digests[path + ':frames'] = manifest['observation']['frames_crc32']
    elif name not in _DICTIONARY_BOUND:
      digests[path] = digest
  return digests


def rewrite_tables(directory, **replaced):
  """Rewrites a stored checkpoint's tables with some `replaced` (name to
  array), its manifest describing them, so that it opens as sound: how a
  test stores what a writer would not."""
  from fixed_replay.store import checkpoint_tables
  from fixed_replay.store import manifest as manifest_lib

  manifest = manifest_lib.read_manifest(directory)
  tables = checkpoint_tables.CheckpointTables(directory, manifest)
  arrays = {
    name: np.array(replaced.get(name, tables[name]))
    for name in manifest['tables']['layout']
  }
  del tables
  data, manifest['tables'] = checkpoint_tables.pack(arrays)
  path = os.path.join(directory, checkpoint_tables.FILE)
  with open(path + '.new', 'wb') as stream:  # A new file: maps stay sound.
    stream.write(data.tobytes())
  os.replace(path + '.new', path)
  manifest['files'][checkpoint_tables.FILE] = manifest_lib.file_entry(path)
  manifest_lib.write_manifest(directory, manifest)
