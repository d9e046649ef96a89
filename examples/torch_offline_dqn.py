"""Offline DQN in PyTorch on a fixed replay dataset, in one file.

Reads Dopamine replay checkpoints or a compact store through
`fixed_replay.torch.ReplayDataset` (each item is one minibatch the library's
buffer drew, so transitions are exactly Dopamine's), trains a Q-network with
Dopamine's DQN loss (Huber on the one-step TD error, a target network synced
every `target_update_period` updates), then plays the greedy policy in the
environment and prints `eval return: <float>` last.

  fixed-replay generate --environment=cartpole --policy=random \
      --num_checkpoints=2 --checkpoint_rows=5000 --output_dir=/tmp/cartpole
  python examples/torch_offline_dqn.py --replay_dir=/tmp/cartpole \
      --environment=cartpole --num_updates=4000

An Atari game name (`--environment=Pong`) trains Dopamine's Nature DQN
network on its (84, 84) x 4 frames instead; the defaults then follow
Dopamine's JAX DQN Atari config (Adam 6.25e-5, batch 32).

With `--checkpoint_dir`, the networks, the optimizer and the loader's
state (torchdata's StatefulDataLoader: where each worker's stream is) are
saved every `--save_every` updates; `--resume` goes on from the latest, and
draws exactly the batches the run would have drawn had it not stopped.
"""

import copy
import dataclasses
import glob
import os
import time

from absl import app
from absl import flags
from absl import logging
import numpy as np
import torch
from torch import nn
from torch.nn import functional
from torchdata.stateful_dataloader import StatefulDataLoader

from fixed_replay.sources.dopamine import environments
from fixed_replay.torch import ReplayDataset

_REPLAY_DIR = flags.DEFINE_string(
  'replay_dir', None, 'Dopamine replay checkpoints or a compact store.'
)
_ENVIRONMENT = flags.DEFINE_string(
  'environment', 'cartpole', "'cartpole' or an Atari game name (Pong, ...)."
)
_NUM_UPDATES = flags.DEFINE_integer('num_updates', 4000, 'Gradient updates.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seeds sampling, the network, the env.')
_EVAL_EPISODES = flags.DEFINE_integer(
  'eval_episodes', None, 'Greedy episodes (default 10 CartPole, 1 Atari).'
)
_EVAL_EVERY = flags.DEFINE_integer(
  'eval_every', 0, 'Also evaluate every this many updates (0: at the end).'
)
_MAX_STEPS_PER_EPISODE = flags.DEFINE_integer(
  'max_steps_per_episode', None, 'Episode cut (default 200 / 27,000).'
)
_NUM_WORKERS = flags.DEFINE_integer('num_workers', 0, 'DataLoader workers.')
_TORCH_THREADS = flags.DEFINE_integer(
  'torch_threads', 1, 'Intra-op threads (small networks run best on one).'
)
_CHECKPOINT_DIR = flags.DEFINE_string(
  'checkpoint_dir', None, 'Where to save update_N.pt (None: nothing saved).'
)
_SAVE_EVERY = flags.DEFINE_integer('save_every', 1000, 'Updates between saves.')
_RESUME = flags.DEFINE_bool(
  'resume', False, "Go on from --checkpoint_dir's latest update_N.pt."
)


@dataclasses.dataclass(frozen=True)
class Config:
  """Everything the run depends on."""

  replay_dir: str
  environment: str  # 'cartpole' or an Atari game name.
  num_updates: int
  seed: int
  batch_size: int
  learning_rate: float
  adam_eps: float
  gamma: float
  target_update_period: int  # In gradient updates.
  eval_episodes: int
  eval_every: int  # 0: only after training.
  max_steps_per_episode: int
  num_workers: int
  torch_threads: int
  checkpoint_dir: str | None
  save_every: int
  resume: bool

  @property
  def is_cartpole(self) -> bool:
    return self.environment == 'cartpole'


