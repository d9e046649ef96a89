"""Converted checkpoints in Dopamine's own file format (`--format=dopamine`).

The conversion is convert.py's (a worker or Ray task per checkpoint, a partial
directory, verification, a commit, skip-after-check on a rerun); only the
files differ: those Dopamine's `OutOfGraphReplayBuffer.save` writes, flat in
DST, so that Dopamine's `load`, batch_rl-style code and FixedReplayBuffer
read them:

  DST/$store$_{observation,action,reward,terminal}_ckpt.N.gz
  DST/add_count_ckpt.N.gz, invalid_range_ckpt.N.gz,
  DST/episode_end_indices_ckpt.N.gz
  DST/.fixed_replay/checkpoint_N.json   the manifest: sizes and CRC-32 of
                                        every file, the source, the options

Committing moves the files out of the partial directory, `add_count` last
(without it readers treat the suffix as incomplete), then the manifest: a
suffix is complete when its manifest is there. A conversion killed in
between leaves files without a manifest, which the next run deletes and
writes again. A DST that holds checkpoint files but no `.fixed_replay/`
directory is someone else's and is refused.
"""

import json
import os
from typing import Any

import numpy as np

from fixed_replay.convert import compact_output
from fixed_replay.convert import convert_options
from fixed_replay.convert import destination
from fixed_replay.convert import workers as worker_processes
from fixed_replay.convert.checkpoint_source import CheckpointSource
from fixed_replay.convert.convert_options import ConvertOptions
from fixed_replay.errors import CheckpointError
from fixed_replay.io import npy_stream
from fixed_replay.io.gzip_stream import GzipStream
from fixed_replay.sources.dopamine import checkpoints
from fixed_replay.sources.dopamine import dopamine_writer
from fixed_replay.sources.dopamine import file_names
from fixed_replay.store import manifest as manifest_lib

FORMAT = 'fixed_replay.convert.dopamine_output'
VERSION = 1
META_DIR = '.fixed_replay'
MANIFEST = 'manifest.json'
_READ_BYTES = 4 << 20


def stored_options(options: ConvertOptions) -> dict:
  return {
    'gzip_level': options.gzip_level,
    'stack_size': options.stack_size,
    'update_horizon': options.update_horizon,
  }


def _frames_crc(path: str):
  """CRC-32 of the rows of a gzip .npy file, read through to its trailer."""
  value = 0
  with GzipStream(path) as stream:
    header = npy_stream.read_header(stream)
    left = header.nbytes
    while left:
      chunk = stream.read(min(left, _READ_BYTES))
      value = manifest_lib.crc32(chunk, value)
      left -= len(chunk)
    if stream.read_to_end():
      raise CheckpointError(path, 'more data after the rows its header lists')
  return header, value


