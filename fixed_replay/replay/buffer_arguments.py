"""The arguments every buffer shares, checked and normalized once.

FixedReplayBuffer's constructor takes Dopamine's and batch_rl's names; what
its parts (storage, rotation, sampling, the batch's assembly) need of them
is this one frozen record, built by one check, so no part re-reads or
re-checks a constructor argument.
"""

import dataclasses

import numpy as np

from fixed_replay import arguments as arguments_lib
from fixed_replay.sources.dopamine import subsample as subsample_lib


@dataclasses.dataclass(frozen=True)
class BufferArguments:
  """The arguments every buffer shares, checked and normalized once.

  See FixedReplayBuffer for what each means.
  """

  data_dir: str
  replay_suffix: int | None
  observation_shape: tuple
  stack_size: int
  replay_capacity: int | None
  batch_size: int
  update_horizon: int
  gamma: float
  extra_storage_types: tuple
  observation_dtype: np.dtype
  terminal_dtype: type
  action_shape: tuple
  action_dtype: type
  reward_shape: tuple
  reward_dtype: type
  mix_checkpoints: bool
  seed: int | None
  subsample: str | None
  subsample_fraction: float | None
  subsample_seed: int | None  # The seed, unless given.

  @classmethod
  def build(cls, arguments: dict) -> 'BufferArguments':
    """Checks a constructor's arguments and keeps the shared ones.

    Args:
      arguments: dict of every argument of the constructor (its locals()).

    Raises:
      ValueError: naming the first argument that is out of range.
    """
    arguments_lib.check_arguments(arguments)
    a = dict(arguments)
    if tuple(a['reward_shape']) != () and a['update_horizon'] > 1:
      raise ValueError('n-step returns need scalar rewards (reward_shape=())')
    subsample_lib.check_arguments(a['subsample'], a['subsample_fraction'])
    suffix = a['replay_suffix']
    a.update(
      data_dir=str(a['data_dir']),
      replay_suffix=None if suffix is None else int(suffix),
      observation_shape=tuple(a['observation_shape']),
      observation_dtype=np.dtype(a['observation_dtype']),
      extra_storage_types=tuple(a['extra_storage_types'] or ()),
      action_shape=tuple(a['action_shape']),
      reward_shape=tuple(a['reward_shape']),
    )
    if a.get('subsample_seed') is None:
      a['subsample_seed'] = a['seed']
    return cls(**{f.name: a[f.name] for f in dataclasses.fields(cls)})
