"""A random stream's place, as plain numbers, so a run can resume it.

Every sampler of this library draws from numpy Generators (PCG64). A run
that is killed after a day must draw, once restarted, exactly what it would
have drawn: the field's loaders resume that way (torchdata's
StatefulDataLoader keeps each worker's `state_dict()`, Grain checkpoints its
iterator with Orbax). A Generator's place is its bit generator's state:
two 128-bit integers and a buffered 32-bit word. It is kept here as a list
of 32-bit words, which JSON, `torch.save` and an Orbax pytree all hold as
they are (a 128-bit Python int fits none of Orbax's array types).
"""

import numpy as np

_MASK = (1 << 32) - 1
_SHIFTS = range(0, 128, 32)  # A 128-bit integer's 32-bit words.


def place(rng: np.random.Generator | dict) -> list[int]:
  """The place of `rng` (or of its `bit_generator.state`), as 10 words."""
  state = rng if isinstance(rng, dict) else rng.bit_generator.state
  if state['bit_generator'] != 'PCG64':
    raise ValueError(f'only PCG64 streams can be saved, not {state}')
  numbers = state['state']['state'], state['state']['inc']
  words = [(number >> shift) & _MASK for number in numbers for shift in _SHIFTS]
  return words + [int(state['has_uint32']), int(state['uinteger'])]


def generator_state(words) -> dict:
  """The `bit_generator.state` of a place given by `place()`.

  Raises:
    ValueError: if `words` is not such a place.
  """
  words = [int(w) for w in words]
  if len(words) != 10 or not all(0 <= w <= _MASK for w in words):
    raise ValueError(f'not a saved stream place: {words!r}')
  state, inc = (
    sum(w << s for w, s in zip(words[at : at + 4], _SHIFTS, strict=True))
    for at in (0, 4)
  )
  return {
    'bit_generator': 'PCG64',
    'state': {'state': state, 'inc': inc},
    'has_uint32': words[8],
    'uinteger': words[9],
  }


def move(rng: np.random.Generator, words) -> None:
  """Puts `rng` at the place `words` (from `place()`)."""
  rng.bit_generator.state = generator_state(words)
