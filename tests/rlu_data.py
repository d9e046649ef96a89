"""RL Unplugged shards of real Atari play, and Dopamine oracles of them.

Episodes are played in Breakout through Dopamine's `atari_lib` (random
actions: an episode lasts ~150-250 steps and ends on a real terminal);
frames are PNG-encoded with OpenCV and written, one `tf.train.Example` per
episode, with `tf.io.TFRecordWriter(path, options='GZIP')` in RL Unplugged's
layout. The oracle is a Dopamine `OutOfGraphReplayBuffer` that `add`s the
same episodes in episode_idx order.
"""

# ruff: noqa: I001  (fixed_replay must be imported before Dopamine)
import dataclasses
import functools
import os

import fixed_replay  # noqa: F401
import cv2
from dopamine.discrete_domains import atari_lib
from dopamine.tf.replay_memory import circular_replay_buffer
import numpy as np

FRAME_SHAPE = (84, 84)


@dataclasses.dataclass
class PlayedEpisode:
  """One episode as RL Unplugged stores it (frames not yet encoded)."""

  frames: np.ndarray  # (n, 84, 84) uint8
  actions: np.ndarray  # int64
  rewards: np.ndarray  # float32, clipped
  terminal: bool  # whether the last step ended the game (discount 0)
  checkpoint_idx: int = 0
  episode_idx: int = 0
  game_rewards: np.ndarray = None  # float32, the game's own (unclipped)

  @property
  def discounts(self):
    discounts = np.ones(len(self.actions), np.float32)
    if self.terminal:
      discounts[-1] = 0.0
    return discounts


@functools.lru_cache(maxsize=4)
def _play(num_episodes, max_steps, seed, game):
  env = atari_lib.create_atari_environment(game, sticky_actions=True)
  env.environment.reset(seed=seed)
  rng = np.random.default_rng(seed)
  episodes = []
  for _ in range(num_episodes):
    observation = env.reset()
    frames, actions, rewards, game_rewards = [], [], [], []
    terminal = False
    while len(actions) < max_steps and not terminal:
      frames.append(observation[..., 0].copy())
      action = int(rng.integers(env.action_space.n))
      observation, reward, terminal, _ = env.step(action)
      actions.append(action)
      rewards.append(np.clip(reward, -1, 1))
      game_rewards.append(reward)
    episodes.append(
      PlayedEpisode(
        np.stack(frames),
        np.array(actions, np.int64),
        np.array(rewards, np.float32),
        bool(terminal),
        game_rewards=np.array(game_rewards, np.float32),
      )
    )
  return tuple(episodes)


def play(num_episodes, max_steps=400, seed=0, game='Breakout'):
  """Plays real episodes (copies, so callers may relabel them)."""
  played = _play(num_episodes, max_steps, seed, game)
  return [dataclasses.replace(e) for e in played]


def encode_png(frame):
  ok, data = cv2.imencode('.png', frame)
  assert ok
  return data.tobytes()


def example_bytes(episode, **overrides):
  """The serialized tf.train.Example of an episode, RL Unplugged's keys.

  Args:
    episode: PlayedEpisode.
    **overrides: key -> tf.train.Feature to replace (or None to drop).
  """
  import tensorflow as tf

  def ints(values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

  def floats(values):
    return tf.train.Feature(float_list=tf.train.FloatList(value=values))

  episode_return = float(np.sum(episode.rewards))
  features = {
    'checkpoint_idx': ints([episode.checkpoint_idx]),
    'episode_idx': ints([episode.episode_idx]),
    'episode_return': floats([episode_return]),
    'clipped_episode_return': floats([episode_return]),
    'observations': tf.train.Feature(
      bytes_list=tf.train.BytesList(
        value=[encode_png(f) for f in episode.frames]
      )
    ),
    'actions': ints(episode.actions.tolist()),
    # The game's rewards (in Breakout's random play mostly 1, as clipped).
    'unclipped_rewards': floats(episode.game_rewards.tolist()),
    'clipped_rewards': floats(episode.rewards.tolist()),
    'discounts': floats(episode.discounts.tolist()),
  }
  for key, value in overrides.items():
    if value is None:
      features.pop(key)
    else:
      features[key] = value
  example = tf.train.Example(features=tf.train.Features(feature=features))
  return example.SerializeToString()


def shard_path(directory, run, number, total):
  return os.path.join(directory, f'run_{run}-{number:05d}-of-{total:05d}')


def write_shard(path, records):
  """Writes serialized records (bytes) or PlayedEpisodes as a GZIP TFRecord."""
  import tensorflow as tf

  with tf.io.TFRecordWriter(str(path), options='GZIP') as writer:
    for record in records:
      if isinstance(record, PlayedEpisode):
        record = example_bytes(record)
      writer.write(record)
  return path


def relabel(episode, checkpoint_idx, episode_idx):
  """A copy of an episode with another checkpoint_idx and episode_idx."""
  return dataclasses.replace(
    episode, checkpoint_idx=checkpoint_idx, episode_idx=episode_idx
  )


def rows_of(episodes, stack_size=4):
  """Rows Dopamine's add writes for the episodes (padding included)."""
  return sum(len(e.actions) + stack_size - 1 for e in episodes)


# The extra storage elements an RL Unplugged conversion writes, as Dopamine
# declares them.
UNCLIPPED_REWARD = circular_replay_buffer.ReplayElement(
  'unclipped_reward', (), np.float32
)
EPISODE_IDX = circular_replay_buffer.ReplayElement('episode_idx', (), np.int32)


def make_buffer(
  capacity, stack_size=4, update_horizon=1, gamma=0.99, extras=None
):
  return circular_replay_buffer.OutOfGraphReplayBuffer(
    observation_shape=FRAME_SHAPE,
    stack_size=stack_size,
    replay_capacity=capacity,
    batch_size=32,
    update_horizon=update_horizon,
    gamma=gamma,
    extra_storage_types=extras,
    checkpoint_duration=10**9,
  )


def _extra_values(episode, step, extras):
  values = {'unclipped_reward': episode.game_rewards[step]}
  values['episode_idx'] = episode.episode_idx
  return [values[e.name] for e in extras or ()]


def oracle(
  episodes, stack_size=4, update_horizon=1, gamma=0.99, spare=100, extras=None
):
  """A Dopamine buffer that `add`ed the episodes in episode_idx order.

  terminal = (discount == 0); an episode without a terminal step is ended
  with `episode_end=True` on its last step (see the README). `extras`:
  Dopamine ReplayElements among UNCLIPPED_REWARD and EPISODE_IDX, added
  with each step as Dopamine's `add` takes extra elements.
  """
  ordered = sorted(episodes, key=lambda e: e.episode_idx)
  buffer = make_buffer(
    rows_of(ordered, stack_size) + spare,
    stack_size,
    update_horizon,
    gamma,
    extras,
  )
  for episode in ordered:
    last = len(episode.actions) - 1
    for step in range(len(episode.actions)):
      buffer.add(
        episode.frames[step],
        int(episode.actions[step]),
        float(episode.rewards[step]),
        int(episode.discounts[step] == 0),
        *_extra_values(episode, step, extras),
        episode_end=step == last,
      )
  return buffer


def valid_rows(buffer, num_rows):
  return [i for i in range(num_rows) if buffer.is_valid_transition(i)]
