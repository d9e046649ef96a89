"""How the runner talks to an agent: ours, batch_rl's, Dopamine's or yours.

batch_rl's runner calls the agent's `_train_step()` and reloads through
`agent._replay.memory.reload_buffer(...)`; Dopamine's labs agents expose
`train_step()` and `reload_data()`. The runner goes through these helpers,
so any agent with either contract trains, and says what it trains.

An agent's checkpoints are a Dopamine Runner's (`ckpt.N` with
`sentinel_checkpoint_complete.N`), in `base_dir/checkpoints/`; users name
either folder. `latest_agent_checkpoint` is the one place that looks, for
`--init_checkpoint_dir` and for generating data with a trained agent
(generate/policies.py), so both accept the same folders in the same order and
fail with the same error.
"""

from collections.abc import Callable
import functools
from typing import Any

from absl import logging
from dopamine.discrete_domains import checkpointer

from fixed_replay.errors import CheckpointError
from fixed_replay.io import files as storage

CHECKPOINTS = 'checkpoints'


def log_method(agent: Any) -> None:
  """Logs the method trained, the agent class and its data."""
  memory = replay_memory(agent)
  logging.info(
    'Training %s (%s) offline from %s',
    # The method (e.g. 'REM') where the agent names it, else its class.
    getattr(agent, 'method', None) or type(agent).__name__,
    type(agent).__name__,
    getattr(memory, 'data_dir', getattr(agent, '_replay_data_dir', '?')),
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
  return step if callable(step) else agent._train_step  # batch_rl's contract


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


def replay_state(agent: Any) -> dict | None:
  """Where the agent's replay stream is after the last minibatch trained on
  (FixedReplayBuffer.state_dict), or None for a replay that cannot say."""
  own = getattr(agent, 'replay_state', None)
  memory = replay_memory(agent)
  if not callable(own) and not callable(getattr(memory, 'state_dict', None)):
    return None
  try:
    return own() if callable(own) else memory.state_dict()
  except ValueError as error:  # Several sampling threads: no fixed order.
    logging.log_first_n(
      logging.WARNING, 'The replay stream is not saved: %s', 1, error
    )
    return None


def load_replay_state(agent: Any, state: dict) -> None:
  """Makes the agent's replay draw on from `state` (replay_state's)."""
  own = getattr(agent, 'load_replay_state', None)
  if callable(own):
    own(state)
  else:
    replay_memory(agent).load_state_dict(state)


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


def latest_agent_checkpoint(directory: str) -> tuple[str, int]:
  """(checkpoint folder, latest complete number) of a Runner's checkpoints.

  Args:
    directory: str, the Runner's base_dir or its checkpoints/ folder; the
      checkpoints/ folder below it is looked at first.

  Raises:
    CheckpointError: if neither holds a complete agent checkpoint.
  """
  directory = str(directory)
  for candidate in (storage.join(directory, CHECKPOINTS), directory):
    if not storage.isdir(candidate):
      continue
    number = checkpointer.get_latest_checkpoint_number(candidate)
    if number >= 0:
      return candidate, number
  raise CheckpointError(
    directory,
    'no complete Dopamine agent checkpoint (ckpt.N with its '
    f'sentinel_checkpoint_complete.N) in it or in its {CHECKPOINTS}/ folder; '
    "name a Runner's base_dir or its checkpoints/ folder",
  )


def restore_init_checkpoint(agent, init_dir, checkpoint_file_prefix):
  """Restores `agent` from the latest checkpoint of another run.

  Args:
    agent: the agent, restored through its `unbundle`.
    init_dir: str, the other run's base_dir or its checkpoints/ folder.
    checkpoint_file_prefix: str, as the runner's.

  Returns:
    (checkpoint folder, checkpoint number, the checkpoint's data dict).

  Raises:
    CheckpointError: if there is no checkpoint.
    ValueError: if the agent cannot restore it.
  """
  directory, number = latest_agent_checkpoint(init_dir)
  data = checkpointer.Checkpointer(
    directory, checkpoint_file_prefix
  ).load_checkpoint(number)
  if not agent.unbundle(directory, number, data):
    raise ValueError(
      f'init_checkpoint_dir={init_dir}: {type(agent).__name__} '
      f'could not restore checkpoint {number} of {directory}'
    )
  return directory, number, data
