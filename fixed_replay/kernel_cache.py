"""numba's on-disk cache of our kernels, kept valid across every kernel file.

numba checks a cached kernel against its own source file only (its mtime
and size). `decode_stacks` (replay/batch_kernels.py) calls `decode_units`
(store/unit_decoding.py), which numba compiles into it: after a change to
unit_decoding.py alone, numba would load the old `decode_stacks`, with the
old decoder inside. Keeping the rule by hand (change the caller's file too)
failed once already, when the bytes the decoder puts back changed.

So every kernel of this package is checked against one stamp instead: a
digest of the text of every file in KERNEL_FILES. Any change to any of them
compiles every kernel afresh, wherever numba keeps its cache; an unchanged
checkout (a new clone, a touched file) keeps it. tests/test_batch_kernels.py
checks that KERNEL_FILES lists every module that defines a cached kernel.
"""

import hashlib
import pathlib

from numba.core import caching

_PACKAGE = pathlib.Path(__file__).resolve().parent
# The modules whose kernels numba caches, relative to the package.
KERNEL_FILES = (
  'replay/batch_kernels.py',
  'replay/block_checks.py',
  'store/checkpoint_tables.py',
  'store/unit_decoding.py',
)
_PATHS = [_PACKAGE / name for name in KERNEL_FILES]
_STAMP = hashlib.sha256(b''.join(p.read_bytes() for p in _PATHS)).hexdigest()
_numba_stamp = caching._SourceFileBackedLocatorMixin.get_source_stamp  # noqa: SLF001


def _source_stamp(locator):
  """numba's stamp of a kernel's source file; for ours, the digest above."""
  if pathlib.Path(locator._py_file).resolve() in _PATHS:  # noqa: SLF001
    return _STAMP
  return _numba_stamp(locator)


def install() -> None:
  """Stamps our kernels so; called by each kernel module before its jit."""
  caching._SourceFileBackedLocatorMixin.get_source_stamp = _source_stamp  # noqa: SLF001
