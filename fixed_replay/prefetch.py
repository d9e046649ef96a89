"""Minibatches prepared ahead in background threads.

`BatchPrefetcher` runs `sample_fn` (and an optional `transform`, e.g. moving
the batch to the accelerator) in a daemon thread and keeps up to `depth`
results in a bounded queue, so that a training step finds its minibatch
ready while the previous update runs (JAX releases the GIL while it
computes, and so do most of the buffer's numpy/numba gathers). Given one
sampling function per thread (each with its own random stream), several
threads fill the one queue: CompactReplayBuffer's block decoding runs
outside the GIL on every core.

It also measures what is left of the cost: `wait_seconds` is the time
`get()` spent blocked because no batch was ready, which is the share of a
training step spent waiting on the buffer.

With one thread, batches come out in the order `sample_fn` produced them, so
with a seeded buffer the stream is the one sampling in the foreground would
give, except
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


def _produce(prefetcher_ref, number, batches, lock, stop):
  """Producer `number`'s loop; holds the prefetcher only while sampling.

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
        item = prefetcher._transform(prefetcher._sample_fns[number]())
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
  """Produces `transform(sample_fn())` ahead of time in background threads."""

  def __init__(self, sample_fn, depth=2, transform=None, name='prefetch'):
    """Starts the producer threads.

    Args:
      sample_fn: callable returning one batch, or a sequence of them (one
        thread each); called only from the producer threads, never while
        `paused()` is held.
      depth: int >= 1, batches kept ready.
      transform: callable or None, applied to each batch in the producer
        thread (e.g. jax.device_put).
      name: str, the threads' name (numbered when there are several).

    Raises:
      ValueError: if depth < 1.
    """
    if depth < 1:
      raise ValueError(f'depth must be at least 1, got {depth}')
    fns = list(sample_fn) if not callable(sample_fn) else [sample_fn]
    self._sample_fns = fns
    self._transform = transform or (lambda batch: batch)
    self._queue = queue.Queue(maxsize=depth)
    # One lock a thread, held while it samples; paused() takes them all.
    self._locks = [threading.Lock() for _ in fns]
    self._stop = threading.Event()
    self._generation = 0
    self._failure = None
    self.wait_seconds = 0.0
    self.batches = 0
    self._threads = [
      threading.Thread(
        target=_produce,
        args=(weakref.ref(self), n, self._queue, lock, self._stop),
        name=name if len(fns) == 1 else f'{name}_{n}',
        daemon=True,
      )
      for n, lock in enumerate(self._locks)
    ]
    self._thread = self._threads[0]
    for thread in self._threads:
      thread.start()
    _LIVE.add(self)

  def get(self) -> object:
    """Returns the next batch, waiting (and counting the wait) if needed.

    Raises:
      RuntimeError: if the prefetcher is closed.
      Exception: whatever sample_fn or transform raised, in the producer.
    """
    if self._failure is not None:  # A producer failed: every call says so.
      raise self._failure
    began = time.perf_counter()
    while True:
      if self._stop.is_set():
        raise RuntimeError('BatchPrefetcher is closed')
      try:
        generation, item = self._queue.get(timeout=0.1)
      except queue.Empty:
        if not self.running and self._queue.empty():
          raise RuntimeError('the prefetch thread has stopped') from None
        continue
      if generation == self._generation or isinstance(item, _Failure):
        break
    self.wait_seconds += time.perf_counter() - began
    self.batches += 1
    if isinstance(item, _Failure):
      self._failure = item.error
      raise item.error
    return item

  @contextlib.contextmanager
  def paused(self):
    """Holds the producer off sampling; batches drawn before are dropped.

    Use it around anything that changes what `sample_fn` samples from.

    Yields:
      None.
    """
    with contextlib.ExitStack() as held:
      for lock in self._locks:
        held.enter_context(lock)
      self._generation += 1
      yield
      # Everything queued now was drawn before the change. A batch still
      # being put by the producer carries the old generation: get() skips it.
      with contextlib.suppress(queue.Empty):
        while True:
          self._queue.get_nowait()

  def reset_stats(self) -> None:
    """Zeroes `wait_seconds` and `batches`."""
    self.wait_seconds = 0.0
    self.batches = 0

  @property
  def running(self) -> bool:
    """Whether a producer thread is alive."""
    return any(thread.is_alive() for thread in self._threads)

  def close(self, timeout: float = 10.0) -> None:
    """Stops the producer threads and drops the batches they prepared.

    Args:
      timeout: float, seconds to wait for a sample in progress to finish.
    """
    self._stop.set()
    for thread in self._threads:
      thread.join(timeout)
      if thread.is_alive():
        logging.warning(
          'Prefetch thread %s did not stop within %.1f s',
          thread.name,
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
