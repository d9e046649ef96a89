"""ReplayMixture: one exact sampler over many games and runs.

Multi-game offline RL (Multi-Game Decision Transformers, Scaled Q-learning)
trains one model on the DQN Replay Dataset's runs of 40 or more games. Their
loaders build per-game arrays by hand, approximately. A mixture instead keeps
one sampler per run (FixedReplayBuffer's, or SegmentSampler's for sequence
models), exact to Dopamine as they are, and draws each batch element's run
from one categorical distribution:

* a game with the game's weight (by default every game equally often, as
  the multi-game papers draw them);
* within the game, a run in proportion to its valid transitions (or segment
  starts) loaded now, so that draws stay uniform over every loaded row of the
  game, as within one run.

The runs of several batches' elements are drawn at once, and each run is
then asked once for all of its elements: the Python loop is per run and per
few batches, never per transition. Those calls run on `sampling_threads`
threads side by side: the decoders release the GIL (from disk, one thread
keeps one core busy and the disk at half its depth), and each run draws from
its own generator into its own rows, so the batches are the same however
many threads there are.

Actions: the data stores each game's indices into its *minimal* action set.
`action_space='full'` maps them to ALE's 18 actions through ale-py's own
minimal set for the game (sources/ale_games.py); `legal_actions` is each
game's (18,) mask.
"""

from collections.abc import Mapping
from collections.abc import Sequence
import concurrent.futures
import os
from typing import Any

from absl import logging
import numpy as np

from fixed_replay import batches
from fixed_replay import progress
from fixed_replay import segments
from fixed_replay import stream_state
from fixed_replay.errors import CheckpointError
from fixed_replay.replay import samplers
from fixed_replay.replay import transitions
from fixed_replay.sources import ale_games
from fixed_replay.sources import game_roots

ACTION_SPACES = ('minimal', 'full')
# Most bytes of batches drawn ahead (see ReplayMixture._stage), and the
# elements each run should get a call, on average, when that allows: a
# call's reads are asked of the disk together (unit_decoding's read-ahead),
# so the more a call, the deeper the disk's queue and the fewer calls.
STAGED_BYTES = 64 << 20
ELEMENTS_A_CALL = 128
# Batches between reloads of runs that hold some of their checkpoints at a
# time: an iteration of Dopamine's runner (Runner.training_steps).
RELOAD_EVERY = 250_000
# What a sampled batch adds to its sampler's elements.
GAME_ID = 'game_id'
RUN = 'run'


class _Segments(segments.SegmentSampler):
  """SegmentSampler's segments as a run of a mixture."""

  def sample_into(self, arrays, destinations):
    """Samples a segment into each row `destinations` of `arrays`."""
    self.allocate_batch = transitions.empty_batch  # Scratch, not kept.
    for name, array in self.sample(len(destinations)).items():
      arrays[name][destinations] = array


def _buffer(sampler):
  """The FixedReplayBuffer a run samples (a segment sampler's own)."""
  return getattr(sampler, 'buffer', sampler)


def _num_draws(sampler) -> int:
  """What a run draws from: its valid transitions, or segment starts."""
  if isinstance(sampler, _Segments):
    return int(sampler._index()[1][-1])  # noqa: SLF001
  return sampler.num_valid_transitions


