"""One dictionary a run against one a checkpoint, on a policy that drifts.

Format 4 trains one zstd dictionary a run, on the first frames of all its
checkpoints, where format 3 trained one a checkpoint, on its own. A DQN
run's policy improves from checkpoint to checkpoint, and reaches screens
its early checkpoints never show: this measures what compressing every
checkpoint against the run's dictionary costs against each checkpoint's own.

The data: real ALE play of `--game` (Pong or Breakout) by its scripted
controller behind an epsilon-greedy policy whose epsilon falls across the
run's checkpoints (`--epsilons`, 1.0, 0.5, 0.1, 0.01), each checkpoint
written by Dopamine's own `save` (`fixed-replay generate`, one run a
checkpoint, renamed into one run's suffixes; kept in benchmarks/data).
Both stores are written by today's `convert`, so they differ only in the
dictionary's scope:

* run: the run converted as one store, one dictionary for every checkpoint;
* checkpoint: each checkpoint converted alone, so trained on its own frames.

Printed, per checkpoint and in all: the units' bytes, the dictionaries',
and the total against Dopamine's gzip files.

Usage: python benchmarks/dictionary_drift_benchmark.py --game=Pong
  --rows=20000 [--epsilons=1.0,0.5,0.1,0.01]
"""

import os
import shutil
import time

from absl import app
from absl import flags
import common

# --game (Pong or Breakout: a scripted controller) and --rows (rows a
# checkpoint) are common.py's flags.
_EPSILONS = flags.DEFINE_list(
  'epsilons', ['1.0', '0.5', '0.1', '0.01'], 'Epsilon of each checkpoint.'
)


def write_run(game, rows, epsilons):
  """benchmarks/data/drift_<game>_<rows>/: checkpoint k played at eps[k]."""
  from fixed_replay.generate import generate

  run = os.path.join(common.DATA_DIR, f'drift_{game}_{rows}')
  if os.path.isdir(run):
    return run
  partial = run + '.partial'
  shutil.rmtree(partial, ignore_errors=True)
  for suffix, epsilon in enumerate(epsilons):
    played = os.path.join(partial, f'played_{suffix}')
    generate.generate_dataset(
      played,
      game=game,
      policy='scripted',
      epsilon=epsilon,
      num_checkpoints=1,
      checkpoint_rows=rows,
      seed=suffix,
      progress=False,
    )
    for name in os.listdir(played):
      os.rename(
        os.path.join(played, name),
        os.path.join(partial, name.replace('.0.gz', f'.{suffix}.gz')),
      )
    os.rmdir(played)
  os.rename(partial, run)
  return run


def _bytes(directory, names=None):
  return sum(
    os.path.getsize(os.path.join(directory, name))
    for name in os.listdir(directory)
    if names is None or name in names
  )


def main(argv):
  del argv
  from fixed_replay import progress
  from fixed_replay.convert import convert
  from fixed_replay.sources.dopamine import checkpoints
  from fixed_replay.store import manifest as manifest_lib

  epsilons = [float(e) for e in _EPSILONS.value]
  print(
    f'dictionary_drift_benchmark {time.strftime("%Y-%m-%d %H:%M UTC")}, '
    f'{os.cpu_count()} cores, {common.load_average()}; {common.GAME.value}, '
    f'{len(epsilons)} checkpoints of {common.ROWS.value:,} rows, epsilon '
    f'{", ".join(map(str, epsilons))}'
  )
  run = write_run(common.GAME.value, common.ROWS.value, epsilons)
  work = os.path.join(common.DATA_DIR, f'drift_{common.GAME.value}_stores')
  shutil.rmtree(work, ignore_errors=True)
  convert.convert(run, os.path.join(work, 'run'), workers=0)
  found = checkpoints.find_checkpoints(run)
  dictionary = manifest_lib.RUN_DICTIONARY_FILE
  units = [manifest_lib.UNITS_FILE]
  print('checkpoint  epsilon  gzip       run: units     own: units  own dict')
  totals = {'gzip': 0, 'run': 0, 'own': 0, 'own_dicts': 0}
  for suffix, epsilon in zip(sorted(found), epsilons, strict=True):
    alone = os.path.join(work, f'alone_{suffix}')
    os.makedirs(alone)
    for path in found[suffix].all_paths():
      os.link(path, os.path.join(alone, os.path.basename(path)))
    own = os.path.join(work, f'own_{suffix}')
    convert.convert(alone, own, workers=0)
    name = manifest_lib.checkpoint_dirname(suffix)
    gzip = sum(os.path.getsize(p) for p in found[suffix].all_paths())
    run_units = _bytes(os.path.join(work, 'run', name), units)
    own_units = _bytes(os.path.join(own, name), units)
    own_dict = os.path.getsize(os.path.join(own, dictionary))
    totals['gzip'] += gzip
    totals['run'] += _bytes(os.path.join(work, 'run', name))
    totals['own'] += _bytes(os.path.join(own, name)) + own_dict
    totals['own_dicts'] += own_dict
    print(
      f'{suffix:>10}  {epsilon:>7}  {progress.format_bytes(gzip):>9}  '
      f'{progress.format_bytes(run_units):>13}  '
      f'{progress.format_bytes(own_units):>13}  '
      f'{progress.format_bytes(own_dict):>8}  '
      f'(run/own units {run_units / own_units:.3f}x)'
    )
  run_dict = os.path.getsize(os.path.join(work, 'run', dictionary))
  totals['run'] += run_dict
  print(
    f'all files: run {progress.format_bytes(totals["run"])} (one '
    f'dictionary, {progress.format_bytes(run_dict)}) = '
    f'{totals["run"] / totals["gzip"]:.3f}x gzip; own '
    f'{progress.format_bytes(totals["own"])} ('
    f'{progress.format_bytes(totals["own_dicts"])} of dictionaries) = '
    f'{totals["own"] / totals["gzip"]:.3f}x gzip; run / own = '
    f'{totals["run"] / totals["own"]:.3f}x; {common.load_average()}'
  )
  shutil.rmtree(work)


if __name__ == '__main__':
  app.run(main)
