"""Writes datasets in the DQN Replay Dataset layout by playing a real game.

A behaviour policy (random, scripted or a restored Dopamine agent, see
`fixed_replay.generate.policies`) plays an Atari game or CartPole through
Dopamine's own environment wrappers. Its transitions are added, one stream, to
a real Dopamine `OutOfGraphReplayBuffer` with `add(observation, action, reward,
terminal)`, exactly as Dopamine's agents store them:

* row i is (o_i, a_i, r_i, terminal_i): the observation the policy acted on,
  its action, the reward (clipped to [-1, 1], as Dopamine's Runner and the
  published data; CartPole rewards are 1 anyway) and whether the episode
  ended there;
* Dopamine adds the stack_size - 1 all-zero rows at each episode start;
* an episode cut at max_steps_per_episode is stored as terminal, like the
  published data.

The buffer (capacity checkpoint_rows) is dumped whenever
`add_count % checkpoint_rows == cursor` (see replay_dumps.py), cursor being
checkpoint_rows - 1 by default (the published layout: invalid_range
[998, 999, 0, 1, 2] for 1000 rows). Dump k becomes checkpoint suffix k, so
checkpoint 0 holds add_count = cursor rows (not full) and later ones are full
buffers whose rows continue the previous checkpoint's.

Files are written with Dopamine's own `save()`, staged inside output_dir so
that an interrupted run never leaves a half-written file under a checkpoint
name. The published dataset has no `episode_end_indices` files;
`write_episode_end_indices=True` keeps the one newer Dopamine writes.
save() compresses at gzip level 9: about 2 s per 10,000 Atari rows (minutes
for a 1M-row checkpoint); the time of each checkpoint is logged. Rows past
add_count of a partial checkpoint are zero.
"""

from collections.abc import Sequence
import dataclasses
import os
import time
from typing import Any

from absl import logging
import numpy as np

from fixed_replay import progress as progress_lib
from fixed_replay.generate import policies
from fixed_replay.generate import replay_dumps
from fixed_replay.sources.dopamine import environments
from fixed_replay.sources.dopamine import file_names

# Dopamine (and with it TensorFlow) is imported inside the functions that need
# it, so that importing this module and `fixed-replay generate --help` are
# fast.

POLICIES = ('random', 'scripted', 'agent')


@dataclasses.dataclass
class DatasetSummary:
  """What generate_dataset wrote.

  Attributes:
    output_dir: str.
    checkpoints: list of replay_dumps.CheckpointSummary, in suffix order.
    episode_returns: list of float, unclipped returns of the episodes that
      ended before the last checkpoint, in order.
    episode_lengths: list of int, their lengths in agent steps.
    agent_steps: int, environment steps taken (rows without padding).
    seconds: float, wall time of the whole run (set-up included).
    generation_seconds: float, time spent playing and writing checkpoints.
  """

  output_dir: str
  checkpoints: list
  episode_returns: list
  episode_lengths: list
  agent_steps: int
  seconds: float
  generation_seconds: float

  @property
  def suffixes(self) -> list[int]:
    return [c.suffix for c in self.checkpoints]

  @property
  def mean_return(self) -> float | None:
    return (
      float(np.mean(self.episode_returns)) if self.episode_returns else None
    )

  @property
  def rows_per_second(self) -> float:
    """Rows (padding included) written per second of generation."""
    return self.checkpoints[-1].add_count / max(self.generation_seconds, 1e-9)


def make_policy(
  policy: str,
  env: Any,
  environment: str,
  game: str,
  rng: np.random.Generator,
  epsilon: float = 0.1,
  action_repeat: int = 1,
  agent_checkpoint_dir: str | None = None,
  agent_name: str = 'dqn',
  gin_files: Sequence[str] = (),
  gin_bindings: Sequence[str] = (),
) -> Any:
  """Builds a behaviour policy (see fixed_replay.generate.policies).

  Args:
    policy: str, one of POLICIES.
    env: the Dopamine environment.
    environment, game, epsilon, action_repeat, agent_checkpoint_dir,
      agent_name, gin_files, gin_bindings: as generate_dataset takes them.
    rng: np.random.Generator for all random choices of the policy.

  Returns:
    A policy with begin_episode/step.

  Raises:
    ValueError: for an unknown policy or missing agent_checkpoint_dir.
  """
  num_actions = env.action_space.n
  if policy == 'random':
    return policies.RandomPolicy(num_actions, rng, action_repeat)
  if policy == 'scripted':
    meanings = (
      environments.action_meanings(env) if environment == 'atari' else None
    )
    base = policies.make_scripted_policy(environment, game, meanings)
  elif policy == 'agent':
    if not agent_checkpoint_dir:
      raise ValueError('policy=agent needs agent_checkpoint_dir')
    agent = policies.load_agent(
      agent_checkpoint_dir, env, agent_name, gin_files, gin_bindings
    )
    base = policies.AgentPolicy(agent)
  else:
    raise ValueError(f'unknown policy {policy!r}; choose from {POLICIES}')
  return policies.EpsilonGreedyPolicy(base, num_actions, epsilon, rng)


