"""Which transitions a minibatch holds: the valid-row table and the draw.

A `ValidRowTable` lists, per loaded checkpoint, the file rows that may be
sampled (a transition whose stack and n-step future stay inside its window),
and answers suffix lookups. It is immutable: a buffer that loads new
checkpoints builds a new table and swaps it in with one assignment.

The draw is separate from the table, as Dopamine's JAX replay takes its
sampling distribution from outside: `draw_uniform` mixes every loaded
checkpoint uniformly over their valid transitions; `draw_one_checkpoint`
takes each minibatch from one checkpoint chosen at random, as batch_rl does.
Both consume the generator in the same way for a given table, so a seeded
buffer gives the same stream whatever holds its frames.
"""

import numpy as np


class ValidRowTable:
  """The valid file rows of each loaded checkpoint, in one lookup table."""

  def __init__(self, suffixes, valid_rows, concatenated=None):
    """Builds the table.

    Args:
      suffixes: sequence of int, the checkpoints in their order.
      valid_rows: sequence of sorted int arrays, each checkpoint's valid file
        rows.
      concatenated: optional array, `valid_rows` already laid end to end
        (each entry then a view of it): a draw over many checkpoints is one
        vectorized lookup instead of one per checkpoint.
    """
    self.suffixes = [int(s) for s in suffixes]
    self.suffix_array = np.array(self.suffixes, dtype=np.int32)
    self.valid_rows = tuple(valid_rows)
    counts = np.array([len(r) for r in self.valid_rows], dtype=np.int64)
    self.ends = np.cumsum(counts, dtype=np.int64)
    self.starts = self.ends - counts
    self.total = int(self.ends[-1]) if len(counts) else 0
    self._concatenated = concatenated
    self._position = {s: i for i, s in enumerate(self.suffixes)}

  @classmethod
  def concatenate(cls, suffixes, valid_rows, dtype=None):
    """A table whose rows are laid end to end (see `concatenated`)."""
    joined = np.concatenate(list(valid_rows)).astype(
      dtype or np.int64, copy=False
    )
    counts = [len(r) for r in valid_rows]
    ends = np.cumsum(counts)
    views = [
      joined[end - count : end] for end, count in zip(ends, counts, strict=True)
    ]
    return cls(suffixes, views, concatenated=joined)

  def __len__(self):
    return len(self.suffixes)

  def num_valid(self, position):
    return len(self.valid_rows[position])

  def rows_at(self, positions):
    """File rows of table positions in [0, total); (which, rows)."""
    which = np.searchsorted(self.ends, positions, side='right')
    if self._concatenated is not None:
      return which, self._concatenated[positions].astype(np.int64)
    if len(self.valid_rows) == 1:
      return which, self.valid_rows[0][positions].astype(np.int64)
    rows = np.empty(len(positions), dtype=np.int64)
    for i in np.unique(which):  # One vectorized lookup per checkpoint.
      members = which == i
      rows[members] = self.valid_rows[i][positions[members] - self.starts[i]]
    return which, rows

  def position_of(self, suffix):
    """Position of checkpoint `suffix` (None: the only one loaded)."""
    if suffix is None:
      if len(self.suffixes) != 1:
        raise ValueError(
          f'{len(self.suffixes)} checkpoints are loaded {self.suffixes}: '
          'say which with `suffixes`'
        )
      return 0
    suffix = int(suffix)
    if suffix not in self._position:
      raise ValueError(
        f'Checkpoint {suffix} is not loaded (loaded: {self.suffixes})'
      )
    return self._position[suffix]

  def positions(self, suffixes, count):
    """Positions of `suffixes` (None, an int or one per index), (count,)."""
    if suffixes is None:
      return np.full(count, self.position_of(None), dtype=np.int64)
    suffixes = np.broadcast_to(np.asarray(suffixes), (count,))
    unknown = set(np.unique(suffixes).tolist()) - set(self._position)
    if unknown:
      raise ValueError(
        f'Checkpoint(s) {sorted(unknown)} are not loaded (loaded: '
        f'{self.suffixes})'
      )
    which = np.empty(count, dtype=np.int64)
    for suffix in np.unique(suffixes):
      which[suffixes == suffix] = self._position[int(suffix)]
    return which


def draw_uniform(table, rng, batch_size):
  """(positions, file rows): uniform over all valid transitions."""
  return table.rows_at(rng.integers(0, table.total, batch_size))


def draw_one_checkpoint(table, rng, batch_size):
  """(positions, file rows): one checkpoint, chosen at random, per batch."""
  chosen = int(rng.integers(len(table)))
  offsets = rng.integers(0, table.num_valid(chosen), batch_size)
  rows = table.valid_rows[chosen][offsets].astype(np.int64)
  return np.full(batch_size, chosen, dtype=np.int64), rows


def drawer(mix_checkpoints):
  """The draw for FixedReplayBuffer's `mix_checkpoints` argument."""
  return draw_uniform if mix_checkpoints else draw_one_checkpoint
