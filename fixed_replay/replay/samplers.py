"""Samplers: which valid transitions a minibatch holds.

The sampler is the one part of the replay path that draws rows. It is given
the valid-row table of the checkpoints sampled now (valid_rows.py: each
checkpoint's valid file rows, in order, as one index) and a generator, and
returns where each transition lies; storage then hands the assembler those
rows (frame_sources.py), so a sampler never sees frames and a storage never
chooses rows. Two ship, one for each meaning of FixedReplayBuffer's
`mix_checkpoints`; a mixture of runs draws its runs with `draw_runs`
(fixed_replay/mixture.py), and each run then samples with its own.

A new sampler is a function of the `Sampler` Protocol, chosen in
`for_mix_checkpoints` or passed where a buffer keeps its own (core.py).
"""

from typing import Protocol

import numpy as np

from fixed_replay.replay import valid_rows


class Sampler(Protocol):
  """Draws `batch_size` valid transitions from `table` with `rng`."""

  def __call__(
    self,
    table: valid_rows.ValidRowTable,
    rng: np.random.Generator,
    batch_size: int,
  ) -> tuple[np.ndarray, np.ndarray]:
    """Returns (positions in the table's checkpoints, file rows)."""


def draw_uniform(
  table: valid_rows.ValidRowTable, rng: np.random.Generator, batch_size: int
) -> tuple[np.ndarray, np.ndarray]:
  """Uniform over all valid transitions (Dopamine's distribution)."""
  return table.rows_at(rng.integers(0, table.total, batch_size))


def draw_one_checkpoint(
  table: valid_rows.ValidRowTable, rng: np.random.Generator, batch_size: int
) -> tuple[np.ndarray, np.ndarray]:
  """One checkpoint, chosen at random, per batch (batch_rl's)."""
  chosen = int(rng.integers(len(table)))
  offsets = rng.integers(0, table.num_valid(chosen), batch_size)
  return table.rows_at(table.starts[chosen] + offsets)


def for_mix_checkpoints(mix_checkpoints: bool) -> Sampler:
  """The sampler FixedReplayBuffer's `mix_checkpoints` argument names."""
  return draw_uniform if mix_checkpoints else draw_one_checkpoint


def draw_runs(
  probabilities: np.ndarray, rng: np.random.Generator, count: int
) -> tuple[np.ndarray, list[np.ndarray]]:
  """A mixture's draw: the run of each of `count` elements, i.i.d.

  Returns:
    (run of each element, and for each run the elements it holds, in order),
    so each run samples all of its elements in one call.
  """
  run = rng.choice(len(probabilities), count, p=probabilities)
  by_run = np.argsort(run, kind='stable')
  ends = np.cumsum(np.bincount(run, minlength=len(probabilities)))
  return run, np.split(by_run, ends[:-1])
