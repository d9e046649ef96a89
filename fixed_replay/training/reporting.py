"""What the runner reports: per-iteration loss means and one log line.

TF agents write their loss into merged summaries, JAX agents report it to
Dopamine's collector dispatcher; the runner wraps both so that it sees the
values too (a LossTap), averages them per iteration, and logs one line per
iteration with its speed, evaluation return and the time left.
"""

import collections
from collections.abc import Sequence
import math
from typing import Any

from absl import logging
from dopamine.metrics import statistics_instance
import numpy as np
import tensorflow as tf

from fixed_replay import progress


class LossTap:
  """Collects the loss values an agent reports during an iteration."""

  def __init__(self) -> None:
    self._values = collections.defaultdict(list)

  def record(self, tag: str, value: float) -> None:
    if 'loss' in tag.lower():
      self._values[tag.rsplit('/', 1)[-1]].append(float(value))

  def pop_means(self) -> dict[str, float]:
    """Returns {loss name: mean} since the last call and starts afresh."""
    means = {name: float(np.mean(v)) for name, v in self._values.items()}
    self._values.clear()
    return means


class _Forwarding:
  """Passes every attribute it lacks on to the object it wraps."""

  def __init__(self, wrapped: Any, tap: 'LossTap') -> None:
    self._wrapped = wrapped
    self._tap = tap

  def __getattr__(self, name):
    if name.startswith('__'):
      raise AttributeError(name)
    return getattr(self._wrapped, name)


class TappedFileWriter(_Forwarding):
  """A tf.compat.v1 FileWriter that also shows summaries to a LossTap."""

  def add_summary(self, summary: Any, global_step: int | None = None) -> None:
    proto = summary
    if isinstance(summary, bytes):
      proto = tf.compat.v1.Summary.FromString(summary)
    for value in proto.value:
      if value.WhichOneof('value') == 'simple_value':
        self._tap.record(value.tag, value.simple_value)
    self._wrapped.add_summary(summary, global_step)


class TappedDispatcher(_Forwarding):
  """A Dopamine CollectorDispatcher that also shows losses to a LossTap."""

  def write(self, statistics: Any, *args: Any, **kwargs: Any) -> None:
    for statistic in statistics:
      self._tap.record(statistic.name, statistic.value)
    self._wrapped.write(statistics, *args, **kwargs)


def log_iteration(
  iteration: int,
  num_iterations: int,
  statistics: Any,
  durations: Sequence[float],
  left: int,
) -> None:
  """Logs one line: speed, evaluation return and time left."""

  def first(key, default=math.nan):
    return statistics.get(key, [default])[0]

  losses = ', '.join(
    f'{key[len("train_average_") :]} {values[0]:.4g}'
    for key, values in statistics.items()
    if key.startswith('train_average_') and 'loss' in key.lower()
  )
  logging.info(
    'Iteration %d (%d/%d) done in %.1f s: %.1f train steps/s (waited %.2f s '
    'for data), eval return %.2f over %d episodes%s; ETA %s',
    iteration,
    iteration + 1,
    num_iterations,
    durations[-1],
    first('train_average_steps_per_second'),
    first('reload_seconds', 0.0),
    first('eval_average_return'),
    len(statistics.get('eval_episode_returns', [])),
    f', {losses}' if losses else '',
    progress.format_duration(np.mean(durations) * left),
  )


def write_scalars(
  writer: Any, dispatcher: Any, iteration: int, scalars: dict[str, float]
) -> None:
  """Writes scalar TensorBoard summaries at step `iteration`.

  The one place the runner writes summaries: TF agents hand over a
  tf.compat.v1 FileWriter (graph mode), JAX agents a TF2 summary writer.
  The same values go to Dopamine's collector dispatcher (metrics/), as
  Dopamine's runner does.

  Args:
    writer: the runner's summary writer, or None.
    dispatcher: Dopamine's CollectorDispatcher, or None.
    iteration: int, the summary step.
    scalars: dict, tag -> number.
  """
  if dispatcher is not None:
    dispatcher.write(
      [
        statistics_instance.StatisticsInstance(tag, float(value), iteration)
        for tag, value in scalars.items()
      ]
    )
  if writer is None:
    return
  if hasattr(writer, 'add_summary'):
    summary = tf.compat.v1.Summary(
      value=[
        tf.compat.v1.Summary.Value(tag=tag, simple_value=float(value))
        for tag, value in scalars.items()
      ]
    )
    writer.add_summary(summary, iteration)
  else:
    with writer.as_default():
      for tag, value in scalars.items():
        tf.summary.scalar(tag, float(value), step=iteration)
  writer.flush()


def tap_agent_losses(agent: Any, dispatcher: Any, tap: 'LossTap') -> None:
  """Routes the losses an agent reports to `tap` (a LossTap) as well.

  Args:
    agent: the agent; its summary writer or collector dispatcher is wrapped.
    dispatcher: the runner's CollectorDispatcher.
    tap: LossTap.
  """
  writer = getattr(agent, 'summary_writer', None)
  if writer is not None and hasattr(writer, 'add_summary'):
    # TF agents write merged summaries (their loss among them) through
    # `self.summary_writer.add_summary` every summary_writing_frequency
    # steps.
    agent.summary_writer = TappedFileWriter(writer, tap)
  if callable(getattr(agent, 'set_collector_dispatcher', None)):
    # JAX agents report their loss to the collector dispatcher.
    agent.set_collector_dispatcher(TappedDispatcher(dispatcher, tap))
