"""The run's dictionary a conversion into a compact store writes.

Every checkpoint of a run decodes against one zstd dictionary, beside them
(store/run_dictionary.py). A conversion writes it once, before any
checkpoint, and keeps it for every later one, so a resumed or extended
conversion writes the same bytes. It is trained on the first frames of
every checkpoint the conversion begins with; or, rewriting a store whose
checkpoints were all compressed against its own (an upgrade), it is that
one, so that units already encoded as the newest version's are copied as
they are (compact_output.py).
"""

import os
import time

from absl import logging
import numpy as np

from fixed_replay import progress
from fixed_replay.convert import checkpoint_source
from fixed_replay.convert import destination
from fixed_replay.errors import CheckpointError
from fixed_replay.store import manifest as manifest_lib
from fixed_replay.store import run_dictionary

# A run's dictionary trains on every _SPREAD-th of each checkpoint's first
# frames: on a run whose policy drifts, consecutive frames teach it less of
# each checkpoint's screens.
_SPREAD = 4
# What a run dictionary being written is named after: .<pid><this>.
PARTIAL_DICTIONARY = '.dict.partial'


def prepare_run(store_dir: str, sources) -> None:
  """Trains and writes the run's dictionary, unless the store has one.

  On the first written frames of every checkpoint in `sources` (those a
  conversion begins with: every checkpoint of a run of Dopamine's files or of
  a store; the first round's of RL Unplugged episodes), so that it knows
  the screens of every part of the run; a checkpoint whose frames cannot be
  read is left out, for its own conversion to report. Kept for every later
  checkpoint of the store, so a resumed conversion writes the same bytes.
  Rewriting a store whose checkpoints were all compressed against its run's
  dictionary (an upgrade) keeps that dictionary instead, so that their units
  are copied, not encoded again (compact_output.py).
  """
  path = run_dictionary.store_path(store_dir)
  if os.path.exists(path) or not sources:
    return
  began = time.perf_counter()
  dictionary = _sources_dictionary(sources)
  if dictionary is not None:
    _write_dictionary(store_dir, dictionary)
    logging.info(
      "Kept the run's dictionary of the store %s: its checkpoints' units "
      'are copied as they are where written alike',
      os.path.dirname(sources[0].directory),
    )
    return
  each = -(-run_dictionary.RUN_TRAINING_FRAMES // len(sources))
  frames = []
  for source in sources:
    try:
      with source.open() as reader:
        first = next(iter(reader.frame_slices(each * _SPREAD)), [])
        first = np.array(first[: reader.written_rows : _SPREAD])
        # Padding (all zero: Dopamine's before each episode, RL Unplugged's
        # after the last) teaches nothing, and left out, every route to a
        # store (RL Unplugged straight or through Dopamine's files) trains
        # on the same frames.
        frames += list(first[first.any(axis=tuple(range(1, first.ndim)))])
    except CheckpointError as error:  # Its own conversion reports it.
      logging.warning(
        'Training without checkpoint %d: %s', source.suffix, error
      )
  dictionary = run_dictionary.train(frames)
  _write_dictionary(store_dir, dictionary)
  logging.info(
    "Trained the run's dictionary of %s (%s) on every %dth of the first %d "
    'frames of %s in %.1f s',
    store_dir,
    progress.format_bytes(len(dictionary)),
    _SPREAD,
    each * _SPREAD,
    progress.count(len(sources), 'checkpoint'),
    time.perf_counter() - began,
  )


def _write_dictionary(store_dir: str, dictionary: bytes) -> None:
  partial = destination.write_bytes(
    store_dir, f'.{os.getpid()}{PARTIAL_DICTIONARY}', dictionary
  )
  os.replace(
    os.path.join(store_dir, partial), run_dictionary.store_path(store_dir)
  )
  destination.fsync_directory(store_dir)


def _sources_dictionary(sources) -> bytes | None:
  """The dictionary of the store `sources` come from, where they are all
  its checkpoints and were all compressed against it (so their units may
  be kept: compact_output.py), else None."""
  if not all(isinstance(s, checkpoint_source.StoredSource) for s in sources):
    return None
  stores = {os.path.dirname(os.path.abspath(s.directory)) for s in sources}
  path = run_dictionary.store_path(stores.pop())
  if stores or not os.path.exists(path):
    return None
  entry = manifest_lib.file_entry(path)
  for source in sources:
    try:
      manifest = manifest_lib.read_manifest(
        source.directory, manifest_lib.ALL_VERSIONS
      )
    except CheckpointError:  # Its own conversion reports it.
      return None
    if manifest['observation'].get('run_dictionary') != entry:
      return None
  with open(path, 'rb') as stream:
    return stream.read()
