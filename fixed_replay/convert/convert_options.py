"""What a conversion is asked for (ConvertOptions) and what it did."""

import dataclasses

from fixed_replay.errors import CheckpointError
from fixed_replay.store import manifest as manifest_lib


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
  """How checkpoints are stored.

  A compact store is written in its newest format version (zstd units,
  frame_units.py); older versions are read, not written.

  Attributes:
    block_rows: int, frames per unit: 1 (the default) decodes exactly the
      frames a transition uses; larger units store less and decode more
      per transition.
    clevel: int, compression level (0-9): zstd level
      unit_compression.zstd_level(clevel).
    stack_size: int, frames per state, for the table of valid rows; None
      (the default): the data's (observation_spec: 4 for Atari frames, else
      1).
    update_horizon: int, n of the n-step return, for that table.
    slice_bytes: int, uncompressed frame bytes read per step (the worker's
      memory beyond the small arrays).
    output_format: str, 'compact' (the compact store) or 'dopamine'
      (Dopamine's own gzip checkpoint files, dopamine_output.py).
    gzip_level: int, gzip level of the 'dopamine' output's files. zlib-ng
      at 2 compresses an Atari frame in ~7 us to ~1.6x the bytes of
      Dopamine's own level 9, which takes ~70 us (6: ~14 us, 1.4x):
      measured by the former benchmarks/rlu_convert_benchmark.py
      (benchmarks/convert_benchmark.py no longer writes this output).
    game: str or None, the dataset's game, recorded in each compact
      checkpoint's manifest (not an option of the format: a rerun with
      another game skips what is there).
  """

  block_rows: int = 1
  clevel: int = 5
  stack_size: int | None = None
  update_horizon: int = 1
  slice_bytes: int = 64 << 20
  output_format: str = 'compact'
  gzip_level: int = 2
  game: str | None = None

  def stored(self) -> dict:
    """The options a compact checkpoint records (its format's, not
    slice_bytes), and the format version written with them."""
    return {
      'block_rows': self.block_rows,
      'clevel': self.clevel,
      'stack_size': self.stack_size,
      'update_horizon': self.update_horizon,
      'version': manifest_lib.VERSION,
    }


@dataclasses.dataclass
class ConversionResult:
  """What a conversion did.

  Attributes:
    converted: list of suffixes converted now.
    skipped: list of suffixes already complete (checked, kept).
    frames: int, frames converted now.
    source_bytes: int, bytes of the source files of all stored checkpoints.
    store_bytes: int, bytes of the store's files for those checkpoints.
    seconds: float, wall time.
  """

  converted: list[int]
  skipped: list[int]
  frames: int
  source_bytes: int
  store_bytes: int
  seconds: float


def check_same_conversion(
  path: str,
  source,
  stored_source: dict | None,
  stored: dict,
  wanted: dict,
) -> None:
  """Refuses to skip a checkpoint converted from other files or options.

  Shared by both outputs (compact store and Dopamine files).

  Args:
    path: str, what the error names (the stored checkpoint or its manifest).
    source: the source of the checkpoint now (checkpoint_source.py).
    stored_source: dict, the source description recorded at conversion.
    stored: the options recorded at conversion.
    wanted: the options asked for now, in the same form.

  Raises:
    CheckpointError: if either differs.
  """
  if stored_source != source.description():
    raise CheckpointError(
      path,
      f'converted from other source files than those of checkpoint '
      f'{source.suffix} now ({stored_source["files"]}): '
      'convert into a new directory',
    )
  if stored != wanted:
    raise CheckpointError(
      path,
      f'converted with {stored}, now asked for {wanted}: use the same '
      'options or a new directory',
    )
