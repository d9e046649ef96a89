"""Offline DQN in JAX (Flax + Optax) on a fixed replay dataset, in one file.

Reads Dopamine replay checkpoints or a compact store through
`fixed_replay.jax_batches.ReplayBatches` (the library's buffer draws each
minibatch, exactly Dopamine's transitions, and the next ones are already on
their way to the device while an update runs), trains a Q-network with
Dopamine's DQN loss (Huber on the one-step TD error, a target network synced
every `target_update_period` updates), then plays the greedy policy in the
environment and prints `eval return: <float>` last.

  fixed-replay generate --environment=cartpole --policy=random \
      --num_checkpoints=2 --checkpoint_rows=5000 --output_dir=/tmp/cartpole
  python examples/jax_offline_dqn.py --replay_dir=/tmp/cartpole \
      --environment=cartpole --num_updates=4000

An Atari game name (`--environment=Pong`) trains Dopamine's Nature DQN
network on its (84, 84) x 4 frames instead, with the defaults of
Dopamine's JAX DQN Atari config (Adam 6.25e-5, batch 32).

The same file trains one model in several processes (hosts, or GPUs), as
multi-host JAX does: each process draws its own stream of the seed
(fixed_replay/ranks.py), `--batch_size` transitions of it, and
`jax.make_array_from_process_local_data` joins them into one global batch
sharded over every device; the jitted step averages the gradients over it.
Process 0 evaluates and prints. On CPUs, here two processes:

  for i in 0 1; do python examples/jax_offline_dqn.py \
      --replay_dir=/tmp/cartpole --num_processes=2 --process_id=$i \
      --coordinator_address=127.0.0.1:1234 & done; wait

With `--checkpoint_dir`, every process saves its parameters, optimizer
state and its replay stream's place (ReplayBatches.state_dict(): plain
ints, which an Orbax checkpoint holds as well) every `--save_every`
updates; `--resume` goes on from the latest, drawing exactly what the run
would have drawn had it not stopped.
"""

import dataclasses
import functools
import glob
import os
import pickle
import time

from absl import app
from absl import flags
from absl import logging
import flax.linen as nn
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import numpy as np
import optax

from fixed_replay import batches
from fixed_replay.jax_batches import ReplayBatches
from fixed_replay.sources.dopamine import environments

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
_NUM_PROCESSES = flags.DEFINE_integer(
  'num_processes', 1, 'Processes training one model (jax.distributed).'
)
_PROCESS_ID = flags.DEFINE_integer(
  'process_id', None, "This process's index (JAX finds it under SLURM)."
)
_COORDINATOR_ADDRESS = flags.DEFINE_string(
  'coordinator_address', None, "Process 0's host:port, with num_processes."
)
_CHECKPOINT_DIR = flags.DEFINE_string(
  'checkpoint_dir', None, 'Where to save update_N.process_P.pkl.'
)
_SAVE_EVERY = flags.DEFINE_integer('save_every', 1000, 'Updates between saves.')
_RESUME = flags.DEFINE_bool(
  'resume', False, "Go on from --checkpoint_dir's latest update."
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
  checkpoint_dir: str | None
  save_every: int
  resume: bool

  @property
  def is_cartpole(self) -> bool:
    return self.environment == 'cartpole'


def make_config() -> Config:
  cartpole = _ENVIRONMENT.value == 'cartpole'
  # CartPole: configs/cartpole/jax_dqn.gin's network, batch and Adam
  # epsilon, with CleanRL's CartPole DQN learning rate (2.5e-4) and target
  # period (500): with the gin's 1e-3 and 100, offline DQN on random play
  # peaks at 200 and then falls back below 120 by update 4,000. Atari:
  # Dopamine's JAX DQN config (target synced every 8,000 agent steps =
  # 2,000 updates).
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
    checkpoint_dir=_CHECKPOINT_DIR.value,
    save_every=_SAVE_EVERY.value,
    resume=_RESUME.value,
  )


