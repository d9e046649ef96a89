"""How the runner talks to an agent: ours, batch_rl's, Dopamine's or yours.

batch_rl's runner calls the agent's `_train_step()` and reloads through
`agent._replay.memory.reload_buffer(...)`; Dopamine's labs agents expose
`train_step()` and `reload_data()`. The runner goes through these helpers,
so any agent with either contract trains, and says what it trains.
"""

from collections.abc import Callable
import functools
from typing import Any

from absl import logging


def method_of(agent: Any) -> str:
  """The method an agent trains, as the run log names it (e.g. 'REM')."""
  return getattr(agent, 'method', None) or type(agent).__name__


def log_method(agent: Any) -> None:
  """Logs the method trained, the agent class and its data."""
  memory = replay_memory(agent)
  logging.info(
    'Training %s (%s) offline from %s',
    method_of(agent),
    type(agent).__name__,
    getattr(memory, '_data_dir', getattr(agent, '_replay_data_dir', '?')),
  )


def replay_memory(agent: Any) -> Any:
  """The agent's FixedReplayBuffer-like memory (TF agents wrap it)."""
  replay = getattr(agent, '_replay', None)
  return getattr(replay, 'memory', replay)


def rows_loaded(agent: Any) -> int | None:
  """Rows the agent's memory holds, as Dopamine's `add_count`, or None."""
  add_count = getattr(replay_memory(agent), 'add_count', None)
  return None if add_count is None else int(add_count)


def warn_if_no_training(agent: Any) -> None:
  """Warns when Dopamine's warm-up test would keep the agent from training.

  Dopamine's agents update only once `add_count > min_replay_history`; a
  fixed dataset never grows, so with fewer rows loaded than that an agent
  of your own would silently never train.
  """
  threshold = getattr(agent, 'min_replay_history', None)
  rows = rows_loaded(agent)
  if threshold is None or rows is None or rows > threshold:
    return
  logging.warning(
    '%s.min_replay_history=%d but its replay holds %d rows: Dopamine '
    'agents train only once add_count exceeds min_replay_history, so this '
    'one will not train. Set min_replay_history=0 for offline training.',
    type(agent).__name__,
    threshold,
    rows,
  )


def train_step_of(agent: Any) -> Callable[[], Any]:
  """The agent's one-training-step callable (`train_step` or `_train_step`)."""
  step = getattr(agent, 'train_step', None)
  if callable(step):
    return step
  return agent._train_step  # noqa: SLF001  (batch_rl's contract)


def reload_data(agent: Any) -> None:
  """Swaps in the agent's next set of checkpoints, whichever API it has."""
  if callable(getattr(agent, 'reload_data', None)):
    agent.reload_data()
    return
  memory = replay_memory(agent)
  if callable(getattr(memory, 'reload_buffer', None)):
    memory.reload_buffer()
  elif callable(getattr(memory, 'reload_data', None)):
    memory.reload_data()


def graph_mode_hint(create_agent_fn: Callable[..., Any]) -> Callable[..., Any]:
  """Wraps create_agent_fn so that a TF agent built eagerly says what to do."""

  @functools.wraps(create_agent_fn)
  def create(*args, **kwargs):
    try:
      return create_agent_fn(*args, **kwargs)
    except RuntimeError as error:
      if 'EagerTensor' not in str(error):
        raise
      raise RuntimeError(
        f'{error}\nA Dopamine TF agent needs TF1 graph mode: call '
        "fixed_replay.agents.tf.runtime.use_graph_mode() (Dopamine's "
        'train.py calls tf.compat.v1.disable_v2_behavior()) before creating '
        'it; fixed-replay train does this for TF agents.'
      ) from error

  return create


def largest_action(dataset):
  """The largest action a dataset holds (every complete checkpoint).

  Reads only the action arrays: for Dopamine's files each
  `$store$_action_ckpt.N.gz` (about 1 MB compressed per million rows), for a
  store its memory-mapped action arrays.

  Args:
    dataset: layout.Layout, trainable.

  Returns:
    (int, str): the largest action and the file holding it.
  """
  from fixed_replay.dataset import checkpoints
  from fixed_replay.dataset import layout
  from fixed_replay.io import npy_stream
  from fixed_replay.store import compact_store
  from fixed_replay.store import manifest as manifest_lib

  # Rows past add_count of a buffer that never filled were never written
  # (Dopamine saves them uninitialised): only the rows below it count.
  largest, where = -1, dataset.data_dir
  if dataset.kind is layout.Kind.STORE:
    stored = manifest_lib.find_stored_checkpoints(dataset.data_dir)
    for directory in stored.values():
      checkpoint = compact_store.StoredCheckpoint(directory, verify=False)
      actions = checkpoint.arrays['action'][: checkpoint.add_count]
      if len(actions) and int(actions.max()) > largest:
        largest, where = int(actions.max()), directory
      checkpoint.close()
    return largest, where
  for files in checkpoints.find_checkpoints(dataset.data_dir).values():
    add_count = int(npy_stream.read_rows(files.add_count_path))
    path = files.store_paths['action']
    actions = npy_stream.read_rows(path)[:add_count]
    if actions.size and int(actions.max()) > largest:
      largest, where = int(actions.max()), path
  return largest, where


def check_actions(dataset, num_actions, game):
  """Raises CheckpointError if the data acts outside the action space.

  Args:
    dataset: layout.Layout, the data trained on.
    num_actions: int, the evaluation environment's number of actions.
    game: str or None, the game evaluated in (None: not Atari).

  Raises:
    CheckpointError: naming the dataset, its largest action and the game.
  """
  from fixed_replay.errors import CheckpointError

  largest, where = largest_action(dataset)
  if largest >= num_actions:
    played = game or 'the evaluation environment'
    raise CheckpointError(
      dataset.path,
      f'its actions reach {largest} ({where}), but {played} has '
      f'{num_actions} actions (0 to {num_actions - 1}): the data is of '
      'another game; evaluate in its game (see --gin_bindings '
      '"atari_lib.create_atari_environment.game_name = \'...\'")',
    )
  logging.info(
    'Actions of the data: 0 to %d, within the %d of %s',
    largest,
    num_actions,
    game or 'the environment',
  )


def checking_actions(create_agent_fn, dataset, game):
  """create_agent_fn, checking the data's actions against the environment."""

  @functools.wraps(create_agent_fn)
  def create_agent(sess, environment, **kwargs):
    check_actions(dataset, environment.action_space.n, game)
    return create_agent_fn(sess, environment, **kwargs)

  return create_agent
