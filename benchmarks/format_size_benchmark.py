"""Store size by format version, on the same checkpoints.

Each format version of the compact store is written only by the commits
that had it as their newest: this converts the checkpoints of `--data`
(Dopamine's gzip files) with this checkout's `convert` and with each commit
of `--commits` (defaults: adc5a91, the last to write version 3, and
7b7a8de, version 4), each run from a git worktree of that commit, one
conversion at a time, and prints for each version:

* its checkpoints' files, in bytes a row, and the share of the frames'
  units in them (the rest: their index and the per-row tables);
* the dictionaries: a checkpoint's own (version 3) are in its files, a
  run's (4 and later) is printed apart;
* the total against Dopamine's gzip files and against version 3, with a
  run's dictionary shared by `--run_checkpoints` (50: a DQN run) such
  checkpoints.

Usage:
  for G in MsPacman Breakout; do
    fixed-replay generate --environment=atari --game=$G --policy=random \\
      --checkpoint_rows=200000 --num_checkpoints=1 \\
      --output_dir=benchmarks/data/busy_${G}_200000
  done
  python benchmarks/format_size_benchmark.py \\
    --data=benchmarks/data/busy_MsPacman_200000
"""

import os
import tempfile

from absl import app
from absl import flags
import common

_DATA = flags.DEFINE_string('data', None, "Dopamine's files of a run.")
_COMMITS = flags.DEFINE_list(
  'commits',
  ['adc5a91', '7b7a8de'],
  'Earlier commits whose newest format version is compared.',
)
_RUN_CHECKPOINTS = flags.DEFINE_integer(
  'run_checkpoints', 50, "Checkpoints a run's dictionary is shared by."
)


def _measure(store):
  """(version, rows, checkpoints' bytes, units' bytes, run dictionary's)."""
  from fixed_replay.store import manifest as manifest_lib

  rows = checkpoints = units = 0
  version = None
  for directory in manifest_lib.find_stored_checkpoints(store).values():
    manifest = manifest_lib.read_manifest(directory)
    version, rows = manifest['version'], rows + manifest['num_rows']
    for name in os.listdir(directory):
      size = os.path.getsize(os.path.join(directory, name))
      checkpoints += size
      units += size if name == manifest['observation']['file'] else 0
  dictionary = os.path.join(store, manifest_lib.RUN_DICTIONARY_FILE)
  shared = os.path.getsize(dictionary) if os.path.exists(dictionary) else 0
  return version, rows, checkpoints, units, shared


def main(argv):
  del argv
  from fixed_replay.sources.dopamine import checkpoints as checkpoints_lib

  source = os.path.abspath(_DATA.value)
  found = checkpoints_lib.find_checkpoints(source)
  gzip = sum(os.path.getsize(p) for c in found.values() for p in c.all_paths())
  print(f'{source}: {len(found)} checkpoint(s), {gzip:,} bytes of gzip')
  print(common.load_average())
  results = []
  with tempfile.TemporaryDirectory(dir=common.DATA_DIR) as work:
    for commit in [*_COMMITS.value, None]:
      store = os.path.join(work, f'store_{commit or "this"}')
      seconds = common.convert_at_commit(commit, source, store)
      results.append((commit or 'this checkout', seconds, *_measure(store)))
  baseline = None
  print(
    f'{"written by":>14} {"version":>7} {"B/row":>7} {"units":>6} '
    f'{"run dict":>9} {"total/gzip":>10} {"vs first":>8} {"convert":>8}'
  )
  for commit, seconds, version, rows, stored, units, shared in results:
    # The run's dictionary, shared by a run of such checkpoints.
    total = stored + shared * len(found) / _RUN_CHECKPOINTS.value
    baseline = baseline or total
    print(
      f'{commit:>14} {version:>7} {stored / rows:7.2f} '
      f'{units / stored:6.1%} {shared:9,} {total / gzip:10.3f} '
      f'{total / baseline:8.3f} {seconds:7.0f}s'
    )


if __name__ == '__main__':
  flags.mark_flag_as_required('data')
  app.run(main)
