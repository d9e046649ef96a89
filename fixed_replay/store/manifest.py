"""A compact store's layout on disk, and the manifest that describes it.

Each converted checkpoint is a `checkpoint_<suffix>/` directory (see
compact_store.py for the files it holds) that appears only by renaming a
complete `.checkpoint_<suffix>.partial-<pid>/` one. Its manifest.json records
the format and version, the codec, the block size, the rows, the source
files, the size and CRC-32 of every file, and the CRC-32 of its own content.

This is format version 6: beside the manifest, a checkpoint holds its
frames as units (`UNITS_FILE`) and every other array in one file of tables
(checkpoint_tables.py), each per-row table in the narrowest dtype that holds
its values exactly, with the byte offset of every ANCHOR_UNITS-th unit, so
that a unit is found from mapped sizes alone. Versions 1-5 are read only to
be upgraded (convert/legacy_store.py): a reader asked to sample one says the
command that rewrites it.
"""

from collections.abc import Collection
import json
import os
import re

import numpy as np

from fixed_replay.errors import CheckpointError
from fixed_replay.io import gzip_stream
from fixed_replay.sources.dopamine import checkpoints

# The format name manifests carry (the module's path when the format was
# made; kept, as every written store holds it).
FORMAT = 'fixed_replay.store.compact_store'
# The format version written and sampled.
VERSION = 6
# Versions an earlier fixed_replay wrote, read only to be upgraded.
LEGACY_VERSIONS = (1, 2, 3, 4, 5)
# Every version a manifest is read in where nothing is sampled.
ALL_VERSIONS = (*LEGACY_VERSIONS, VERSION)
MANIFEST = 'manifest.json'
UNITS_FILE = 'observation.units'
RUN_DICTIONARY_FILE = 'observation.dict'  # The run's, beside its checkpoints.
# A unit's offset is its anchor's plus at most ANCHOR_UNITS - 1 sizes: 0.125
# bytes a row of anchors, and a few dozen byte-wide additions a unit read.
ANCHOR_UNITS = 64
_CHECKPOINT_DIR = re.compile(r'^checkpoint_(?P<suffix>\d+)$')
_PARTIAL_DIR = re.compile(r'^\.checkpoint_(?P<suffix>\d+)\.partial-\d+$')
_VERIFY_READ_BYTES = 16 << 20
MANIFEST_CRC_KEY = 'manifest_crc32'
# The dataset's game ('Pong', as Dopamine names it), when known at
# conversion (`fixed-replay convert --game`, or the source's path).
GAME_KEY = 'game'
# Entries every manifest has, and their types (checked before any is used).
_MANIFEST_FIELDS = {
  'suffix': int,
  'num_rows': int,
  'add_count': int,
  'observation': dict,
  'arrays': dict,
  'valid_rows': dict,
  'files': dict,
  'source': dict,
}
_OBSERVATION_FIELDS = {
  'file': str,
  'dtype': str,
  'row_shape': list,
  'codec': str,
  'clevel': int,
  'block_rows': int,
  'num_blocks': int,
  'frames_crc32': int,
}

# The fastest CRC-32 at hand (isal's is ~10x zlib's); all compute zlib's.
_crc32 = gzip_stream.BACKENDS[gzip_stream.DEFAULT_BACKEND].crc32


def crc32(data: bytes | memoryview | np.ndarray, value: int = 0) -> int:
  """CRC-32 of a buffer (zlib's polynomial), optionally continuing `value`."""
  return _crc32(memoryview(data).cast('B'), value)


def checkpoint_dirname(suffix: int) -> str:
  """The directory of complete checkpoint `suffix` in a store."""
  return f'checkpoint_{suffix}'


def partial_dirname(suffix: int) -> str:
  """Where checkpoint `suffix` is written before it is complete."""
  return f'.checkpoint_{suffix}.partial-{os.getpid()}'


