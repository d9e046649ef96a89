"""Offline DQN on many Atari games at once, in one file (Scaled-QL style).

One network plays every game: a shared Nature torso and one head over ALE's
full set of 18 actions. Each game's data stores indices into its own
*minimal* action set, so the mixture maps them to the full set
(`action_space='full'`, through ale-py's own minimal sets) and the head is
masked to each game's legal actions: an action a game lacks is never
chosen, nor bootstrapped from. Games are drawn equally often, and within a
game every loaded transition of every run equally often
(`fixed_replay.ReplayMixture`). It prints each game's mean TD loss over
the last `--log_every` updates, and `loss <game>: <float>` per game last.

  python examples/multi_game_dqn.py --data=/data --games=Pong,Breakout \
      --runs=1 --num_updates=10000

The same file trains one model on many GPUs or hosts under torchrun, one
process a GPU (NCCL; gloo on CPUs), the gradients averaged by
DistributedDataParallel. Each rank's MixtureDataset draws its own stream of
the seed (fixed_replay/ranks.py), `--batch_size` transitions of a global
batch of `--batch_size` x the number of processes; rank 0 logs and prints
the losses, each rank its first rows and parameter checksum.

  torchrun --nproc_per_node=8 examples/multi_game_dqn.py --data=/data

Or with Ray Train, one TorchTrainer worker a process, on a private local
Ray (or a cluster's, `--ray_address`):

  python examples/multi_game_dqn.py --data=/data --ray_workers=8

`--data` is a root laid out as the DQN Replay Dataset is (`/data/Pong/1`,
...), each run Dopamine's checkpoint files or a compact store. A store's
run is sampled over every checkpoint; a run of Dopamine's files holds 5
random checkpoints at a time, a new set every `--reload_every` updates
(loaded in the background meanwhile), as Dopamine's runner reloads once an
iteration. On a 2-core CPU it runs at about 1.8 updates/s: the default
10,000 updates take about 95 minutes.

With `--checkpoint_dir`, each rank saves the networks, the optimizer and
its loader's state (torchdata's StatefulDataLoader: where its stream, and
each of its workers', is) every `--save_every` updates; `--resume`, under
the same torchrun command, goes on from the latest, and every rank draws
exactly what it would have drawn had the run not stopped.
"""

import copy
import glob
import os
import tempfile
import time

from absl import app
from absl import flags
from absl import logging
import torch
from torch import distributed
from torch import nn
from torch.nn import functional
from torch.nn.parallel import DistributedDataParallel
from torchdata.stateful_dataloader import StatefulDataLoader

from fixed_replay import ranks
from fixed_replay.torch import MixtureDataset

_DATA = flags.DEFINE_string('data', None, 'Root of <game>/<run> directories.')
_GAMES = flags.DEFINE_list('games', None, 'Games to train on (default: all).')
_RUNS = flags.DEFINE_list('runs', None, 'Runs of each game (default: all).')
_NUM_UPDATES = flags.DEFINE_integer('num_updates', 10_000, 'Gradient updates.')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 32, 'Transitions an update.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seeds sampling and the network.')
_LOG_EVERY = flags.DEFINE_integer('log_every', 500, 'Updates between logs.')
_NUM_WORKERS = flags.DEFINE_integer('num_workers', 0, 'DataLoader workers.')
_RAY_WORKERS = flags.DEFINE_integer(
  'ray_workers', 0, 'Train with Ray Train in this many processes (0: not).'
)
_RAY_ADDRESS = flags.DEFINE_string(
  'ray_address', None, "A Ray cluster's address (default: a local one)."
)
_RAY_STORAGE = flags.DEFINE_string(
  'ray_storage', None, "Where Ray Train keeps its runs (default: Ray's)."
)
_CHECKPOINT_DIR = flags.DEFINE_string(
  'checkpoint_dir', None, 'Where each rank saves update_N.rank_R.pt.'
)
_SAVE_EVERY = flags.DEFINE_integer('save_every', 1000, 'Updates between saves.')
_RESUME = flags.DEFINE_bool(
  'resume', False, "Go on from --checkpoint_dir's latest update."
)
_RELOAD_EVERY = flags.DEFINE_integer(
  'reload_every',
  1_000,
  "Updates between new random sets of each Dopamine run's checkpoints "
  '(5 held at a time); a compact store holds every checkpoint.',
)

# Dopamine's JAX DQN Atari config: Adam 6.25e-5 / 1.5e-4, gamma 0.99, target
# synced every 8,000 agent steps = 2,000 updates.
LEARNING_RATE, ADAM_EPS, GAMMA, TARGET_UPDATE_PERIOD = (
  6.25e-5,
  1.5e-4,
  0.99,
  2000,
)
FULL_ACTIONS = 18


