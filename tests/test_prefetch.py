"""BatchPrefetcher with one sampling function per thread."""

import itertools
import threading
import time

import pytest

from fixed_replay import prefetch


def test_every_thread_fills_the_one_queue():
  counters = [itertools.count(start) for start in (0, 1000, 2000)]
  names = set()

  def sampler(counter):
    def sample():
      names.add(threading.current_thread().name)
      return next(counter)

    return sample

  with prefetch.BatchPrefetcher(
    [sampler(c) for c in counters], depth=2, name='three'
  ) as prefetcher:
    # A loaded machine may starve a thread for a while: take batches until
    # every thread delivered one (bounded), not a fixed number.
    got = []
    deadline = time.monotonic() + 60
    while {v // 1000 for v in got} != {0, 1, 2} and time.monotonic() < deadline:
      got.append(prefetcher.get())
  assert not prefetcher.running
  assert {value // 1000 for value in got} == {0, 1, 2}
  assert names == {'three_0', 'three_1', 'three_2'}
  for stream in range(3):  # Each thread's batches come out in its order.
    mine = [value for value in got if value // 1000 == stream]
    assert mine == sorted(mine)


def test_pause_holds_every_thread_and_drops_older_batches():
  source = {'offset': 0}

  def sample():
    return source['offset']

  prefetcher = prefetch.BatchPrefetcher([sample, sample], depth=4)
  try:
    assert prefetcher.get() == 0
    with prefetcher.paused():
      source['offset'] = 1
    assert all(prefetcher.get() == 1 for _ in range(10))
  finally:
    prefetcher.close()


def test_a_failed_thread_fails_every_later_get():
  def broken():
    raise OSError('block 30 damaged')

  prefetcher = prefetch.BatchPrefetcher([broken, broken], depth=1)
  try:
    for _ in range(3):
      with pytest.raises(OSError, match='block 30'):
        prefetcher.get()
  finally:
    prefetcher.close()