def make_config() -> Config:
  cartpole = _ENVIRONMENT.value == 'cartpole'
  # CartPole: configs/cartpole/dqn.gin's network, batch and Adam epsilon,
  # with CleanRL's CartPole DQN learning rate (2.5e-4) and target period
  # (500): with dqn.gin's 1e-3 and 100, offline DQN on random play peaks
  # at 200 and then falls back below 120 by update 4,000. Atari: Dopamine's
  # JAX DQN config (target synced every 8,000 agent steps = 2,000 updates).
  return Config(
    replay_dir=_REPLAY_DIR.value,
    environment=_ENVIRONMENT.value,
    num_updates=_NUM_UPDATES.value,
    seed=_SEED.value,
    batch_size=128 if cartpole else 32,
    learning_rate=2.5e-4 if cartpole else 6.25e-5,
    adam_eps=3.125e-4 if cartpole else 1.5e-4,
    gamma=0.99,
    target_update_period=500 if cartpole else 2000,
    eval_episodes=_EVAL_EPISODES.value or (10 if cartpole else 1),
    eval_every=_EVAL_EVERY.value,
    max_steps_per_episode=_MAX_STEPS_PER_EPISODE.value
    or (200 if cartpole else environments.ATARI_MAX_STEPS_PER_EPISODE),
    num_workers=_NUM_WORKERS.value,
    torch_threads=_TORCH_THREADS.value,
    checkpoint_dir=_CHECKPOINT_DIR.value,
    save_every=_SAVE_EVERY.value,
    resume=_RESUME.value,
  )


class CartPoleQNetwork(nn.Module):
  """Dopamine's classic-control MLP: inputs rescaled to [-1, 1], 64 x 64."""

  def __init__(self, num_actions: int):
    super().__init__()
    from dopamine.discrete_domains import gym_lib

    low = torch.tensor(gym_lib.CARTPOLE_MIN_VALS, dtype=torch.float32)
    high = torch.tensor(gym_lib.CARTPOLE_MAX_VALS, dtype=torch.float32)
    self.register_buffer('low', low)
    self.register_buffer('high', high)
    self.layers = nn.Sequential(
      nn.Linear(4, 64),
      nn.ReLU(),
      nn.Linear(64, 64),
      nn.ReLU(),
      nn.Linear(64, num_actions),
    )

  def forward(self, state: torch.Tensor) -> torch.Tensor:
    x = state.reshape(state.shape[0], -1).float()  # (B, 1, 4, 1) -> (B, 4)
    x = 2.0 * (x - self.low) / (self.high - self.low) - 1.0
    return self.layers(x)


class NatureQNetwork(nn.Module):
  """Mnih et al. (2015)'s network on (B, 4, 84, 84) uint8 frames."""

  def __init__(self, num_actions: int, stack_size: int):
    super().__init__()
    self.layers = nn.Sequential(
      nn.Conv2d(stack_size, 32, 8, stride=4),
      nn.ReLU(),
      nn.Conv2d(32, 64, 4, stride=2),
      nn.ReLU(),
      nn.Conv2d(64, 64, 3, stride=1),
      nn.ReLU(),
      nn.Flatten(),
      nn.Linear(64 * 7 * 7, 512),
      nn.ReLU(),
      nn.Linear(512, num_actions),
    )

  def forward(self, state: torch.Tensor) -> torch.Tensor:
    return self.layers(state.float() / 255.0)


def make_environment(config: Config):
  if config.is_cartpole:
    env = environments.create_environment('cartpole')
  else:
    env = environments.create_environment('atari', game=config.environment)
  env.environment.reset(seed=config.seed)
  return env


def td_loss(q_network, target_network, batch, gamma):
  """Dopamine's DQN loss: Huber between Q(s, a) and the one-step target."""
  q_values = q_network(batch['state'])
  chosen = q_values.gather(1, batch['action'].long()[:, None]).squeeze(1)
  with torch.no_grad():
    next_q = target_network(batch['next_state']).max(dim=1).values
    not_terminal = 1.0 - batch['terminal'].float()
    target = batch['reward'].float() + gamma * not_terminal * next_q
  return functional.smooth_l1_loss(chosen, target)