class MultiGameQNetwork(nn.Module):
  """Mnih et al. (2015)'s torso, shared by every game, and an 18-action head."""

  def __init__(self, stack_size: int):
    super().__init__()
    self.torso = nn.Sequential(
      nn.Conv2d(stack_size, 32, 8, stride=4),
      nn.ReLU(),
      nn.Conv2d(32, 64, 4, stride=2),
      nn.ReLU(),
      nn.Conv2d(64, 64, 3, stride=1),
      nn.ReLU(),
      nn.Flatten(),
      nn.Linear(64 * 7 * 7, 512),
      nn.ReLU(),
    )
    self.head = nn.Linear(512, FULL_ACTIONS)

  def forward(self, state: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
    """Q-values (B, 18); actions the state's game lacks are -inf."""
    q_values = self.head(self.torso(state.float() / 255.0))
    return q_values.masked_fill(~legal, float('-inf'))


def td_losses(q_network, target_network, batch, legal, gamma):
  """Each transition's Huber TD loss, its game's actions only."""
  q_values = q_network(batch['state'], legal)
  chosen = q_values.gather(1, batch['action'].long()[:, None]).squeeze(1)
  with torch.no_grad():
    next_q = target_network(batch['next_state'], legal).max(dim=1).values
    not_terminal = 1.0 - batch['terminal'].float()
    target = batch['reward'].float() + gamma * not_terminal * next_q
  return functional.smooth_l1_loss(chosen, target, reduction='none')


def checkpoint_path(checkpoint_dir: str, rank: int, update=None) -> str:
  """Rank `rank`'s file of `update` (None: the latest rank 0 saved)."""
  if update is None:
    found = glob.glob(os.path.join(checkpoint_dir, 'update_*.rank_0.pt'))
    if not found:
      raise FileNotFoundError(f'--resume: nothing saved in {checkpoint_dir}')
    update = max(int(os.path.basename(p).split('.')[0][7:]) for p in found)
  return os.path.join(checkpoint_dir, f'update_{update}.rank_{rank}.pt')


def train(config: dict) -> list[str]:
  """Trains in this process: alone, as a torchrun rank, or as a Ray Train
  worker (whose process group Ray has initialised). Returns the lines to
  print: under several processes this rank's first rows and parameter
  checksum first, then each game's last mean loss."""
  # torchrun starts one process a GPU and tells each its place (RANK and
  # WORLD_SIZE); Ray Train has initialised the process group (and chosen
  # the GPU) already. ranks.current() reads either.
  rank, world_size = ranks.current()
  if world_size > 1 and not distributed.is_initialized():
    if torch.cuda.is_available():  # NCCL's collectives use this GPU.
      torch.cuda.set_device(int(os.environ.get('LOCAL_RANK', '0')))
    distributed.init_process_group(
      'nccl' if torch.cuda.is_available() else 'gloo'
    )
  device = torch.device('cpu')
  if torch.cuda.is_available():
    device = torch.device('cuda', torch.cuda.current_device())
  elif world_size > 1:
    torch.set_num_threads(1)  # Processes share the CPU's cores.
  torch.manual_seed(config['seed'])  # Every rank starts from one network.
  dataset = MixtureDataset(
    config['data'],
    games=config['games'],
    runs=config['runs'],
    action_space='full',
    channels_first=True,
    num_batches=config['num_updates'],
    reload_every=config['reload_every'],
    batch_size=config['batch_size'],  # This rank's share of the batch.
    update_horizon=1,
    gamma=GAMMA,
    seed=config['seed'],  # Each rank draws its own stream of it.
  )
  mixture = dataset.buffer
  games = mixture.games
  logging.info('Games: %s (%d runs)', ', '.join(games), len(mixture.runs))
  # Each game's legal actions in the full set, looked up per transition.
  legal_actions = torch.from_numpy(mixture.legal_actions).to(device)
  stack_size = mixture.get_transition_elements(1)[0].shape[-1]
  loader = StatefulDataLoader(
    dataset,
    batch_size=None,
    num_workers=config['num_workers'],
    pin_memory=device.type == 'cuda',
  )

  q_network = MultiGameQNetwork(stack_size).to(device)
  target_network = copy.deepcopy(q_network)
  trained = q_network  # What computes losses: under torchrun, with DDP.
  if world_size > 1:  # Averages the ranks' gradients at each backward.
    trained = DistributedDataParallel(q_network)
  optimizer = torch.optim.Adam(
    q_network.parameters(), lr=LEARNING_RATE, eps=ADAM_EPS
  )

  # What a rank saves: the networks are every rank's, the loader its own.
  parts = {
    'q_network': q_network,
    'target_network': target_network,
    'optimizer': optimizer,
    'loader': loader,
  }
  done = 0
  if config['resume']:
    path = checkpoint_path(config['checkpoint_dir'], rank)
    saved = torch.load(path, map_location=device)
    for name, part in parts.items():
      part.load_state_dict(saved[name])
    done = saved['update']
    logging.info('Rank %d resumed from %s at update %d', rank, path, done)

  # Sums and counts of each game's losses since the last log.
  loss_sums = torch.zeros(len(games), device=device)
  loss_counts = torch.zeros(len(games), device=device)
  last_means = {}
  began = time.perf_counter()
  first_rows = None
  for update, batch in enumerate(loader, start=done + 1):
    if first_rows is None:
      first_rows = batch['indices'][:4].tolist()
    batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    game_id = batch['game_id'].long()
    losses = td_losses(
      trained, target_network, batch, legal_actions[game_id], GAMMA
    )
    optimizer.zero_grad()
    losses.mean().backward()
    optimizer.step()
    if update % TARGET_UPDATE_PERIOD == 0:
      target_network.load_state_dict(q_network.state_dict())
    if config['checkpoint_dir'] and update % config['save_every'] == 0:
      os.makedirs(config['checkpoint_dir'], exist_ok=True)
      saved = {name: part.state_dict() for name, part in parts.items()}
      torch.save(
        dict(saved, update=update),
        checkpoint_path(config['checkpoint_dir'], rank, update),
      )
    loss_sums.index_add_(0, game_id, losses.detach())
    loss_counts.index_add_(0, game_id, torch.ones_like(losses))
    last = update == config['num_updates']
    if rank == 0 and (update % config['log_every'] == 0 or last):
      means = (loss_sums / loss_counts.clamp(min=1)).tolist()
      last_means.update(
        (g, m)
        for g, m, n in zip(games, means, loss_counts, strict=True)
        if n > 0
      )
      logging.info(
        'update %d/%d  %.1f updates/s  loss %s',
        update,
        config['num_updates'],
        (update - done) / (time.perf_counter() - began),
        '  '.join(f'{g} {m:.4f}' for g, m in last_means.items()),
      )
      loss_sums.zero_()
      loss_counts.zero_()
  dataset.close()

  lines = [f'loss {g}: {last_means.get(g, float("nan")):.6f}' for g in games]
  if world_size > 1:  # Each rank drew its own batches into one network.
    checksum = sum(p.double().sum().item() for p in q_network.parameters())
    lines.insert(
      0,
      f'rank {rank} of {world_size}: first rows {first_rows}, parameter '
      f'checksum {checksum!r}',
    )
  return lines


def main(argv):
  del argv
  config = {
    'data': _DATA.value,
    'games': _GAMES.value,
    'runs': _RUNS.value,
    'num_updates': _NUM_UPDATES.value,
    'batch_size': _BATCH_SIZE.value,
    'seed': _SEED.value,
    'log_every': _LOG_EVERY.value,
    'num_workers': _NUM_WORKERS.value,
    'reload_every': _RELOAD_EVERY.value,
    'checkpoint_dir': _CHECKPOINT_DIR.value,
    'save_every': _SAVE_EVERY.value,
    'resume': _RESUME.value,
  }
  if not _RAY_WORKERS.value:  # One process, or torchrun's.
    lines = train(config)
    if distributed.is_initialized():
      # Each rank prints its own place (no collective on tensors made here
      # runs last: PyTorch's gloo threads may free one after Python exits,
      # and abort); rank 0 the losses.
      if distributed.get_rank():
        lines = lines[:1]
      distributed.destroy_process_group()
    print('\n'.join(lines), flush=True)
    return
  # Ray Train: the same training in --ray_workers processes of a Ray
  # cluster (--ray_address; a private local one by default).
  import ray.train
  from ray.train import torch as ray_torch

  from fixed_replay import distributed as fixed_replay_ray

  def on_worker(config):
    lines = train(config)
    # Rank 0 reports every rank's place, and its own losses.
    places = [None] * distributed.get_world_size()
    distributed.all_gather_object(places, lines[0])
    lines = places + lines[1:]
    # Ray Train keeps what rank 0 reports with a checkpoint (a directory).
    with tempfile.TemporaryDirectory() as directory:
      checkpoint = None
      if ray.train.get_context().get_world_rank() == 0:
        with open(os.path.join(directory, 'lines.txt'), 'w') as out:
          out.write('\n'.join(lines))
        checkpoint = ray.train.Checkpoint.from_directory(directory)
      ray.train.report({'updates': config['num_updates']}, checkpoint)

  with fixed_replay_ray.cluster(_RAY_ADDRESS.value) as cluster:
    result = ray_torch.TorchTrainer(
      on_worker,
      train_loop_config=config,
      # A GPU a worker where the cluster has GPUs (its workers', not this
      # driver's: a cluster's head often has none).
      scaling_config=ray.train.ScalingConfig(
        num_workers=_RAY_WORKERS.value, use_gpu=cluster.num_gpus > 0
      ),
      run_config=ray.train.RunConfig(storage_path=_RAY_STORAGE.value),
    ).fit()
  with result.checkpoint.as_directory() as directory:
    with open(os.path.join(directory, 'lines.txt')) as lines:
      print(lines.read())


if __name__ == '__main__':
  flags.mark_flag_as_required('data')
  app.run(main)
