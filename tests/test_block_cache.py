"""The decoded-block cache: bounded, least recently used, pinned, shared."""

import threading
import time

import numpy as np
import pytest

from fixed_replay.store.block_cache import BlockCache


class _Loader:
  """Fills a block with its key; counts calls; can be slow or fail."""

  def __init__(self, delay=0.0, fail=()):
    self.calls = []
    self.delay = delay
    self.fail = set(fail)
    self._lock = threading.Lock()

  def __call__(self, keys, slots, arena):
    with self._lock:
      self.calls.extend(keys.tolist())
    time.sleep(self.delay)
    for key, slot in zip(keys.tolist(), slots.tolist(), strict=True):
      if key in self.fail:
        raise OSError(f'block {key} is unreadable')
      arena[slot] = key


def _contents(cache, slots):
  return [int(cache.arena[s, 0, 0]) for s in slots]


def test_blocks_decoded_once_and_evicted_least_recently_used():
  cache = BlockCache(3, (2, 4), np.int64)
  load = _Loader()
  cache.release(cache.acquire([1, 2, 3], load))
  cache.release(cache.acquire([1], load))  # 2 is now the oldest.
  slots = cache.acquire([4, 1], load)
  assert _contents(cache, slots) == [4, 1]
  cache.release(slots)
  assert load.calls == [1, 2, 3, 4]
  assert (cache.hits, cache.misses) == (2, 4)
  cache.release(cache.acquire([2], load))  # Was evicted: decoded again.
  assert load.calls[-1] == 2
  assert cache.nbytes == 3 * 2 * 4 * 8


def test_pinned_blocks_are_never_evicted():
  cache = BlockCache(2, (1, 1), np.int64)
  load = _Loader()
  pinned = cache.acquire([1], load)
  cache.release(cache.acquire([2], load))
  cache.release(cache.acquire([3], load))  # Evicts 2, not the pinned 1.
  assert _contents(cache, pinned) == [1]
  with pytest.raises(RuntimeError, match='pinned'):
    cache.acquire([4, 5, 6], load)  # Three blocks, two slots.
  cache.release(pinned)
  slots = cache.acquire([4, 5], load)
  assert _contents(cache, slots) == [4, 5]


def test_failed_decode_leaves_nothing_pinned_or_cached():
  cache = BlockCache(2, (1, 1), np.int64)
  load = _Loader(fail=[7])
  with pytest.raises(OSError, match='block 7'):
    cache.acquire([6, 7], load)
  load.fail.clear()
  slots = cache.acquire([7, 8], load)  # Both slots are free again.
  assert _contents(cache, slots) == [7, 8]
  assert load.calls.count(7) == 2


def test_threads_share_blocks_being_decoded():
  cache = BlockCache(64, (1, 1), np.int64)
  load = _Loader(delay=0.01)
  results, errors = [], []

  def work(keys):
    try:
      slots = cache.acquire(keys, load)
      results.append((keys, _contents(cache, slots)))
      cache.release(slots)
    except Exception as error:  # noqa: BLE001 - reported below.
      errors.append(error)

  threads = [
    threading.Thread(target=work, args=([k, k + 1, k + 2],)) for k in range(8)
  ]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert not errors
  for keys, contents in results:
    assert contents == keys
  assert sorted(load.calls) == list(range(10))  # Each decoded once.
