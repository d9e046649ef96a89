"""Parses gin config files, finding each file's includes next to it.

Every gin file the library reads (`fixed-replay train`, sweeps, runners made
with `create_runner`, agents restored for data generation) goes through
`load_gin_configs`, which parses like Dopamine's
`run_experiment.load_gin_configs` with one difference: a relative
`include 'dqn.gin'` is looked up first in the directory of the file being
parsed, then where gin looks (the current directory, then gin's search path).

Why: gin 0.5 resolves an include against its search path only, whose first
entry is the current directory, so `configs/dqn_1pct.gin`'s
`include 'dqn.gin'` would work from `configs/` alone, and would silently
take a `dqn.gin` that happens to lie in the user's current directory.

The documented commands name the repository's configs as `configs/dqn.gin`,
relative to a clone. The wheel installs those files with the package
(`fixed_replay/configs`, a link to `../configs` in a clone), so that a
relative `configs/...` path that is not in the working directory is read
from the installed copy instead (and the log says so): the documented
commands work after a plain `pip install`, from any directory. Any other
path (batch_rl's `batch_rl/fixed_replay/configs/...`, the user's own) is
read as given.
"""

from collections.abc import Sequence
import contextlib
import hashlib
import os
import re

from absl import logging
import gin

from fixed_replay.errors import UsageError
from fixed_replay.io import files

_INCLUDE = re.compile(r"""^\s*include\s+['"]([^'"]+)['"]""", re.MULTILINE)

# The repository's configs/ as installed with the package (package data).
PACKAGED_CONFIGS = os.path.join(
  os.path.dirname(os.path.abspath(__file__)), 'configs'
)
# The relative directory the documented commands name.
_CONFIGS = 'configs'
_said_packaged = set()  # Paths whose installed copy the log has named.


def _directory_of(config_file):
  if files.is_remote(config_file):
    return config_file.rpartition('/')[0]
  return os.path.dirname(os.path.abspath(config_file))


def config_digest(config_file: str) -> str:
  """SHA-256 of a gin file's text and of every file it includes, recursively.

  The file and its includes are found as load_gin_configs finds them. An
  include found nowhere counts by its name (parsing the file will then fail
  and say so).
  """
  config_file = locate(config_file)
  with files.open_read(config_file) as f:
    text = f.read()
  digest = hashlib.sha256(text)
  for name in _INCLUDE.findall(text.decode('utf-8', errors='replace')):
    beside = files.join(_directory_of(config_file), name)
    for candidate in (beside, name):
      if files.exists(candidate):
        digest.update(config_digest(candidate).encode())
        break
    else:
      digest.update(name.encode())
  return digest.hexdigest()


@contextlib.contextmanager
def _includes_next_to(config_file):
  """Puts config_file's directory first on gin's include search path."""
  config_file = os.fspath(config_file)
  directory = _directory_of(config_file)
  # gin 0.5 keeps its search path in this list and offers only an append
  # (add_config_file_search_path), which would come after the current
  # directory; the entry is removed again once the file is parsed.
  prefixes = gin.config._LOCATION_PREFIXES  # noqa: SLF001
  prefixes.insert(0, directory)
  try:
    yield
  finally:
    prefixes.remove(directory)  # The first occurrence: the one put there.


def _packaged_copy(config_file):
  """The installed copy of a relative `configs/...` path, else None."""
  if files.is_remote(config_file) or os.path.isabs(config_file):
    return None
  parts = os.path.normpath(config_file).split(os.sep)
  if len(parts) < 2 or parts[0] != _CONFIGS:
    return None
  return os.path.join(PACKAGED_CONFIGS, *parts[1:])


def locate(config_file: str, missing_ok: bool = False) -> str:
  """Where a gin file named by the user is read from.

  As given when it is there; else, for a relative `configs/NAME`, the copy
  of the repository's configs/ installed with fixed_replay (logged). With
  missing_ok, a file that is nowhere is returned as given (the caller
  reports it).

  Raises:
    UsageError: for a gin file that is not there, saying where it looked.
  """
  config_file = os.fspath(config_file)
  if files.exists(config_file):
    return config_file
  packaged = _packaged_copy(config_file)
  if packaged is not None and os.path.isfile(packaged):
    if config_file not in _said_packaged:
      _said_packaged.add(config_file)
      logging.info(
        'gin file %s is not in the working directory (%s): reading the copy '
        'installed with fixed_replay, %s',
        config_file,
        os.getcwd(),
        packaged,
      )
    return packaged
  if missing_ok:
    return config_file
  where = config_file
  if not files.is_remote(config_file):
    where = os.path.abspath(config_file)
  if packaged is not None:
    where += f' and {packaged}, the configs installed with fixed_replay'
  raise UsageError(
    f'gin file {config_file} not found (looked for {where}; relative paths '
    f'are relative to the working directory, {os.getcwd()})'
  )


def load_gin_configs(
  gin_files: Sequence[str],
  gin_bindings: Sequence[str],
  finalize_config: bool = True,
) -> None:
  """Parses gin files, then bindings (which win), as Dopamine does.

  Args:
    gin_files: sequence of paths to gin files; a relative `configs/...`
      path not in the working directory is read from the installed configs
      (see `locate`); a relative include in one of them is looked up next
      to it first.
    gin_bindings: sequence of gin binding strings, applied after the files.
    finalize_config: bool, lock the config afterwards (as Dopamine does).

  Raises:
    UsageError: naming a gin file that is not there.
  """
  gin_files = [locate(config_file) for config_file in gin_files]
  for config_file in gin_files:
    with _includes_next_to(config_file):
      gin.parse_config_file(os.fspath(config_file))
  gin.parse_config(list(gin_bindings))
  if finalize_config:
    gin.finalize()
