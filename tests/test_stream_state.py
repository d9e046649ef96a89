"""A buffer's stream resumes exactly from its state_dict().

A run killed after batch N and restarted from the state saved then must
draw batches N+1.. exactly as the run that went on: over a store (a
sampling thread drawing ahead), over Dopamine's files in rotating sets
(with and without prefetch), across reloads, and through plain JSON.
"""

import contextlib
import json

import numpy as np
import pytest

from fixed_replay import batches
from fixed_replay import stream_state


def _opened(data_dir, arguments):
  return contextlib.closing(batches.open_buffer(data_dir, arguments))


def _assert_same(left, right):
  assert list(left) == list(right)
  for name in left:
    np.testing.assert_array_equal(left[name], right[name], err_msg=name)


def _run(buffer, steps, reload_every):
  """`steps` named batches, reloading after every `reload_every`."""
  out = []
  for step in range(steps):
    if reload_every and step and step % reload_every == 0:
      buffer.reload_buffer()
    out.append(batches.named(buffer, buffer.sample_transition_batch()))
  return out


@pytest.mark.parametrize(
  'layout, arguments',
  [
    ('store', {}),
    ('store', {'num_buffers_to_load': 2}),
    ('dopamine', {'num_buffers_to_load': 2, 'prefetch': True}),
    ('dopamine', {'num_buffers_to_load': 2, 'prefetch': False}),
  ],
)
def test_a_restarted_buffer_draws_what_the_uninterrupted_one_draws(
  layout, arguments, dopamine_dir, store
):
  directory, capacity, _ = dopamine_dir
  data_dir = str(store if layout == 'store' else directory)
  arguments = dict(
    arguments, replay_capacity=capacity, batch_size=8, update_horizon=2, seed=3
  )
  steps, killed_after, reload_every = 9, 4, 3
  with _opened(data_dir, arguments) as uninterrupted:
    expected = _run(uninterrupted, steps, reload_every)
  with _opened(data_dir, arguments) as first:
    _run(first, killed_after, reload_every)
    # Saved as a training loop would: through JSON (plain numbers only).
    saved = json.loads(json.dumps(first.state_dict()))
  with _opened(data_dir, arguments) as restarted:
    restarted.load_state_dict(saved)
    resumed = []
    for step in range(killed_after, steps):
      if step % reload_every == 0:
        restarted.reload_buffer()
      resumed.append(
        batches.named(restarted, restarted.sample_transition_batch())
      )
  for got, want in zip(resumed, expected[killed_after:], strict=True):
    _assert_same(got, want)
  # The batches are not all alike: resuming from the wrong place would fail.
  assert len({tuple(b['indices']) for b in expected}) == steps


def test_batches_drawn_ahead_do_not_move_the_stream(store):
  # The sampling thread runs ahead of the batches handed out; a reload
  # drops what it drew, and the stream continues from the last batch taken,
  # however far the thread had run.
  arguments = dict(batch_size=8, seed=4, num_buffers_to_load=2)
  streams = []
  for ready in (1, 4):
    with _opened(str(store), dict(arguments, ready_batches=ready)) as buffer:
      streams.append(_run(buffer, 6, 2))
  for left, right in zip(*streams, strict=True):
    _assert_same(left, right)


def test_states_of_another_buffer_are_refused(store, dopamine_dir):
  with _opened(str(store), {'seed': 0}) as threaded:
    state = threaded.state_dict()
  with _opened(str(store), {'seed': 0, 'sampling_threads': 0}) as foreground:
    with pytest.raises(ValueError, match='without one'):
      foreground.load_state_dict(state)
  with _opened(
    str(dopamine_dir[0]), {'seed': 0, 'num_buffers_to_load': 2}
  ) as rotating:
    state = rotating.state_dict()
    state['loaded'] = [0, 2]
    with pytest.raises(ValueError, match=r'holding checkpoints \[0, 2\]'):
      rotating.load_state_dict(state)
  with pytest.raises(ValueError, match='not a saved stream place'):
    stream_state.generator_state([1, 2, 3])