class ReplayMixture:
  """Samples many games and runs as one exact, weighted dataset.

  Example:

    mixture = ReplayMixture('/data', games=['Pong', 'Breakout', 'MsPacman'],
                            runs=[1], action_space='full', seed=0)
    batch = mixture.sample()
    batch['state'], batch['action'], batch['game_id']
    game_ids = batch['game_id']
    mixture.games[game_ids[0]]  # 'Breakout', ...

  A batch is its sampler's {name: array} (FixedReplayBuffer's transition
  elements, `indices` and `suffix` included; SegmentSampler's with
  `segment_length`), plus `game_id` int32 (B,), an index into `games`, and
  `run` int32 (B,), an index into `runs`. With `action_space='full'`,
  `action` (and `next_action`) are ALE's full-set indices. The arrays are
  views of rows drawn ahead, never overwritten while any of them is held.
  """

  def __init__(
    self,
    data: str | Mapping[str, str | Sequence[str]],
    games: Sequence[str] | None = None,
    runs: Sequence[str | int] | None = None,
    weights: str | Mapping[str, float] = 'equal',
    action_space: str = 'minimal',
    segment_length: int | None = None,
    batch_size: int = 32,
    seed: int | None = None,
    reload_every: int | None = RELOAD_EVERY,
    sampling_threads: int | None = None,
    **buffer_arguments: Any,
  ):
    """Finds the runs and opens each (so a bad path or argument fails here).

    Args:
      data: str, a root laid out as the dataset is (ROOT/<game>/<run>, each
        run Dopamine's files, local or gs://, or a compact store); or a
        mapping {game: run directory or list of them}.
      games: games to sample (None: every game found).
      runs: run names to sample under a root (None: all).
      weights: 'equal' (every game as often), 'transitions' (games in
        proportion to their loaded transitions or segment starts), or
        {game: weight}.
      action_space: 'minimal' (the stored indices) or 'full' (ALE's 18).
      segment_length: None for transitions, or K for SegmentSampler's
        segments of K steps.
      batch_size: int, elements a batch.
      seed: int or None; seeds the draws and each run's sampler.
      reload_every: int or None, batches between reloads (a new random set
        of checkpoints for each run that holds some at a time: Dopamine's
        files hold `num_buffers_to_load`, 5 when unbound), as Dopamine's
        runner reloads once an iteration; None: only at reload_buffer().
        A store's runs hold every checkpoint, and never reload.
      sampling_threads: int or None, threads that sample the runs of the
        batches drawn ahead (0 or 1: the calling thread, as in a DataLoader
        worker; None: 2, or 1 on one core). The batches do not depend on
        it.
      **buffer_arguments: FixedReplayBuffer's arguments (and with
        segment_length, SegmentSampler's options), with their meanings, for
        every run.

    Raises:
      CheckpointError, ValueError, TypeError, MemoryError: a run's own
        errors, or ValueError naming the directories for unknown games,
        missing games, bad weights or runs whose observations differ.
    """
    if reload_every is not None and not int(reload_every) >= 1:
      raise ValueError(f'reload_every must be >= 1 or None, got {reload_every}')
    if action_space not in ACTION_SPACES:
      raise ValueError(
        f'action_space must be one of {ACTION_SPACES}, got {action_space!r}'
      )
    self.runs = tuple(game_roots.find_runs(data, games, runs))
    self.games = sorted({r.game for r in self.runs})
    self.action_space = action_space
    self.batch_size = int(batch_size)
    self._run_game = np.array([self.games.index(r.game) for r in self.runs])
    self._weights = self._game_weights(weights)
    self._rng = np.random.default_rng(
      None if seed is None else batches.stream_seed(seed, 0)
    )
    # None: batches are views of the staged ones; a DataLoader worker
    # points it at its ring, and batches are copied there.
    self.allocate_batch = None
    self._staging = segments.ReusedBatches(depth=2)
    self._staged = None  # {name: array}: batches drawn ahead, end to end
    self._next = 0  # The first staged row not yet in a batch.
    # The stream's place before the staged batches were drawn, and their
    # batch size: with _next, where the stream is (state_dict).
    self._staged_from = None
    self._sampling_threads = (
      min(2, os.cpu_count() or 1)
      if sampling_threads is None
      else max(1, int(sampling_threads))
    )
    self._pool = None  # Made by the process that samples (_sample_runs).
    self._samplers = []
    # Each run's subsample (subsample='random_episodes') is a stream of one
    # seed: the mixture's own, or the one that DataLoader workers and ranks
    # of one mixture share (subsample_seed), so all keep the same episodes.
    subsample_seed = buffer_arguments.pop('subsample_seed', None)
    subsample_seed = seed if subsample_seed is None else subsample_seed
    with progress.bar(len(self.runs), 'Opening runs', 'run') as bar:
      for i, run in enumerate(self.runs):
        run_seed = None if seed is None else batches.stream_seed(seed, i + 1)
        arguments = dict(
          buffer_arguments,
          subsample_seed=None
          if subsample_seed is None
          else batches.stream_seed(subsample_seed, i + 1),
        )
        if segment_length is None:
          sampler = batches.open_buffer(
            run.data_dir,
            dict(
              arguments,
              batch_size=batch_size,
              seed=run_seed,
              sampling_threads=0,
            ),
          )
        else:
          sampler = _Segments(
            run.data_dir, segment_length, batch_size, run_seed, **arguments
          )
        self._samplers.append(sampler)
        bar.update()
    # One element's observations a run (segments: K of them).
    shapes = [s.get_transition_elements(1)[0].shape[1:] for s in self._samplers]
    if len(set(shapes)) > 1:
      self.close()
      raise ValueError(
        'the runs hold different observations: '
        + '; '.join(
          f'{r.data_dir} {shape}'
          for r, shape in zip(self.runs, shapes, strict=True)
        )
      )
    self._minimal = [ale_games.minimal_action_set(g) for g in self.games]
    widest = max(len(m) for m in self._minimal)
    self._to_full = np.zeros((len(self.games), widest), np.int64)
    self.legal_actions = np.zeros(
      (len(self.games), ale_games.FULL_ACTIONS), bool
    )
    for g, minimal in enumerate(self._minimal):
      self._to_full[g, : len(minimal)] = minimal
      self.legal_actions[g, minimal] = True
    rotating = sum(_buffer(s).rotates for s in self._samplers)
    self._reload_every = reload_every if rotating else None
    self._batches_since_reload = 0
    if rotating:
      logging.info(
        '%s of %s hold a random set of their checkpoints at a time '
        '(num_buffers_to_load): a new set every %s (reload_every)',
        rotating,
        progress.count(len(self.runs), 'run'),
        f'{reload_every:,} batches' if reload_every else 'reload_buffer()',
      )
    logging.info(
      'Mixture of %s and %s (%s weights, %s action space)',
      progress.count(len(self.games), 'game'),
      progress.count(len(self.runs), 'run'),
      weights if isinstance(weights, str) else 'given',
      action_space,
    )

  def _game_weights(self, weights):
    """Each game's weight as given (None: by its transitions, per batch)."""
    if weights == 'equal':
      return np.ones(len(self.games))
    if weights == 'transitions':
      return None
    if not isinstance(weights, Mapping):
      raise ValueError(
        "weights must be 'equal', 'transitions' or {game: weight}, got "
        f'{weights!r}'
      )
    unknown = sorted(set(weights) - set(self.games))
    missing = sorted(set(self.games) - set(weights))
    values = np.array([weights.get(g, 0.0) for g in self.games], float)
    if unknown or missing or (values < 0).any() or not values.sum() > 0:
      raise ValueError(
        f'weights must give every game of the mixture ({self.games}) a '
        f'weight >= 0, not all 0; unknown: {unknown}, missing: {missing}'
      )
    return values

  def run_probabilities(self) -> np.ndarray:
    """Each run's chance of drawing an element, for the data loaded now."""
    draws = np.array([_num_draws(s) for s in self._samplers], float)
    per_game = np.bincount(
      self._run_game, weights=draws, minlength=len(self.games)
    )
    game_weights = per_game if self._weights is None else self._weights
    empty = [g for g, n in zip(self.games, per_game, strict=True) if not n]
    if empty:
      raise ValueError(f'no valid transitions loaded for {", ".join(empty)}')
    chance = game_weights / game_weights.sum()
    return chance[self._run_game] * draws / per_game[self._run_game]

  def get_transition_elements(self, batch_size: int | None = None) -> tuple:
    """The elements of a batch (transitions.ReplayElement), in order."""
    b = self.batch_size if batch_size is None else batch_size
    return (
      *self._samplers[0].get_transition_elements(b),
      transitions.ReplayElement(GAME_ID, (b,), np.int32),
      transitions.ReplayElement(RUN, (b,), np.int32),
    )

  def sample(self, batch_size: int | None = None) -> dict[str, np.ndarray]:
    """A batch as {name: array} (see the class docstring).

    Raises:
      CheckpointError: if a run's data turns out damaged, or holds an
        action outside its game's minimal set (action_space='full').
    """
    if self._batches_since_reload == self._reload_every:
      self.reload_buffer()
    self._batches_since_reload += 1
    b = self.batch_size if batch_size is None else int(batch_size)
    if self._staged is None or self._next + b > len(self._staged[RUN]):
      self._stage(b)
    rows = slice(self._next, self._next + b)
    self._next += b
    batch = {name: array[rows] for name, array in self._staged.items()}
    if self.allocate_batch is None:
      return batch
    out = self.allocate_batch(self.get_transition_elements(b))
    for name, array in batch.items():
      out[name][...] = array
    return out

  def _stage(self, b):
    """Draws the next batches' elements, each run's in one call.

    A call per run and batch would cost more than the sampling itself with
    tens of runs. So the runs of several batches' elements are drawn at once
    (i.i.d.), and each run samples all of its elements in one
    call, writing each into its batch's row: the same distribution, far
    fewer calls, no copy. A batch is a view of the staged arrays, which are
    reused only once no batch of them is held (segments.ReusedBatches).
    """
    self._staged = None
    self._staged_from = self._place(), b
    row_bytes = transitions.batch_bytes(self.get_transition_elements(1))
    ahead = -(-ELEMENTS_A_CALL * len(self.runs) // b)
    ahead = max(1, min(ahead, STAGED_BYTES // int(row_bytes * b)))
    run, rows_of_runs = samplers.draw_runs(
      self.run_probabilities(), self._rng, ahead * b
    )
    staged = self._staging(self.get_transition_elements(ahead * b))
    try:
      self._sample_runs(staged, rows_of_runs)
    except BaseException:
      # Back to where the stream stood before this batch, as if it had not
      # been asked for: a loop that saves its place after the error (or
      # an interrupt) resumes there.
      place, _ = self._staged_from
      since = self._batches_since_reload - 1
      self.load_state_dict(dict(place, staged=None, since_reload=since))
      raise
    game_id = self._run_game[run]
    if self.action_space == 'full':
      for name in ('action', 'next_action'):
        if name in staged:
          staged[name][:] = self._full_actions(staged[name], game_id, run)
    staged[RUN][:] = run
    staged[GAME_ID][:] = game_id
    self._staged, self._next = staged, 0

  def _sample_runs(self, staged, rows_of_runs):
    """Each run samples into its rows of `staged`, on the pool's threads."""
    calls = [
      (self._samplers[r].sample_into, rows)
      for r, rows in enumerate(rows_of_runs)
      if len(rows)
    ]
    if self._sampling_threads == 1 or len(calls) == 1:
      for sample_into, rows in calls:
        sample_into(staged, rows)
      return
    # A pool's threads do not survive a fork (a DataLoader worker's).
    if self._pool is None or self._pool[0] != os.getpid():
      self._pool = (
        os.getpid(),
        concurrent.futures.ThreadPoolExecutor(
          self._sampling_threads, thread_name_prefix='ReplayMixture_sampling'
        ),
      )
    done = [self._pool[1].submit(call, staged, rows) for call, rows in calls]
    try:
      concurrent.futures.wait(done)
    except BaseException:  # Interrupted: no thread writes rows after this.
      for future in done:
        future.cancel()
      concurrent.futures.wait(done)
      raise
    for future in done:
      future.result()  # The first run's error, if any.

  def _full_actions(self, actions, game_id, run):
    """Minimal-set indices to ALE's full set, for every element at once."""
    games = game_id.reshape((-1,) + (1,) * (actions.ndim - 1))
    widths = np.array([len(m) for m in self._minimal])[games]
    outside = (actions < 0) | (actions >= widths)
    if outside.any():
      at = np.flatnonzero(outside.reshape(len(run), -1).any(axis=1))[0]
      data = self.runs[run[at]]
      raise CheckpointError(
        data.data_dir,
        f'holds action {int(actions[at].max())}, but {data.game} has '
        f'{len(self._minimal[game_id[at]])} actions in its minimal set',
      )
    return self._to_full[games, actions].astype(actions.dtype)

  def batches(self, num_batches: int | None = None):
    """Yields `num_batches` (None: endless) batches."""
    return batches.repeated(self.sample, num_batches)

  def _place(self) -> dict:
    return {
      'rng': stream_state.place(self._rng),
      'runs': [sampler.state_dict() for sampler in self._samplers],
    }

  def state_dict(self) -> dict:
    """The stream's place after the last batch (plain numbers).

    `load_state_dict` on a mixture built with the same arguments makes it
    give, from then on, the batches this one gives next.
    """
    staged = None
    if self._staged is None:
      place = self._place()
    else:
      place, batch_size = self._staged_from
      staged = {'batch_size': batch_size, 'next': self._next}
    return {
      **place,
      'staged': staged,
      'since_reload': self._batches_since_reload,
    }

  def load_state_dict(self, state: dict) -> None:
    """Continues the stream from the place `state_dict()` gave.

    Raises:
      ValueError: if `state` is another mixture's.
    """
    if len(state['runs']) != len(self._samplers):
      raise ValueError(
        f'a stream state of a mixture of {len(state["runs"])} runs, for one '
        f'of {len(self._samplers)}: build it with the arguments of the run '
        'that saved it'
      )
    for sampler, run_state in zip(self._samplers, state['runs'], strict=True):
      sampler.load_state_dict(run_state)
    stream_state.move(self._rng, state['rng'])
    self._staged = None
    self._batches_since_reload = int(state['since_reload'])
    if state['staged'] is not None:
      self._stage(int(state['staged']['batch_size']))
      self._next = int(state['staged']['next'])

  def reload_buffer(self) -> None:
    """Swaps in every run's next set of checkpoints (when it loads sets)."""
    self._staged = None  # Batches drawn from the old sets are dropped.
    self._batches_since_reload = 0
    for sampler in self._samplers:
      sampler.reload_buffer()

  def close(self) -> None:
    """Closes every run's sampler (and the sampling threads)."""
    if self._pool is not None and self._pool[0] == os.getpid():
      self._pool[1].shutdown()
    self._pool = None
    for sampler in self._samplers:
      sampler.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
