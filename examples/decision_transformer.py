"""A small Decision Transformer in PyTorch on fixed replay data, in one file.

Reads segments (K consecutive steps of one episode, each with its state,
action, return-to-go and timestep) of Dopamine replay checkpoints or a
compact store through `fixed_replay.torch.SegmentDataset`, trains a causal
transformer over (return-to-go, state, action) tokens to predict each step's
action (Chen et al., 2021), then plays the environment conditioned on a
target return and prints `eval return: <float>` last.

  fixed-replay generate --environment=cartpole --policy=scripted \
      --epsilon=0.5 --num_checkpoints=2 --checkpoint_rows=5000 \
      --output_dir=/tmp/cartpole_mixed
  python examples/decision_transformer.py --replay_dir=/tmp/cartpole_mixed

The data's mean return is about 130; conditioned on 200, the policy does
better than the data. An Atari game name (`--environment=Pong`) embeds each
(84, 84) x 4 state with Dopamine's Nature DQN torso instead of an MLP.
"""

import dataclasses
import math
import time

from absl import app
from absl import flags
from absl import logging
import numpy as np
import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import DataLoader

from fixed_replay.sources.dopamine import environments
from fixed_replay.torch import SegmentDataset

_REPLAY_DIR = flags.DEFINE_string(
  'replay_dir', None, 'Dopamine replay checkpoints or a compact store.'
)
_ENVIRONMENT = flags.DEFINE_string(
  'environment', 'cartpole', "'cartpole' or an Atari game name (Pong, ...)."
)
_NUM_UPDATES = flags.DEFINE_integer('num_updates', 500, 'Gradient updates.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seeds sampling, the network, the env.')
_TARGET_RETURN = flags.DEFINE_float(
  'target_return', None, 'Return to condition on (default 200 CartPole).'
)
_EVAL_EPISODES = flags.DEFINE_integer(
  'eval_episodes', None, 'Episodes played (default 10 CartPole, 1 Atari).'
)
_MAX_STEPS_PER_EPISODE = flags.DEFINE_integer(
  'max_steps_per_episode', None, 'Episode cut (default 200 / 27,000).'
)
_NUM_WORKERS = flags.DEFINE_integer('num_workers', 0, 'DataLoader workers.')


@dataclasses.dataclass(frozen=True)
class Config:
  """Everything the run depends on."""

  replay_dir: str
  environment: str  # 'cartpole' or an Atari game name.
  num_updates: int
  seed: int
  segment_length: int  # K, steps of context.
  batch_size: int
  embedding: int
  layers: int
  heads: int
  learning_rate: float
  return_scale: float  # Returns-to-go are divided by this.
  max_timestep: int  # Timesteps beyond are embedded as this one.
  target_return: float
  eval_episodes: int
  max_steps_per_episode: int
  num_workers: int

  @property
  def is_cartpole(self) -> bool:
    return self.environment == 'cartpole'


def make_config() -> Config:
  # CartPole: a context of 10 steps and a 1-layer, 32-wide model learn in
  # seconds on one core. Atari: Decision Transformer's own settings
  # (30 steps, 6 layers, 128 wide, returns scaled by 1; its batch 128 is
  # cut to 16 so that a CPU can run a few updates).
  cartpole = _ENVIRONMENT.value == 'cartpole'
  return Config(
    replay_dir=_REPLAY_DIR.value,
    environment=_ENVIRONMENT.value,
    num_updates=_NUM_UPDATES.value,
    seed=_SEED.value,
    segment_length=10 if cartpole else 30,
    batch_size=64 if cartpole else 16,
    embedding=32 if cartpole else 128,
    layers=1 if cartpole else 6,
    heads=1 if cartpole else 8,
    learning_rate=1e-3 if cartpole else 6e-4,
    return_scale=100.0 if cartpole else 1.0,
    max_timestep=environments.ENVIRONMENT_SPECS[
      'cartpole' if cartpole else 'atari'
    ].max_steps_per_episode,
    target_return=_TARGET_RETURN.value or (200.0 if cartpole else 20.0),
    eval_episodes=_EVAL_EPISODES.value or (10 if cartpole else 1),
    max_steps_per_episode=_MAX_STEPS_PER_EPISODE.value
    or (200 if cartpole else environments.ATARI_MAX_STEPS_PER_EPISODE),
    num_workers=_NUM_WORKERS.value,
  )


def state_encoder(observation_shape, stack_size, embedding) -> nn.Module:
  """Embeds one step's state: Nature DQN's torso for frames, else an MLP."""
  if len(observation_shape) == 2 and observation_shape[0] >= 36:
    return nn.Sequential(
      nn.Conv2d(stack_size, 32, 8, stride=4),
      nn.ReLU(),
      nn.Conv2d(32, 64, 4, stride=2),
      nn.ReLU(),
      nn.Conv2d(64, 64, 3, stride=1),
      nn.ReLU(),
      nn.Flatten(),
      nn.LazyLinear(embedding),
      nn.Tanh(),
    )
  size = stack_size * math.prod(observation_shape)
  return nn.Sequential(nn.Flatten(), nn.Linear(size, embedding), nn.Tanh())