def evaluate(config: Config, q_network, spec, device) -> float:
  """Mean return of the greedy policy over `eval_episodes` episodes."""
  env = make_environment(config)
  returns = []
  for _ in range(config.eval_episodes):
    # Dopamine's agents stack the newest frame last and start from zeros.
    stack = np.zeros(spec.observation_shape + (spec.stack_size,), np.float32)
    observation = env.reset()
    total, steps, done = 0.0, 0, False
    while not done and steps < config.max_steps_per_episode:
      stack = np.roll(stack, -1, axis=-1)
      stack[..., -1] = np.reshape(observation, spec.observation_shape)
      state = torch.from_numpy(np.moveaxis(stack, -1, 0)[None]).to(device)
      with torch.no_grad():
        action = int(q_network(state).argmax(dim=1)[0])
      observation, reward, done, _ = env.step(action)
      total += float(reward)
      steps += 1
    returns.append(total)
  return float(np.mean(returns))


def latest_checkpoint(checkpoint_dir: str) -> str:
  """The path of the highest update_N.pt in `checkpoint_dir`."""
  paths = glob.glob(os.path.join(checkpoint_dir, 'update_*.pt'))
  if not paths:
    raise FileNotFoundError(f'--resume: no update_N.pt in {checkpoint_dir}')
  return max(paths, key=lambda p: int(p.rsplit('_', 1)[1][:-3]))


def main(argv):
  del argv
  config = make_config()
  torch.manual_seed(config.seed)
  # A 64-unit MLP gains nothing from more threads, and on a busy machine
  # their spin-waiting makes each update ~20x slower.
  torch.set_num_threads(config.torch_threads)
  device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
  spec = environments.ENVIRONMENT_SPECS[
    'cartpole' if config.is_cartpole else 'atari'
  ]
  num_actions = make_environment(config).action_space.n

  dataset = ReplayDataset(
    config.replay_dir,
    channels_first=True,
    num_batches=config.num_updates,
    observation_shape=spec.observation_shape,
    observation_dtype=spec.observation_dtype,
    stack_size=spec.stack_size,
    batch_size=config.batch_size,
    update_horizon=1,
    gamma=config.gamma,
    seed=config.seed,
  )
  loader = StatefulDataLoader(
    dataset,
    batch_size=None,
    num_workers=config.num_workers,
    pin_memory=device.type == 'cuda',
  )

  if config.is_cartpole:
    q_network = CartPoleQNetwork(num_actions)
  else:
    q_network = NatureQNetwork(num_actions, spec.stack_size)
  q_network = q_network.to(device)
  target_network = copy.deepcopy(q_network)
  optimizer = torch.optim.Adam(
    q_network.parameters(), lr=config.learning_rate, eps=config.adam_eps
  )

  # What a checkpoint holds: the loader's state is each stream's place.
  parts = {
    'q_network': q_network,
    'target_network': target_network,
    'optimizer': optimizer,
    'loader': loader,
  }
  done = 0
  if config.resume:
    path = latest_checkpoint(config.checkpoint_dir)
    saved = torch.load(path, map_location=device)
    for name, part in parts.items():
      part.load_state_dict(saved[name])
    done = saved['update']
    logging.info('Resumed from %s at update %d', path, done)

  began = time.perf_counter()
  for update, batch in enumerate(loader, start=done + 1):
    batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    loss = td_loss(q_network, target_network, batch, config.gamma)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if update % config.target_update_period == 0:
      target_network.load_state_dict(q_network.state_dict())
    if config.eval_every and update % config.eval_every == 0:
      logging.info(
        'eval return at update %d: %.2f',
        update,
        evaluate(config, q_network, spec, device),
      )
    if config.checkpoint_dir and update % config.save_every == 0:
      os.makedirs(config.checkpoint_dir, exist_ok=True)
      saved = {name: part.state_dict() for name, part in parts.items()}
      torch.save(
        dict(saved, update=update),
        os.path.join(config.checkpoint_dir, f'update_{update}.pt'),
      )
    if update % 500 == 0 or update == config.num_updates:
      logging.info(
        'update %d/%d  loss %.4f  %.0f updates/s',
        update,
        config.num_updates,
        loss.item(),
        (update - done) / (time.perf_counter() - began),
      )
  dataset.close()

  print(f'eval return: {evaluate(config, q_network, spec, device):.2f}')


if __name__ == '__main__':
  flags.mark_flag_as_required('replay_dir')
  app.run(main)
