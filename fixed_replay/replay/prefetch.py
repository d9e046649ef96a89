"""Minibatches prepared ahead in a background thread.

`BatchPrefetcher` runs `sample_fn` (and an optional `transform`, e.g. moving
the batch to the accelerator) in one daemon thread and keeps up to `depth`
results in a bounded queue, so that a training step finds its minibatch
ready while the previous update runs (JAX releases the GIL while it
computes, and so do most of the buffer's numpy/numba gathers).

It also measures what is left of the cost: `wait_seconds` is the time
`get()` spent blocked because no batch was ready, which is the share of a
training step spent waiting on the buffer.

Batches come out in the order `sample_fn` produced them, so with a seeded
buffer the stream is the one sampling in the foreground would give, except
that `paused()` (held while the buffer swaps in new data) discards batches
drawn before the swap.
"""

import atexit
import contextlib
import queue
import threading
import time
import weakref

from absl import logging

_LIVE = weakref.WeakSet()


@atexit.register
def _close_all():
  # A daemon thread killed halfway through an accelerator transfer at
  # interpreter exit can crash the process: stop them first.
  for prefetcher in list(_LIVE):
    prefetcher.close()


class _Failure:
  """An exception raised by the producer, handed over to the consumer."""

  def __init__(self, error):
    self.error = error


def _produce(prefetcher_ref, batches, lock, stop):
  """The producer loop; holds the prefetcher only while sampling.

  Holding it weakly lets an abandoned prefetcher (and the buffer its
  sample_fn reaches) be garbage collected, which ends this thread.
  """
  while not stop.is_set():
    prefetcher = prefetcher_ref()
    if prefetcher is None:
      return
    try:
      with lock:
        if stop.is_set():
          return
        generation = prefetcher._generation
        item = prefetcher._transform(prefetcher._sample_fn())
    except Exception as error:  # noqa: BLE001  (re-raised by get())
      item = _Failure(error)
    del prefetcher
    while not stop.is_set():
      if prefetcher_ref() is None:
        return
      try:
        batches.put((generation, item), timeout=0.1)
        break
      except queue.Full:
        continue
    if isinstance(item, _Failure):
      return


class BatchPrefetcher:
  """Produces `transform(sample_fn())` ahead of time in a background thread."""

  def __init__(self, sample_fn, depth=2, transform=None, name='prefetch'):
    """Starts the producer thread.

    Args:
      sample_fn: callable returning one batch; called only from the producer
        thread, never while `paused()` is held.
      depth: int >= 1, batches kept ready.
      transform: callable or None, applied to each batch in the producer
        thread (e.g. jax.device_put).
      name: str, the thread's name.

    Raises:
      ValueError: if depth < 1.
    """
    if depth < 1:
      raise ValueError(f'depth must be at least 1, got {depth}')
    self._sample_fn = sample_fn
    self._transform = transform or (lambda batch: batch)
    self._queue = queue.Queue(maxsize=depth)
    self._lock = threading.Lock()  # Held while sampling.
    self._stop = threading.Event()
    self._generation = 0
    self.wait_seconds = 0.0
    self.batches = 0
    self._thread = threading.Thread(
      target=_produce,
      args=(weakref.ref(self), self._queue, self._lock, self._stop),
      name=name,
      daemon=True,
    )
    self._thread.start()
    _LIVE.add(self)

  def get(self):
    """Returns the next batch, waiting (and counting the wait) if needed.

    Raises:
      RuntimeError: if the prefetcher is closed.
      Exception: whatever sample_fn or transform raised, in the producer.
    """
    began = time.perf_counter()
    while True:
      if self._stop.is_set():
        raise RuntimeError('BatchPrefetcher is closed')
      try:
        generation, item = self._queue.get(timeout=0.1)
      except queue.Empty:
        if not self._thread.is_alive() and self._queue.empty():
          raise RuntimeError('the prefetch thread has stopped') from None
        continue
      if generation == self._generation or isinstance(item, _Failure):
        break
    self.wait_seconds += time.perf_counter() - began
    self.batches += 1
    if isinstance(item, _Failure):
      raise item.error
    return item

  @contextlib.contextmanager
  def paused(self):
    """Holds the producer off sampling; batches drawn before are dropped.

    Use it around anything that changes what `sample_fn` samples from.

    Yields:
      None.
    """
    with self._lock:
      self._generation += 1
      yield
      # Everything queued now was drawn before the change. A batch still
      # being put by the producer carries the old generation: get() skips it.
      with contextlib.suppress(queue.Empty):
        while True:
          self._queue.get_nowait()

  def reset_stats(self):
    """Zeroes `wait_seconds` and `batches`."""
    self.wait_seconds = 0.0
    self.batches = 0

  @property
  def running(self):
    """Whether the producer thread is alive."""
    return self._thread.is_alive()

  def close(self, timeout=10.0):
    """Stops the producer thread and drops the batches it prepared.

    Args:
      timeout: float, seconds to wait for a sample in progress to finish.
    """
    self._stop.set()
    self._thread.join(timeout)
    if self._thread.is_alive():
      logging.warning(
        'Prefetch thread %s did not stop within %.1f s',
        self._thread.name,
        timeout,
      )
    with contextlib.suppress(queue.Empty):
      while True:
        self._queue.get_nowait()
    _LIVE.discard(self)

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()
