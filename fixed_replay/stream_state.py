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

_WORDS = 4  # 32-bit words of a 128-bit integer.
_MASK = (1 << 32) - 1


def _words(value: int) -> list[int]:
  return [(value >> (32 * i)) & _MASK for i in range(_WORDS)]


def _integer(words) -> int:
  return sum(int(w) << (32 * i) for i, w in enumerate(words))


def place(rng: np.random.Generator | dict) -> list[int]:
  """The place of `rng` (or of its `bit_generator.state`), as 10 words."""
  state = rng if isinstance(rng, dict) else rng.bit_generator.state
  if state['bit_generator'] != 'PCG64':
    raise ValueError(
      f'a {state["bit_generator"]} generator: only PCG64 (numpy default_rng) '
      'streams can be saved'
    )
  return [
    *_words(state['state']['state']),
    *_words(state['state']['inc']),
    int(state['has_uint32']),
    int(state['uinteger']),
  ]


def generator_state(words) -> dict:
  """The `bit_generator.state` of a place given by `place()`.

  Raises:
    ValueError: if `words` is not such a place.
  """
  words = [int(w) for w in words]
  if len(words) != 2 * _WORDS + 2 or not all(0 <= w <= _MASK for w in words):
    raise ValueError(f'not a saved stream place: {words!r}')
  return {
    'bit_generator': 'PCG64',
    'state': {
      'state': _integer(words[:_WORDS]),
      'inc': _integer(words[_WORDS : 2 * _WORDS]),
    },
    'has_uint32': words[-2],
    'uinteger': words[-1],
  }


def move(rng: np.random.Generator, words) -> None:
  """Puts `rng` at the place `words` (from `place()`)."""
  rng.bit_generator.state = generator_state(words)