def _check_output_dir(output_dir):
  """Creates output_dir or checks that it holds no checkpoint files."""
  if os.path.isdir(output_dir):
    taken = sorted(
      name
      for name in os.listdir(output_dir)
      if file_names.FILE_PATTERN.match(name)
      or name.startswith(replay_dumps.STAGING_PREFIX)
    )
    if taken:
      shown = ', '.join(taken[:3]) + (', ...' if len(taken) > 3 else '')
      raise FileExistsError(
        f'{output_dir}: already holds replay checkpoint files ({shown}); '
        'refusing to write there. Choose an empty or new directory.'
      )
  elif os.path.exists(output_dir):
    raise NotADirectoryError(f'{output_dir}: exists and is not a directory')
  else:
    os.makedirs(output_dir)


def _check_arguments(
  policy, num_checkpoints, checkpoint_rows: int, cursor: int, spec, max_steps
):
  """Raises ValueError for arguments generate_dataset cannot honour."""
  if policy not in POLICIES:
    raise ValueError(f'unknown policy {policy!r}; choose from {POLICIES}')
  if num_checkpoints < 1:
    raise ValueError(f'num_checkpoints must be >= 1, got {num_checkpoints}')
  if checkpoint_rows < spec.stack_size + 1:
    # Dopamine's buffer needs room for a stack plus the 1-step future.
    raise ValueError(
      f'checkpoint_rows must be >= {spec.stack_size + 1}, got '
      f'{checkpoint_rows}'
    )
  if not 0 <= cursor < checkpoint_rows:
    raise ValueError(f'cursor must be in [0, {checkpoint_rows}), got {cursor}')
  if max_steps < 1:
    raise ValueError(f'max_steps_per_episode must be >= 1, got {max_steps}')


def _play(env, policy, buffer, writer, spec, max_steps, bar):
  """Plays episodes, adding rows to buffer until the writer is done.

  Returns:
    int, agent steps taken.
  """
  agent_steps = 0
  while not writer.done:
    observation = env.reset()
    action = policy.begin_episode(observation)
    episode_return, step = 0.0, 0
    while not writer.done:
      next_observation, reward, terminal, _ = env.step(action)
      step += 1
      agent_steps += 1
      episode_return += reward
      episode_over = bool(terminal) or step >= max_steps
      if episode_over:
        # Before add(): a dump triggered by this row counts this episode.
        writer.episode_returns.append(float(episode_return))
        writer.episode_lengths.append(step)
      reward = np.clip(reward, -1, 1)
      stored = np.asarray(observation, dtype=spec.observation_dtype)
      buffer.add(
        stored.reshape(spec.observation_shape),
        action,
        reward,
        int(episode_over),
      )
      bar.update(min(int(buffer.add_count), writer.total_rows) - bar.n)
      if episode_over:
        break
      observation = next_observation
      action = policy.step(reward, observation)
  return agent_steps


