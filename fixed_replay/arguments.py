"""Range checks of the integer and gamma arguments of buffers and runner.

Gin passes whatever a config binds, so a buffer or FixedReplayRunner checks
its arguments once, before it reads any data: a misspelt `1e6` (a float) or a
negative count fails at construction with the argument's name, not deep
inside numpy later. One table holds the rules for every constructor.
"""

import numbers

# name: (lowest allowed value or None for any integer, whether None is
# allowed). The checkpoint slice indices are Python slice bounds, so negative
# values keep their meaning.
_INTEGER_RANGES = {
  'batch_size': (1, False),
  'stack_size': (1, True),
  'update_horizon': (1, True),
  'replay_capacity': (1, False),
  'max_sample_attempts': (1, False),
  'num_buffers_to_load': (1, True),
  'ready_batches': (1, False),
  'sampling_threads': (0, True),
  'replay_transitions_start_index': (0, False),
  'replay_file_start_index': (None, False),
  'replay_file_end_index': (None, True),
  'replay_suffix': (0, True),
  'memory_budget': (1, True),
  # FixedReplayRunner.
  'num_iterations': (1, False),
  'training_steps': (0, False),
  'evaluation_steps': (0, False),
  'max_steps_per_episode': (1, True),
  'log_every_n': (1, False),
}


def _check_integer(name, value, lowest, none_allowed):
  allowed = 'an integer' + ('' if lowest is None else f' >= {lowest}')
  allowed += ' or None' if none_allowed else ''
  if value is None and none_allowed:
    return
  if not isinstance(value, numbers.Integral) or isinstance(value, bool):
    raise ValueError(
      f'{name} must be {allowed}, got {value!r} ({type(value).__name__})'
    )
  if lowest is not None and value < lowest:
    raise ValueError(f'{name} must be {allowed}, got {value}')


def check_arguments(arguments: dict) -> None:
  """Raises ValueError for the first argument outside its allowed range.

  Args:
    arguments: dict of argument name to value (a constructor's `locals()`);
      names without a rule are ignored.

  Raises:
    ValueError: naming the argument, its value and what is allowed.
  """
  for name, (lowest, none_allowed) in _INTEGER_RANGES.items():
    if name in arguments:
      _check_integer(name, arguments[name], lowest, none_allowed)
  gamma = arguments.get('gamma', 0.0)
  if not isinstance(gamma, numbers.Real) or not 0.0 <= gamma <= 1.0:
    raise ValueError(f'gamma must be a number in [0, 1], got {gamma!r}')