def partial_suffix(name: str) -> int | None:
  """The suffix of a partial checkpoint directory's name, or None."""
  match = _PARTIAL_DIR.match(name)
  return int(match['suffix']) if match else None


def file_entry(path: str) -> dict[str, int]:
  """{'bytes', 'crc32'} of a file, read in chunks."""
  value, size = 0, 0
  with open(path, 'rb') as stream:
    while chunk := stream.read(_VERIFY_READ_BYTES):
      value = crc32(chunk, value)
      size += len(chunk)
  return {'bytes': size, 'crc32': value}


def _manifest_text(manifest):
  """The canonical JSON of a manifest (what write_manifest writes)."""
  return json.dumps(manifest, indent=1, sort_keys=True)


def _check_fields(path: str, entries, fields, where):
  for key, kind in fields.items():
    value = entries.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
      raise CheckpointError(
        path, f'damaged manifest: {where}{key} is {value!r:.40}'
      )


# Entries of `observation` each version from the key on has.
_OBSERVATION_FIELDS_FROM = {
  3: {'unit_header': int},
  4: {'run_dictionary': dict},
  5: {'anchor_units': int},
}
_TABLES_FIELDS = {
  'file': str,
  'block_bytes': int,
  'block_crc32': str,
  'layout': dict,
}


def _check_manifest(path: str, manifest):
  """Checks the manifest's own CRC-32 and the types of its entries."""
  version = manifest['version']
  # Versions 1-4 may lack it; later ones require it, so that a flipped bit
  # in its name does not pass for an older store.
  if version >= 5 or MANIFEST_CRC_KEY in manifest:
    expected = manifest.pop(MANIFEST_CRC_KEY, None)
    actual = crc32(_manifest_text(manifest).encode())
    if actual != expected:
      raise CheckpointError(
        path,
        f'damaged manifest: content has CRC-32 {actual:#010x}, its '
        f'{MANIFEST_CRC_KEY} says {expected!r:.20}',
      )
  _check_fields(path, manifest, _MANIFEST_FIELDS, '')
  observation = manifest['observation']
  _check_fields(path, observation, _OBSERVATION_FIELDS, 'observation.')
  for first, fields in _OBSERVATION_FIELDS_FROM.items():
    if version >= first:
      _check_fields(path, observation, fields, 'observation.')
  if not 0 <= observation.get('unit_header', 0) < 1 << 16:
    raise CheckpointError(path, 'damaged manifest: observation.unit_header')
  if 'run_dictionary' in observation:
    _check_fields(
      path,
      observation['run_dictionary'],
      {'bytes': int, 'crc32': int},
      'observation.run_dictionary.',
    )
  if observation.get('anchor_units', 1) < 1:
    raise CheckpointError(path, 'damaged manifest: observation.anchor_units')
  if version >= 6:
    _check_fields(path, manifest, {'tables': dict}, '')
    _check_fields(path, manifest['tables'], _TABLES_FIELDS, 'tables.')
    if manifest['tables']['block_bytes'] < 1:
      raise CheckpointError(path, 'damaged manifest: tables.block_bytes')
  if GAME_KEY in manifest:  # Optional: the game, where the source named it.
    _check_fields(path, manifest, {GAME_KEY: str}, '')


