"""Tests for fixed_replay/store/unit_decoding.py: the compiled unit decoder."""

import os
import subprocess
import sys
import textwrap

# Threads decoding batches of one store at once while another allocates and
# fills memory. All in one malloc arena, so that memory one thread frees is
# what the next allocation of any thread gets.
_CONCURRENT_DECODING = textwrap.dedent(
  """
  import sys
  import threading

  import numpy as np

  from fixed_replay.store import compact_store
  from fixed_replay.store import frame_units

  store, suffixes = sys.argv[1], [int(s) for s in sys.argv[2:]]
  checkpoints = [
    compact_store.StoredCheckpoint(f'{store}/checkpoint_{s}') for s in suffixes
  ]
  sources = [c.frames for c in checkpoints]
  reader = frame_units.FrameReader(sources)
  expected = [s.read_rows(0, s.num_rows) for s in sources]
  failures, stop = [], threading.Event()

  def decode(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
      which = np.sort(rng.integers(0, len(sources), 160))
      rows = np.empty(len(which), np.int64)
      for w, source in enumerate(sources):
        mine = which == w
        rows[mine] = np.sort(
          rng.choice(source.num_rows, mine.sum(), replace=False)
        )
      out = np.empty((len(rows),) + sources[0].row_shape, np.uint8)
      try:
        reader.read(which, rows, out)
      except Exception as error:
        failures.append(repr(error))
        return
      for w in range(len(sources)):
        mine = which == w
        if not np.array_equal(out[mine], expected[w][rows[mine]]):
          failures.append(f'wrong frames of checkpoint {suffixes[w]}')
          return

  def allocate():
    while not stop.is_set():
      for size in np.random.randint(1000, 40000, 50):
        np.empty(int(size)).fill(3)

  churn = threading.Thread(target=allocate)
  churn.start()
  threads = [threading.Thread(target=decode, args=(n,)) for n in range(3)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  stop.set()
  churn.join()
  print(failures or 'decoded')
  """
)


def test_threads_decode_exactly_while_others_allocate(store):
  """Each call reads into memory it holds until it returns.

  Its scratch buffer once was freed as soon as its address was taken: with
  other threads allocating, reads landed in their memory (CRC errors on a
  sound store, heap corruption, crashes within a second here).
  """
  suffixes = sorted(
    int(p.name.split('_')[1]) for p in store.glob('checkpoint_*')
  )
  result = subprocess.run(
    [sys.executable, '-c', _CONCURRENT_DECODING, str(store)]
    + [str(s) for s in suffixes],
    env=dict(os.environ, MALLOC_ARENA_MAX='1'),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip() == 'decoded', result.stdout
