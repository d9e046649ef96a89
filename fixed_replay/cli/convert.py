"""`fixed-replay convert SRC DST`: gzip checkpoints into a compact store.

Converts every complete checkpoint of the replay directory SRC (local or
gs://) into DST/checkpoint_<suffix>/: frames in independently decodable
blosc2 blocks, the small arrays as plain .npy, the table of valid rows, and a
manifest with checksums. Checkpoints are converted in parallel, one process
each, streaming (bounded memory), and each is verified before it is renamed
into place. Run it again after an interruption: converted checkpoints are
checked and skipped, the rest converted. SRC is never modified.

Then train with `WrappedFixedReplayBuffer.memory_class =
@CompactReplayBuffer` and --replay_dir=DST.

  fixed-replay convert /data/Pong/1/replay_logs /data/Pong/1/compact
"""

import sys

from absl import app
from absl import flags

from fixed_replay import cli
from fixed_replay.errors import CheckpointError
from fixed_replay.replay import memory_budget as memory
from fixed_replay.store import convert

_DEFAULTS = convert.ConvertOptions()
_BLOCK_ROWS = flags.DEFINE_integer(
  'block_rows',
  _DEFAULTS.block_rows,
  'Frames per compressed block: larger compresses better, decodes more per '
  'random read.',
  lower_bound=1,
)
_CODEC = flags.DEFINE_enum(
  'codec',
  _DEFAULTS.codec,
  ['zstd', 'lz4', 'lz4hc', 'zlib', 'blosclz'],
  'blosc2 codec of the frame blocks.',
)
_CLEVEL = flags.DEFINE_integer(
  'clevel',
  _DEFAULTS.clevel,
  'blosc2 compression level.',
  lower_bound=0,
  upper_bound=9,
)
_STACK_SIZE = flags.DEFINE_integer(
  'stack_size',
  _DEFAULTS.stack_size,
  'Frames per state, for the precomputed table of valid rows.',
  lower_bound=1,
)
_UPDATE_HORIZON = flags.DEFINE_integer(
  'update_horizon',
  _DEFAULTS.update_horizon,
  'n of the n-step return, for the table of valid rows (other values are '
  'computed when the buffer opens the store).',
  lower_bound=1,
)
_WORKERS = flags.DEFINE_integer(
  'workers',
  None,
  'Processes converting checkpoints at once (default: one per core); 0 '
  'converts in this process.',
  lower_bound=0,
)

_REMOTE_TIMEOUT = cli.define_remote_timeout_flag(__name__)

_USAGE = 'usage: fixed-replay convert SRC DST [--block_rows=16] [--workers=N]'


def main(argv):
  """Converts SRC into DST and prints a summary."""
  if len(argv) != 3:
    raise app.UsageError(
      f'expected SRC and DST, got {len(argv) - 1} arguments\n{_USAGE}'
    )
  cli.apply_remote_timeout(_REMOTE_TIMEOUT)
  options = convert.ConvertOptions(
    block_rows=_BLOCK_ROWS.value,
    codec=_CODEC.value,
    clevel=_CLEVEL.value,
    stack_size=_STACK_SIZE.value,
    update_horizon=_UPDATE_HORIZON.value,
  )
  try:
    result = convert.convert(argv[1], argv[2], options, workers=_WORKERS.value)
  except CheckpointError as error:
    print(f'fixed-replay convert: {error}', file=sys.stderr)
    return 1
  rate = result.frames / result.seconds if result.seconds else 0.0
  print(
    f'converted {len(result.converted)} checkpoint(s) {result.converted}, '
    f'{len(result.skipped)} already there {result.skipped}; '
    f'{result.frames:,} frames in {result.seconds:.1f} s ({rate:,.0f}/s)'
  )
  print(
    f'store {memory.format_bytes(result.store_bytes)} for '
    f'{memory.format_bytes(result.source_bytes)} of gzip '
    f'({result.store_bytes / max(result.source_bytes, 1):.2f}x): {argv[2]}'
  )
  return 0


if __name__ == '__main__':
  app.run(main)