class DecisionTransformer(nn.Module):
  """Predicts a_t from (R_1, s_1, a_1, ..., R_t, s_t) with causal attention."""

  def __init__(self, config, observation_shape, stack_size, num_actions):
    super().__init__()
    d = config.embedding
    self.config = config
    self.is_image = len(observation_shape) == 2 and observation_shape[0] >= 36
    self.state = state_encoder(observation_shape, stack_size, d)
    self.return_to_go = nn.Linear(1, d)
    self.action = nn.Embedding(num_actions, d)
    self.timestep = nn.Embedding(config.max_timestep + 1, d)
    self.norm = nn.LayerNorm(d)
    layer = nn.TransformerEncoderLayer(
      d, config.heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True
    )
    self.transformer = nn.TransformerEncoder(layer, config.layers)
    self.head = nn.Linear(d, num_actions)

  def forward(self, observation, action, return_to_go, timestep):
    """Action logits (B, K, A) from each step's state token.

    observation: (B, K, stack, *observation_shape); the others (B, K).
    """
    b, k = action.shape
    frames = observation.reshape((b * k,) + observation.shape[2:]).float()
    if self.is_image:
      frames = frames / 255.0
    timestep = timestep.clamp(0, self.config.max_timestep).long()
    time = self.timestep(timestep)
    tokens = torch.stack(
      [
        self.return_to_go(return_to_go[..., None] / self.config.return_scale)
        + time,
        self.state(frames).reshape(b, k, -1) + time,
        self.action(action.long()) + time,
      ],
      dim=2,
    ).reshape(b, 3 * k, -1)
    causal = nn.Transformer.generate_square_subsequent_mask(3 * k)
    hidden = self.transformer(self.norm(tokens), mask=causal, is_causal=True)
    return self.head(hidden[:, 1::3])  # The state tokens.


def make_environment(config: Config):
  if config.is_cartpole:
    env = environments.create_environment('cartpole')
  else:
    env = environments.create_environment('atari', game=config.environment)
  env.environment.reset(seed=config.seed)
  return env


def evaluate(config, model, observation_shape, stack_size) -> float:
  """Mean return over `eval_episodes` episodes, conditioned on the target."""
  env = make_environment(config)
  k = config.segment_length
  returns = []
  for _ in range(config.eval_episodes):
    # Dopamine's agents stack the newest frame last and start from zeros.
    stack = np.zeros(observation_shape + (stack_size,), np.float32)
    states, actions, to_go = [], [], []
    observation = env.reset()
    total, steps, done = 0.0, 0, False
    while not done and steps < config.max_steps_per_episode:
      stack = np.roll(stack, -1, axis=-1)
      stack[..., -1] = np.reshape(observation, observation_shape)
      states.append(np.moveaxis(stack, -1, 0).copy())
      to_go.append(config.target_return - total)
      actions.append(0)  # Not seen by its own state token (causal).
      first = max(0, len(states) - k)
      with torch.no_grad():
        logits = model(
          torch.from_numpy(np.stack(states[first:])[None]),
          torch.tensor([actions[first:]]),
          torch.tensor([to_go[first:]], dtype=torch.float32),
          torch.arange(first, len(states))[None],
        )
      actions[-1] = int(logits[0, -1].argmax())
      observation, reward, done, _ = env.step(actions[-1])
      total += float(reward)
      steps += 1
    returns.append(total)
  return float(np.mean(returns))


def main(argv):
  del argv
  config = make_config()
  torch.manual_seed(config.seed)
  # Small models gain nothing from more threads on a shared machine.
  torch.set_num_threads(1)
  num_actions = make_environment(config).action_space.n

  # Shapes, dtypes and stack size are read from the data.
  dataset = SegmentDataset(
    config.replay_dir,
    channels_first=True,
    num_batches=config.num_updates,
    segment_length=config.segment_length,
    batch_size=config.batch_size,
    seed=config.seed,
  )
  # (B, K, *observation_shape, stack), as Dopamine stacks.
  element = dataset.buffer.get_transition_elements(1)[0]
  stack_size = element.shape[-1]
  observation_shape = tuple(element.shape[2:-1])
  loader = DataLoader(dataset, batch_size=None, num_workers=config.num_workers)

  model = DecisionTransformer(
    config, observation_shape, stack_size, num_actions
  )
  optimizer = torch.optim.AdamW(
    model.parameters(), lr=config.learning_rate, weight_decay=1e-4
  )
  began = time.perf_counter()
  model.train()
  for update, batch in enumerate(loader, start=1):
    logits = model(
      batch['observation'],
      batch['action'],
      batch['return_to_go'],
      batch['timestep'],
    )
    mask = batch['mask']
    loss = functional.cross_entropy(logits[mask], batch['action'][mask].long())
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    if update % 250 == 0 or update == config.num_updates:
      logging.info(
        'update %d/%d  loss %.4f  %.1f updates/s',
        update,
        config.num_updates,
        loss.item(),
        update / (time.perf_counter() - began),
      )
  dataset.close()

  model.eval()
  value = evaluate(config, model, observation_shape, stack_size)
  print(f'eval return: {value:.2f}')


if __name__ == '__main__':
  flags.mark_flag_as_required('replay_dir')
  app.run(main)