def read_manifest(
  directory: str, versions: Collection[int] = (VERSION,)
) -> dict:
  """Reads and checks the manifest of a stored checkpoint.

  Args:
    directory: str, the checkpoint.
    versions: the format versions the caller reads: VERSION to sample, also
      LEGACY_VERSIONS to upgrade.

  Raises:
    CheckpointError: if it is missing, unreadable, damaged (its CRC-32), of
      another format, or of a version not in `versions` (for an older one,
      naming the command that upgrades the store).
  """
  path = os.path.join(directory, MANIFEST)
  try:
    with open(path, 'rb') as stream:
      manifest = json.loads(stream.read().decode('utf8'))
  except FileNotFoundError as error:
    raise CheckpointError(
      path, 'missing: not a compact store checkpoint'
    ) from error
  except (OSError, ValueError) as error:
    raise CheckpointError(path, f'unreadable manifest: {error}') from error
  if not isinstance(manifest, dict) or manifest.get('format') != FORMAT:
    format_name = manifest.get('format') if isinstance(manifest, dict) else None
    raise CheckpointError(path, f'format is {format_name!r}')
  version = manifest.get('version')
  known = ALL_VERSIONS
  if isinstance(version, int) and version > VERSION:
    raise CheckpointError(
      path,
      f'format version {version} is newer than this fixed_replay reads '
      f'(versions {known[0]}-{VERSION}): upgrade fixed_replay',
    )
  if version not in known or isinstance(version, bool):
    raise CheckpointError(
      path, f'format version {version!r:.20}, this reader knows {list(known)}'
    )
  if version not in versions:
    store = os.path.dirname(os.path.abspath(directory))
    raise CheckpointError(
      path,
      f'format version {version}, written by an earlier fixed_replay, is '
      f'no longer sampled: `fixed-replay convert {store} NEW_STORE` '
      f'rewrites the store in version {VERSION}',
    )
  _check_manifest(path, manifest)
  return manifest


def write_manifest(directory: str, manifest: dict) -> None:
  """Writes manifest.json deterministically (sorted keys) and syncs it.

  The written manifest holds the CRC-32 of its canonical text without that
  entry, so any change to its content is found when it is read.
  """
  manifest = dict(manifest)
  manifest.pop(MANIFEST_CRC_KEY, None)
  manifest[MANIFEST_CRC_KEY] = crc32(_manifest_text(manifest).encode())
  path = os.path.join(directory, MANIFEST)
  with open(path, 'w') as stream:
    stream.write(_manifest_text(manifest))
    stream.write('\n')
    stream.flush()
    os.fsync(stream.fileno())


def find_stored_checkpoints(store_dir: str) -> dict[int, str]:
  """Returns {suffix: directory} of the complete checkpoints of a store.

  Raises:
    CheckpointError: if the directory does not exist or holds none.
  """
  store_dir = str(store_dir)
  if not os.path.isdir(store_dir):
    raise CheckpointError(store_dir, 'compact store directory does not exist')
  found = {}
  for name in os.listdir(store_dir):
    match = _CHECKPOINT_DIR.match(name)
    if match:
      found[int(match['suffix'])] = os.path.join(store_dir, name)
  if not found:
    hint = ''
    if checkpoints.scan_checkpoints(store_dir)[0]:
      hint = ' (it holds gzip checkpoints: convert them first)'
    raise CheckpointError(
      store_dir,
      'no compact store checkpoint (checkpoint_N/ directories, written by '
      f'`fixed-replay convert SRC DST`){hint}',
    )
  return dict(sorted(found.items()))


def verify_files(
  directory: str, manifest: dict, skip: Collection[str] = ()
) -> None:
  """Checks the size and CRC-32 of every file the manifest lists.

  Raises:
    CheckpointError: naming the first file that differs.
  """
  for name, expected in sorted(manifest['files'].items()):
    if name not in skip:
      check_file(os.path.join(directory, name), expected)


def check_file(path: str, expected: dict | None, where: str = '') -> None:
  """Raises CheckpointError, after `where`, unless the file at `path` has
  the manifest's `expected` size and CRC-32 (None: it lists no such file)."""
  if expected is None:
    raise CheckpointError(path, 'not listed in the manifest')
  try:
    actual = file_entry(path)
  except FileNotFoundError as error:
    raise CheckpointError(path, 'missing from the stored checkpoint') from error
  if actual != expected:
    raise CheckpointError(
      path,
      f'{where}damaged: {actual["bytes"]} bytes with CRC-32 '
      f'{actual["crc32"]:#010x}, manifest says {expected["bytes"]} bytes '
      f'with {expected["crc32"]:#010x}',
    )
