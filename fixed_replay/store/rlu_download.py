"""Downloads a run's shards and converts each as it arrives.

So that the raw shards (~1 KB a frame, ~50 GB a run) need not stay on disk:
one shard at a time is fetched (dataset/download.py), converted with
rlu_convert (checkpoints verified before they are committed), and its raw
copy deleted once every checkpoint known to draw on it is stored as planned.
A checkpoint whose episodes turn out to span shards is converted again when
the later shard arrives, fetching the earlier one again: a rare layout pays
a second download, the usual one never does. Killed and restarted, it skips
what is stored and indexed, and fetches only what is still needed.
"""

from collections.abc import Iterable
import os
import time

from absl import logging

from fixed_replay.dataset import download
from fixed_replay.store import rlu_convert
from fixed_replay.store import rlu_plan
from fixed_replay.store.convert_options import ConvertOptions


def _part(shard):
  return rlu_plan.Part(shard.name, shard.number, shard.num_bytes)


def download_and_convert(
  game: str,
  run: int,
  destination: str,
  store_dir: str,
  checkpoints: Iterable[int] | None = None,
  root: str = download.DEFAULT_ROOT,
  options: ConvertOptions | None = None,
) -> download.DownloadResult:
  """Fetches, converts and drops the raw shards of a run one by one.

  Args:
    game: str.
    run: int.
    destination: str, raw shards go to destination/<game>/ (temporarily).
    store_dir: str, the converted output.
    checkpoints: optional iterable of shard numbers.
    root: str, the bucket directory or a local stand-in.
    options: convert_options.ConvertOptions (rlu_convert.default_options()).

  Returns:
    download.DownloadResult with `conversion` set.
  """
  began = time.perf_counter()
  options = options or rlu_convert.default_options()
  shards = download.select(
    download.list_run(root, game, run), checkpoints, root, game
  )
  by_name = {shard.name: shard for shard in shards}
  directory = os.path.join(str(destination), game)
  os.makedirs(directory, exist_ok=True)
  os.makedirs(store_dir, exist_ok=True)
  download._remove_temporaries(directory)
  result = download.DownloadResult([], [], 0, 0.0, {'converted': []})

  def fetch(names) -> None:
    for name in sorted(names):
      _, copied = download.fetch(by_name[name], directory)
      if copied:
        result.downloaded.append(name)
        result.bytes += copied

  def convert_parts(parts, **kwargs) -> None:
    converted = rlu_convert.convert_rlu(
      directory,
      store_dir,
      kind='rlu',
      options=options,
      workers=0,
      parts=list(parts),
      **kwargs,
    )
    result.conversion['converted'] += converted.converted

  parts = []
  for shard in shards:
    parts.append(_part(shard))
    unindexed, _ = rlu_convert.unfinished(directory, store_dir, parts, options)
    if unindexed:  # Converted as its own checkpoint and indexed, one read.
      fetch(p.name for p in unindexed)
      convert_parts(unindexed, recheck=False, plan=False)
    _, todo = rlu_convert.unfinished(directory, store_dir, parts, options)
    if todo:  # Checkpoints drawing on several shards.
      fetch(set().union(*todo.values()))
      convert_parts(parts, recheck=False)
    if shard.name not in result.downloaded:
      result.skipped.append(shard.name)
    for part in parts:
      path = os.path.join(directory, part.name)
      if os.path.exists(path):
        logging.info('Deleting %s: its checkpoints are converted', part.name)
        os.remove(path)
  # Every stored checkpoint checked once more, against the whole plan.
  convert_parts(parts, recheck=True)
  result.conversion['converted'] = sorted(set(result.conversion['converted']))
  result.seconds = time.perf_counter() - began
  return result