def generate_dataset(
  output_dir: str,
  environment: str = 'atari',
  game: str = 'Pong',
  num_checkpoints: int = 2,
  checkpoint_rows: int = 1000,
  policy: str = 'random',
  epsilon: float = 0.1,
  action_repeat: int = 1,
  seed: int = 0,
  cursor: int | None = None,
  write_episode_end_indices: bool = False,
  max_steps_per_episode: int | None = None,
  sticky_actions: bool = True,
  agent_checkpoint_dir: str | None = None,
  agent_name: str = 'dqn',
  gin_files: Sequence[str] = (),
  gin_bindings: Sequence[str] = (),
  progress: bool = True,
) -> 'DatasetSummary':
  """Plays a game and writes its transitions as Dopamine replay checkpoints.

  Args:
    output_dir: str, local directory; created if missing, refused if it holds
      replay checkpoint files.
    environment: str, 'atari' (Dopamine's atari_lib, (84, 84) uint8 frames,
      stack 4) or 'cartpole' (gym_lib CartPole-v0, (4, 1) float64, stack 1).
    game: str, Atari game name ('Pong', 'Breakout', ...); ignored for
      CartPole.
    num_checkpoints: int, checkpoints (suffixes 0..n-1) to write.
    checkpoint_rows: int, capacity of the buffer = rows per checkpoint file
      (the published data: 1,000,000).
    policy: str, 'random', 'scripted' or 'agent'.
    epsilon: float, probability of a uniform random action around the
      scripted or agent policy.
    action_repeat: int, agent steps each action of the random policy is held
      for (default 1: a new action every step).
    seed: int; the same seed (and arguments) gives identical files.
    cursor: int or None, the write position at each dump, in
      [0, checkpoint_rows); None means checkpoint_rows - 1 (published layout).
      Checkpoint k is dumped at add_count = cursor + k * checkpoint_rows
      (cursor 0: (k + 1) * checkpoint_rows).
    write_episode_end_indices: bool, keep the `episode_end_indices` files of
      newer Dopamine (absent from the published dataset).
    max_steps_per_episode: int or None, episodes are cut (stored as terminal)
      after this many agent steps; None: 27000 for Atari, 200 for CartPole.
    sticky_actions: bool, Atari sticky actions (repeat probability 0.25).
    agent_checkpoint_dir: str, Dopamine Runner base_dir or its checkpoints/
      directory (policy='agent').
    agent_name: str, agent name for Dopamine's create_agent (policy='agent').
    gin_files: sequence of gin files the agent was trained with.
    gin_bindings: sequence of extra gin bindings.
    progress: bool, show a progress bar when stderr is a terminal.

  Returns:
    DatasetSummary.

  Raises:
    ValueError: for invalid arguments or a game without a scripted policy.
    FileExistsError: if output_dir already holds checkpoint files.
    CheckpointError: if the agent cannot be restored.
  """
  start = time.time()
  output_dir = os.fspath(output_dir)
  if '://' in output_dir:
    raise ValueError(
      f'{output_dir}: generate writes local directories only; copy the '
      'result to remote storage afterwards'
    )
  spec = environments.ENVIRONMENT_SPECS.get(environment)
  if spec is None:
    raise ValueError(
      f'unknown environment {environment!r}; choose from '
      f'{environments.ENVIRONMENTS}'
    )
  cursor = checkpoint_rows - 1 if cursor is None else cursor
  max_steps = max_steps_per_episode or spec.max_steps_per_episode
  _check_arguments(
    policy, num_checkpoints, checkpoint_rows, cursor, spec, max_steps
  )
  _check_output_dir(output_dir)

  rng = np.random.default_rng(seed)
  env = environments.create_environment(environment, game, sticky_actions)
  # Seeds the emulator / physics once; Dopamine's wrappers reset unseeded.
  env.environment.reset(seed=seed)
  behaviour = make_policy(
    policy,
    env,
    environment,
    game,
    rng,
    epsilon=epsilon,
    action_repeat=action_repeat,
    agent_checkpoint_dir=agent_checkpoint_dir,
    agent_name=agent_name,
    gin_files=gin_files,
    gin_bindings=gin_bindings,
  )
  writer = replay_dumps.CheckpointWriter(
    output_dir,
    checkpoint_rows,
    cursor,
    num_checkpoints,
    write_episode_end_indices,
  )
  writer.buffer = replay_dumps.make_buffer(spec, checkpoint_rows, writer)
  logging.info(
    'Generating %d checkpoints of %d rows (cursor %d) in %s: %s, policy %s, '
    'seed %d',
    num_checkpoints,
    checkpoint_rows,
    cursor,
    output_dir,
    game if environment == 'atari' else 'CartPole',
    policy,
    seed,
  )
  generation_start = time.time()
  show = None if progress else False
  with progress_lib.bar(
    writer.total_rows, 'generate', unit='row', unit_scale=True, show=show
  ) as bar:
    agent_steps = _play(
      env, behaviour, writer.buffer, writer, spec, max_steps, bar
    )
  summary = DatasetSummary(
    output_dir=output_dir,
    checkpoints=writer.written,
    episode_returns=writer.episode_returns,
    episode_lengths=writer.episode_lengths,
    agent_steps=agent_steps,
    seconds=time.time() - start,
    generation_seconds=time.time() - generation_start,
  )
  logging.info(
    'Wrote %s to %s in %.1f s (%.0f rows/s): %d episodes played, mean '
    'return %s (inspect counts only the complete episodes each checkpoint '
    'holds)',
    progress_lib.count(len(summary.checkpoints), 'checkpoint'),
    output_dir,
    summary.seconds,
    summary.rows_per_second,
    len(summary.episode_returns),
    'n/a' if summary.mean_return is None else f'{summary.mean_return:.2f}',
  )
  return summary
