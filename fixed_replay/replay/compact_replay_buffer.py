"""CompactReplayBuffer: FixedReplayBuffer under the name configs give it.

Configs written before FixedReplayBuffer read compact stores itself bind
`replay_buffer_class.memory_class = @CompactReplayBuffer` (after importing
this module) and `CompactReplayBuffer.<name>`; both keep working. The class
is FixedReplayBuffer with one other default: a memory budget of 1.5 GB
instead of the memory available, as it always had.
"""

import gin

from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer

DEFAULT_MEMORY_BUDGET = 1_500_000_000


@gin.configurable
class CompactReplayBuffer(FixedReplayBuffer):
  """FixedReplayBuffer with a 1.5 GB default memory budget."""

  def __init__(
    self,
    data_dir,
    replay_suffix=None,
    *,
    memory_budget=DEFAULT_MEMORY_BUDGET,
    **kwargs,
  ):
    """Opens `data_dir` as FixedReplayBuffer does.

    Args:
      data_dir: str, a compact store (or Dopamine's checkpoint files).
      replay_suffix: int or None, one checkpoint to use.
      memory_budget: int or None, bytes the buffer may hold.
      **kwargs: any other argument of FixedReplayBuffer.
    """
    super().__init__(
      data_dir, replay_suffix, memory_budget=memory_budget, **kwargs
    )
