"""One RL Unplugged episode: a `tf.train.Example`, validated, and its frames.

Each record of a shard is a whole episode: `checkpoint_idx`, `episode_idx`,
per-step `observations` (84x84 grayscale PNGs), `actions`,
`clipped_rewards` and `discounts`, and usually `unclipped_rewards` (the
game's own reward, kept as the extra element `unclipped_reward`). Parsing
checks what Dopamine's layout needs of them; frames are decoded in slices,
on demand. Every problem is a CheckpointError naming the shard and the
episode.
"""

import dataclasses

import cv2
from google.protobuf import message
import numpy as np

from fixed_replay.errors import CheckpointError
from fixed_replay.io import tfrecord

NUM_CHECKPOINTS = 50  # Checkpoints of a DQN Replay Dataset run: 0..49.
FRAME_SHAPE = (84, 84)
_FRAME_BYTES = 84 * 84  # uint8: a 16-bit PNG of that shape has twice this.
# Keys a record must have, with the kind of list each holds.
REQUIRED_KEYS = {
  'checkpoint_idx': 'int64_list',
  'episode_idx': 'int64_list',
  'observations': 'bytes_list',
  'actions': 'int64_list',
  'clipped_rewards': 'float_list',
  'discounts': 'float_list',
}
_STEP_KEYS = ('observations', 'actions', 'clipped_rewards', 'discounts')
# Per-step, kept when present: the game score before clipping.
UNCLIPPED_KEY = 'unclipped_rewards'
# Dopamine stores actions as int32, and the conversion episode ids.
_MAX_ACTION = 2**31 - 1


@dataclasses.dataclass
class Episode:
  """One validated episode.

  Attributes:
    shard: str, the shard (or split) it came from.
    record: int, its position there (0-based).
    checkpoint_idx: int.
    episode_idx: int.
    frames: sequence of PNG-encoded frames (bytes), one per step.
    actions: int32 array.
    rewards: float32 array, the clipped rewards.
    terminal: bool, whether the last step ended the episode (discount 0).
    unclipped_rewards: float32 array, the game's rewards as recorded, or
      None when the record has none.
  """

  shard: str
  record: int
  checkpoint_idx: int
  episode_idx: int
  frames: object
  actions: np.ndarray
  rewards: np.ndarray
  terminal: bool
  unclipped_rewards: np.ndarray | None = None

  @property
  def num_steps(self) -> int:
    return len(self.actions)

  @property
  def episode_return(self) -> float:
    return float(np.sum(self.rewards, dtype=np.float64))

  def where(self) -> str:
    """Names the episode for messages."""
    return (
      f'episode {self.episode_idx} of checkpoint {self.checkpoint_idx} '
      f'(record {self.record})'
    )


def check_checkpoint_idx(
  path: str, record: int, checkpoint_idx: int, episode_idx: int
) -> None:
  if not 0 <= checkpoint_idx < NUM_CHECKPOINTS:
    raise CheckpointError(
      path,
      f'episode {episode_idx} (record {record}): checkpoint_idx '
      f'{checkpoint_idx} is outside 0..{NUM_CHECKPOINTS - 1}',
    )
  if not -(2**31) <= episode_idx <= _MAX_ACTION:  # Stored as int32.
    raise CheckpointError(
      path, f'record {record}: episode_idx {episode_idx} is outside int32'
    )


def check_steps(episode: 'Episode', terminals: np.ndarray) -> None:
  """Checks an episode's per-step arrays; `terminals` flags each step."""
  if not episode.num_steps:
    raise CheckpointError(episode.shard, f'{episode.where()}: no steps')
  early = np.flatnonzero(terminals[:-1])
  if len(early):
    raise CheckpointError(
      episode.shard,
      f'{episode.where()}: step {int(early[0])} of {episode.num_steps} ends '
      'the episode (discount 0) before its last step',
    )


def check_actions(path: str, where: str, values: np.ndarray) -> np.ndarray:
  """Returns int64 actions as int32, refusing what Dopamine cannot store."""
  actions = np.asarray(values, dtype=np.int64)
  if len(actions) and (actions.min() < 0 or actions.max() > _MAX_ACTION):
    raise CheckpointError(
      path,
      f'{where}: actions outside [0, {_MAX_ACTION}]: {actions.min()}..'
      f'{actions.max()}',
    )
  return actions.astype(np.int32)


def _values(feature, key, kind: str, path: str, record):
  if feature.WhichOneof('kind') != kind:
    raise CheckpointError(
      path,
      f'record {record}: {key} holds {feature.WhichOneof("kind")}, expected '
      f'{kind}',
    )
  return getattr(feature, kind).value