class CartPoleQNetwork(nn.Module):
  """Dopamine's classic-control MLP: inputs rescaled to [-1, 1], 64 x 64."""

  num_actions: int

  @nn.compact
  def __call__(self, state):
    from dopamine.discrete_domains import gym_lib

    low = jnp.asarray(gym_lib.CARTPOLE_MIN_VALS, jnp.float32)
    high = jnp.asarray(gym_lib.CARTPOLE_MAX_VALS, jnp.float32)
    x = state.reshape(state.shape[0], -1).astype(jnp.float32)
    x = 2.0 * (x - low) / (high - low) - 1.0
    x = nn.relu(nn.Dense(64)(x))
    x = nn.relu(nn.Dense(64)(x))
    return nn.Dense(self.num_actions)(x)


class NatureQNetwork(nn.Module):
  """Mnih et al. (2015)'s network on (B, 84, 84, 4) uint8 frames."""

  num_actions: int

  @nn.compact
  def __call__(self, state):
    x = state.astype(jnp.float32) / 255.0
    x = nn.relu(nn.Conv(32, (8, 8), strides=(4, 4))(x))
    x = nn.relu(nn.Conv(64, (4, 4), strides=(2, 2))(x))
    x = nn.relu(nn.Conv(64, (3, 3), strides=(1, 1))(x))
    x = x.reshape(x.shape[0], -1)
    x = nn.relu(nn.Dense(512)(x))
    return nn.Dense(self.num_actions)(x)


def make_environment(config: Config):
  if config.is_cartpole:
    env = environments.create_environment('cartpole')
  else:
    env = environments.create_environment('atari', game=config.environment)
  env.environment.reset(seed=config.seed)
  return env


@functools.partial(jax.jit, static_argnames=('network', 'optimizer', 'gamma'))
def train_step(
  params, target_params, opt_state, batch, network, optimizer, gamma
):
  """One Adam step on Dopamine's DQN loss (Huber on the TD error)."""
  next_q = network.apply(target_params, batch['next_state']).max(axis=1)
  not_terminal = 1.0 - batch['terminal'].astype(jnp.float32)
  target = batch['reward'] + gamma * not_terminal * next_q
  target = jax.lax.stop_gradient(target)

  def loss_fn(params):
    q_values = network.apply(params, batch['state'])
    chosen = jnp.take_along_axis(q_values, batch['action'][:, None], axis=1)
    return optax.huber_loss(chosen[:, 0], target).mean()

  loss, grads = jax.value_and_grad(loss_fn)(params)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


def evaluate(config: Config, network, params, spec) -> float:
  """Mean return of the greedy policy over `eval_episodes` episodes."""
  env = make_environment(config)
  q_values = jax.jit(network.apply)
  returns = []
  for _ in range(config.eval_episodes):
    # Dopamine's agents stack the newest frame last and start from zeros.
    stack = np.zeros(spec.observation_shape + (spec.stack_size,), np.float32)
    observation = env.reset()
    total, steps, done = 0.0, 0, False
    while not done and steps < config.max_steps_per_episode:
      stack = np.roll(stack, -1, axis=-1)
      stack[..., -1] = np.reshape(observation, spec.observation_shape)
      action = int(jnp.argmax(q_values(params, stack[None])[0]))
      observation, reward, done, _ = env.step(action)
      total += float(reward)
      steps += 1
    returns.append(total)
  return float(np.mean(returns))


def local(tree):
  """This process's copy of replicated arrays (the whole of each)."""
  return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), tree)


def global_batches(buffer, num_batches, mesh):
  """Each process's batches (numpy, from its buffer) joined into one global
  batch a step, split over every device of every process along the batch."""
  sharding = NamedSharding(mesh, PartitionSpec('batch'))
  for batch in batches.sample(buffer, num_batches):
    yield {
      name: jax.make_array_from_process_local_data(sharding, array)
      for name, array in batch.items()
    }


def checkpoint_path(checkpoint_dir: str, update: int | None = None) -> str:
  """This process's file of `update` (None: the latest saved)."""
  if update is None:
    found = glob.glob(os.path.join(checkpoint_dir, 'update_*.process_0.pkl'))
    if not found:
      raise FileNotFoundError(f'--resume: nothing saved in {checkpoint_dir}')
    update = max(int(os.path.basename(p).split('.')[0][7:]) for p in found)
  name = f'update_{update}.process_{jax.process_index()}.pkl'
  return os.path.join(checkpoint_dir, name)


