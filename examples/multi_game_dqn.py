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
batch of `--batch_size` x the number of processes; rank 0 logs and prints.

  torchrun --nproc_per_node=8 examples/multi_game_dqn.py --data=/data

`--data` is a root laid out as the DQN Replay Dataset is (`/data/Pong/1`,
...), each run Dopamine's checkpoint files or a compact store. A store's
run is sampled over every checkpoint; a run of Dopamine's files holds 5
random checkpoints at a time, a new set every `--reload_every` updates
(loaded in the background meanwhile), as Dopamine's runner reloads once an
iteration. On a 2-core CPU it runs at about 1.8 updates/s: the default
10,000 updates take about 95 minutes.
"""

import copy
import os
import time

from absl import app
from absl import flags
from absl import logging
import torch
from torch import distributed
from torch import nn
from torch.nn import functional
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from fixed_replay.torch import MixtureDataset

_DATA = flags.DEFINE_string('data', None, 'Root of <game>/<run> directories.')
_GAMES = flags.DEFINE_list('games', None, 'Games to train on (default: all).')
_RUNS = flags.DEFINE_list('runs', None, 'Runs of each game (default: all).')
_NUM_UPDATES = flags.DEFINE_integer('num_updates', 10_000, 'Gradient updates.')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 32, 'Transitions an update.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seeds sampling and the network.')
_LOG_EVERY = flags.DEFINE_integer('log_every', 500, 'Updates between logs.')
_NUM_WORKERS = flags.DEFINE_integer('num_workers', 0, 'DataLoader workers.')
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


def main(argv):
  del argv
  # torchrun starts one process a GPU and tells each its place.
  world_size = int(os.environ.get('WORLD_SIZE', '1'))
  if world_size > 1:
    distributed.init_process_group(
      'nccl' if torch.cuda.is_available() else 'gloo'
    )
    torch.set_num_threads(1)  # One core a process on CPUs.
  rank = distributed.get_rank() if world_size > 1 else 0
  torch.manual_seed(_SEED.value)  # Every rank starts from the same network.
  device = torch.device('cpu')
  if torch.cuda.is_available():
    device = torch.device('cuda', int(os.environ.get('LOCAL_RANK', '0')))
  dataset = MixtureDataset(
    _DATA.value,
    games=_GAMES.value,
    runs=_RUNS.value,
    action_space='full',
    channels_first=True,
    num_batches=_NUM_UPDATES.value,
    reload_every=_RELOAD_EVERY.value,
    batch_size=_BATCH_SIZE.value,
    update_horizon=1,
    gamma=GAMMA,
    seed=_SEED.value,
  )
  mixture = dataset.buffer
  games = mixture.games
  logging.info('Games: %s (%d runs)', ', '.join(games), len(mixture.runs))
  # Each game's legal actions in the full set, looked up per transition.
  legal_actions = torch.from_numpy(mixture.legal_actions).to(device)
  stack_size = mixture.get_transition_elements(1)[0].shape[-1]
  loader = DataLoader(
    dataset,
    batch_size=None,
    num_workers=_NUM_WORKERS.value,
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

  # Sums and counts of each game's losses since the last log.
  loss_sums = torch.zeros(len(games), device=device)
  loss_counts = torch.zeros(len(games), device=device)
  last_means = {}
  began = time.perf_counter()
  first_rows = None
  for update, batch in enumerate(loader, start=1):
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
    loss_sums.index_add_(0, game_id, losses.detach())
    loss_counts.index_add_(0, game_id, torch.ones_like(losses))
    last = update == _NUM_UPDATES.value
    if rank == 0 and (update % _LOG_EVERY.value == 0 or last):
      means = (loss_sums / loss_counts.clamp(min=1)).tolist()
      last_means.update(
        (g, m)
        for g, m, n in zip(games, means, loss_counts, strict=True)
        if n > 0
      )
      logging.info(
        'update %d/%d  %.1f updates/s  loss %s',
        update,
        _NUM_UPDATES.value,
        update / (time.perf_counter() - began),
        '  '.join(f'{g} {m:.4f}' for g, m in last_means.items()),
      )
      loss_sums.zero_()
      loss_counts.zero_()
  dataset.close()

  if world_size > 1:  # Each rank drew its own batches into one network.
    checksum = sum(p.double().sum().item() for p in q_network.parameters())
    print(
      f'rank {rank} of {world_size}: first rows {first_rows}, parameter '
      f'checksum {checksum!r}',
      flush=True,
    )
    distributed.destroy_process_group()
  if rank == 0:
    for game in games:
      print(f'loss {game}: {last_means.get(game, float("nan")):.6f}')


if __name__ == '__main__':
  flags.mark_flag_as_required('data')
  app.run(main)