def parse_episode(data: bytes, path: str, record: int) -> 'Episode':
  """Parses and validates one serialized tf.train.Example episode.

  Args:
    data: bytes of the record.
    path: str, the shard (for messages).
    record: int, the record's position in the shard.

  Returns:
    Episode.

  Raises:
    CheckpointError: naming the shard and the episode, for an unparsable
      record, a missing key, per-step lists of unequal length, a
      checkpoint_idx outside 0..49, a negative or too large action, a
      discount of 0 before the last step, or an episode without steps.
  """
  example = tfrecord.Example()
  try:
    example.ParseFromString(data)
  except message.DecodeError as error:
    raise CheckpointError(
      path, f'record {record} is not a tf.train.Example: {error}'
    ) from error
  features = example.features.feature
  missing = [key for key in REQUIRED_KEYS if key not in features]
  if missing:
    known = ''
    if 'episode_idx' in features and features['episode_idx'].int64_list.value:
      known = f' (episode {features["episode_idx"].int64_list.value[0]})'
    raise CheckpointError(
      path, f'record {record}{known} has no key(s) {", ".join(missing)}'
    )
  values = {
    key: _values(features[key], key, kind, path, record)
    for key, kind in REQUIRED_KEYS.items()
  }
  for key in ('checkpoint_idx', 'episode_idx'):
    if len(values[key]) != 1:
      raise CheckpointError(
        path, f'record {record}: {key} holds {len(values[key])} values, not 1'
      )
  checkpoint_idx = int(values['checkpoint_idx'][0])
  episode_idx = int(values['episode_idx'][0])
  where = f'episode {episode_idx} of checkpoint {checkpoint_idx} (record '
  where += f'{record})'
  check_checkpoint_idx(path, record, checkpoint_idx, episode_idx)
  if UNCLIPPED_KEY in features:
    values[UNCLIPPED_KEY] = _values(
      features[UNCLIPPED_KEY], UNCLIPPED_KEY, 'float_list', path, record
    )
  lengths = {key: len(values[key]) for key in _STEP_KEYS + (UNCLIPPED_KEY,)}
  lengths = {key: n for key, n in lengths.items() if key in values}
  if len(set(lengths.values())) > 1:
    raise CheckpointError(
      path, f'{where}: per-step lists of unequal length {lengths}'
    )
  actions = check_actions(path, where, values['actions'])
  discounts = np.asarray(values['discounts'], dtype=np.float32)
  episode = Episode(
    shard=path,
    record=record,
    checkpoint_idx=checkpoint_idx,
    episode_idx=episode_idx,
    frames=values['observations'],
    actions=actions,
    rewards=np.asarray(values['clipped_rewards'], dtype=np.float32),
    terminal=bool(len(discounts)) and bool(discounts[-1] == 0),
  )
  if UNCLIPPED_KEY in values:
    episode.unclipped_rewards = np.asarray(values[UNCLIPPED_KEY], np.float32)
  check_steps(episode, discounts == 0)
  return episode


def decode_frames(episode: 'Episode', start: int, out: np.ndarray) -> None:
  """Decodes frames [start, start + len(out)) of an episode into `out`.

  Args:
    episode: Episode.
    start: int, first step.
    out: writable uint8 array (n, 84, 84).

  Raises:
    CheckpointError: naming shard, episode and step, for a PNG that does
      not decode or is not an 84x84 8-bit grayscale image.
  """
  # The hot loop of a conversion (~1M frames a shard): one C-level slice of
  # the PNGs, one cheap test per frame, the slow checks only on a miss.
  pngs = episode.frames[start : start + len(out)]
  decode, flags, shape = cv2.imdecode, cv2.IMREAD_UNCHANGED, FRAME_SHAPE
  for i, png in enumerate(pngs):
    frame = decode(np.frombuffer(png, np.uint8), flags)
    if (
      frame is not None
      and frame.shape == shape
      and frame.nbytes == (_FRAME_BYTES)
    ):
      out[i] = frame
    else:
      out[i] = _checked_frame(episode, start + i, frame)


def _checked_frame(episode, step, frame):
  """Returns an odd but acceptable frame (84x84x1) or raises."""
  if frame is None:
    raise CheckpointError(
      episode.shard,
      f'{episode.where()}: step {step}: the PNG observation does not decode',
    )
  if frame.dtype != np.uint8 or frame.shape != FRAME_SHAPE + (1,):
    raise CheckpointError(
      episode.shard,
      f'{episode.where()}: step {step}: observation is {frame.dtype} '
      f'{frame.shape}, expected uint8 {FRAME_SHAPE}',
    )
  return frame.reshape(FRAME_SHAPE)