class DopamineOutput:
  """Dopamine checkpoint files; see the module docstring.

  A checkpoint_commit.ConverterOutput.
  """

  def manifest_path(self, store_dir: str, suffix: int) -> str:
    return os.path.join(store_dir, META_DIR, f'checkpoint_{suffix}.json')

  final_path = manifest_path

  def exists(self, store_dir: str, suffix: int) -> bool:
    return os.path.exists(self.manifest_path(store_dir, suffix))

  def read_manifest(self, store_dir: str, suffix: int) -> dict:
    path = self.manifest_path(store_dir, suffix)
    try:
      with open(path) as stream:
        manifest = json.load(stream)
    except (OSError, ValueError) as error:
      raise CheckpointError(path, f'unreadable manifest: {error}') from error
    if manifest.get('format') != FORMAT or manifest.get('version') != VERSION:
      raise CheckpointError(
        path, f'format {manifest.get("format")} {manifest.get("version")}'
      )
    return manifest

  def stored_source(self, store_dir: str, suffix: int) -> dict | None:
    if not self.exists(store_dir, suffix):
      return None
    return self.read_manifest(store_dir, suffix)['source']

  def stored_bytes(self, store_dir: str, suffix: int) -> int:
    files = self.read_manifest(store_dir, suffix)['files']
    return sum(entry['bytes'] for entry in files.values())

  def stored_rows(self, store_dir: str, suffix: int) -> int:
    return self.read_manifest(store_dir, suffix)['num_rows']

  def verify_stored(self, store_dir: str, suffix: int) -> dict:
    """Checks every file of a committed checkpoint; returns the manifest."""
    manifest = self.read_manifest(store_dir, suffix)
    manifest_lib.verify_files(store_dir, manifest)
    return manifest

  def check_existing(
    self, store_dir: str, source: CheckpointSource, options: ConvertOptions
  ) -> None:
    manifest = self.verify_stored(store_dir, source.suffix)
    convert_options.check_same_conversion(
      self.manifest_path(store_dir, source.suffix),
      source,
      manifest['source'],
      manifest['options'],
      stored_options(options),
    )

  def prepare(self, store_dir: str, sources) -> None:
    """Nothing: Dopamine's checkpoints share nothing."""

  def run_bytes(self, store_dir: str) -> int:
    return 0

  def clean(self, store_dir: str) -> None:
    """Deletes files of uncommitted suffixes; refuses someone else's DST."""
    meta = os.path.join(store_dir, META_DIR)
    orphans = {}
    for name in os.listdir(store_dir):
      parsed = file_names.parse(name)
      if parsed and not self.exists(store_dir, parsed[1]):
        orphans.setdefault(parsed[1], []).append(name)
    if orphans and not os.path.isdir(meta):
      raise CheckpointError(
        store_dir,
        f'holds Dopamine checkpoint files of suffixes {sorted(orphans)} that '
        'fixed-replay convert did not write: convert into an empty directory',
      )
    for _, names in sorted(orphans.items()):
      for name in names:
        os.remove(os.path.join(store_dir, name))
    os.makedirs(meta, exist_ok=True)

  def write(self, source, partial, options, threads):  # ConverterOutput's.
    """Writes the checkpoint's files and manifest into `partial`."""
    suffix = source.suffix
    name = lambda element: file_names.checkpoint_filename(
      partial, element, suffix
    )
    with source.open(threads) as reader:
      writer = dopamine_writer.GzipNpyWriter(
        name(file_names.STORE_PREFIX + 'observation'),
        reader.dtype,
        reader.row_shape,
        options.gzip_level,
        threads,
      )
      try:
        slice_rows = compact_output.slice_rows(
          reader.row_shape, reader.dtype, options
        )
        for part in reader.frame_slices(slice_rows):
          writer.write(part)
          worker_processes.count_progress(len(part))
        writer.close()
      finally:
        writer.abort()
      rows = reader.finish(writer.num_rows)
    level, prefix = options.gzip_level, file_names.STORE_PREFIX
    arrays = {prefix + e: a for e, a in sorted(rows.arrays.items())}
    arrays['add_count'] = np.array(rows.add_count, dtype=np.int64)
    arrays['invalid_range'] = rows.invalid_range.astype(np.int64)
    for element, array in arrays.items():
      dopamine_writer.write_array(name(element), array, level)
    if rows.episode_end_indices is not None:
      dopamine_writer.write_episode_end_indices(
        name(file_names.EPISODE_END_INDICES), rows.episode_end_indices, level
      )
    manifest = {
      'format': FORMAT,
      'version': VERSION,
      'suffix': suffix,
      'num_rows': writer.num_rows,
      'add_count': rows.add_count,
      'frames_crc32': writer.crc32,
      'source': rows.description,
      'options': stored_options(options),
      'files': {
        entry: manifest_lib.file_entry(os.path.join(partial, entry))
        for entry in sorted(os.listdir(partial))
      },
    }
    manifest_lib.write_manifest(partial, manifest)
    return writer.num_rows, (manifest, rows)

  def verify(self, partial: str, written: Any) -> None:
    """Reads the written files back as a reader would; raises on any doubt."""
    manifest, rows = written
    files = checkpoints.find_checkpoints(partial)[manifest['suffix']]
    header, crc = _frames_crc(files.store_paths['observation'])
    if (
      crc != manifest['frames_crc32']
      or header.num_rows != (manifest['num_rows'])
    ):
      raise CheckpointError(
        files.store_paths['observation'], 'frames differ when read back'
      )
    back = checkpoints.read_checkpoint(files, 0, 0)
    for element, array in rows.arrays.items():
      path = files.store_paths[element]
      npy_stream.verify(path)
      if npy_stream.read_rows(path).tobytes() != array.tobytes():
        raise CheckpointError(path, 'differs from the source when read back')
    ends = rows.episode_end_indices
    if (
      back.add_count != rows.add_count
      or not np.array_equal(back.invalid_range, rows.invalid_range)
      or not np.array_equal(back.episode_end_indices, ends)  # None == None.
    ):
      raise CheckpointError(partial, 'bookkeeping differs when read back')
    manifest_lib.verify_files(partial, manifest)

  def commit(self, partial: str, store_dir: str, suffix: int) -> None:
    names = sorted(n for n in os.listdir(partial) if file_names.parse(n))
    last = file_names.file_name('add_count', suffix)
    for name in [n for n in names if n != last] + [last]:
      os.replace(os.path.join(partial, name), os.path.join(store_dir, name))
    destination.fsync_directory(store_dir)
    os.replace(
      os.path.join(partial, MANIFEST), self.manifest_path(store_dir, suffix)
    )
    destination.fsync_directory(os.path.join(store_dir, META_DIR))

  def remove(self, store_dir: str, suffix: int) -> None:
    """Deletes a committed checkpoint: its manifest first, then its files."""
    manifest = self.read_manifest(store_dir, suffix)
    os.remove(self.manifest_path(store_dir, suffix))
    destination.fsync_directory(os.path.join(store_dir, META_DIR))
    for name in manifest['files']:
      if name != MANIFEST and os.path.exists(os.path.join(store_dir, name)):
        os.remove(os.path.join(store_dir, name))