def main(argv):
  del argv
  if _NUM_PROCESSES.value > 1:
    # Gradients are averaged across processes: on CPUs, through gloo.
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
    jax.distributed.initialize(
      _COORDINATOR_ADDRESS.value, _NUM_PROCESSES.value, _PROCESS_ID.value
    )
  mesh = Mesh(np.array(jax.devices()), ('batch',))
  config = make_config()
  spec = environments.ENVIRONMENT_SPECS[
    'cartpole' if config.is_cartpole else 'atari'
  ]
  num_actions = make_environment(config).action_space.n

  replay = ReplayBatches(
    config.replay_dir,
    num_batches=config.num_updates,
    observation_shape=spec.observation_shape,
    observation_dtype=spec.observation_dtype,
    stack_size=spec.stack_size,
    batch_size=config.batch_size,
    update_horizon=1,
    gamma=config.gamma,
    seed=config.seed,
  )

  if config.is_cartpole:
    network = CartPoleQNetwork(num_actions)
  else:
    network = NatureQNetwork(num_actions)
  dummy = np.zeros((1,) + spec.observation_shape + (spec.stack_size,))
  params = network.init(jax.random.PRNGKey(config.seed), dummy)
  optimizer = optax.adam(config.learning_rate, eps=config.adam_eps)
  learned = (params, params, optimizer.init(params))  # + target, optimizer.
  done = 0
  if config.resume:
    path = checkpoint_path(config.checkpoint_dir)
    with open(path, 'rb') as f:
      saved = pickle.load(f)
    learned = jax.tree.map(jnp.asarray, saved['learned'])
    done = saved['update']
    replay.load_state_dict(saved['replay'])
    logging.info('Resumed from %s at update %d', path, done)
  replay.num_batches = config.num_updates - done
  stream = replay  # One process: batches placed on its device ahead.
  if jax.process_count() > 1:
    # The same parameters on every device of every process.
    learned = jax.tree.map(
      lambda x: jax.make_array_from_process_local_data(
        NamedSharding(mesh, PartitionSpec()), np.asarray(x)
      ),
      learned,
    )
    stream = global_batches(replay.buffer, replay.num_batches, mesh)
  params, target_params, opt_state = learned

  began = time.perf_counter()
  first_rows = None
  for update, batch in enumerate(stream, start=done + 1):
    if first_rows is None:  # This process's own rows: its stream's.
      first_rows = np.asarray(batch['indices'].addressable_data(0))[:4]
    params, opt_state, loss = train_step(
      params, target_params, opt_state, batch, network, optimizer, config.gamma
    )
    if update % config.target_update_period == 0:
      target_params = params
    if config.checkpoint_dir and update % config.save_every == 0:
      # Each process its own stream's place; the parameters are the same.
      os.makedirs(config.checkpoint_dir, exist_ok=True)
      learned = local((params, target_params, opt_state))
      place = (replay if stream is replay else replay.buffer).state_dict()
      with open(checkpoint_path(config.checkpoint_dir, update), 'wb') as f:
        pickle.dump({'learned': learned, 'update': update, 'replay': place}, f)
    if jax.process_index() != 0:
      continue  # Process 0 evaluates and logs.
    if config.eval_every and update % config.eval_every == 0:
      logging.info(
        'eval return at update %d: %.2f',
        update,
        evaluate(config, network, local(params), spec),
      )
    if update % 500 == 0 or update == config.num_updates:
      logging.info(
        'update %d/%d  loss %.4f  %.0f updates/s',
        update,
        config.num_updates,
        float(local(loss)),
        (update - done) / (time.perf_counter() - began),
      )
  replay.close()

  if jax.process_count() > 1:
    checksum = sum(float(x.sum()) for x in jax.tree.leaves(local(params)))
    print(
      f'process {jax.process_index()} of {jax.process_count()}: first rows '
      f'{first_rows.tolist()}, parameter checksum {checksum!r}',
      flush=True,
    )
  if jax.process_index() == 0:
    params = local(params)
    print(f'eval return: {evaluate(config, network, params, spec):.2f}')
  if jax.process_count() > 1:  # The others wait for it, not for a timeout.
    multihost_utils.sync_global_devices('evaluated')


if __name__ == '__main__':
  flags.mark_flag_as_required('replay_dir')
  app.run(main)
