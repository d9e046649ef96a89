"""Which checkpoints a buffer may use, and which it holds at a time.

Shared by every buffer, so `replay_suffix` and the `replay_file_*_index`
slice mean the same over gzip checkpoints and over a compact store.
"""

from absl import logging


def select_checkpoints(found, replay_suffix, file_start, file_end, data_dir):
  """Applies replay_suffix or the replay_file_*_index slice to `found`.

  Args:
    found: dict of suffix to what describes that checkpoint.
    replay_suffix: int or None, a single checkpoint.
    file_start: int, first position in the sorted suffixes.
    file_end: int or None, end (exclusive) of that slice.
    data_dir: str, for the messages.

  Returns:
    dict of the selected suffixes to their values in `found`.

  Raises:
    ValueError: if the selection is empty.
  """
  if replay_suffix is not None:
    if replay_suffix not in found:
      raise ValueError(
        f'replay_suffix={replay_suffix}: no complete checkpoint with that '
        f'suffix in {data_dir} (found {sorted(found)})'
      )
    return {replay_suffix: found[replay_suffix]}
  suffixes = sorted(found)[file_start:file_end]
  if not suffixes:
    raise ValueError(
      f'replay_file_start_index={file_start}, replay_file_end_index='
      f'{file_end} select none of the {len(found)} checkpoints in {data_dir}'
    )
  return {s: found[s] for s in suffixes}


class RandomSets:
  """Draws the sets of checkpoints a buffer holds, batch_rl's way."""

  def __init__(self, suffixes, rng, data_dir):
    """Keeps the selection.

    Args:
      suffixes: iterable of int, the selected checkpoints.
      rng: np.random.Generator, shared with sampling (one seed for both).
      data_dir: str, for the messages.
    """
    self.suffixes = sorted(suffixes)
    self._rng = rng
    self._data_dir = data_dir
    self._warned = False

  def available(self, num_buffers):
    """num_buffers, or all the checkpoints when fewer exist (warns once)."""
    if num_buffers <= len(self.suffixes):
      return num_buffers
    if not self._warned:
      self._warned = True
      logging.warning(
        'num_buffers_to_load=%d but %s has %d usable checkpoint(s) %s: '
        'using all of them.',
        num_buffers,
        self._data_dir,
        len(self.suffixes),
        self.suffixes,
      )
    return len(self.suffixes)

  def draw(self, num_buffers):
    """Draws num_buffers distinct checkpoint suffixes at random."""
    chosen = self._rng.choice(self.suffixes, num_buffers, replace=False)
    return sorted(int(s) for s in chosen)
