"""GZIP TFRecord files of `tf.train.Example`s, read without TensorFlow.

RL Unplugged's shards are GZIP TFRecords. Reading them through TensorFlow
made every command that touches a shard (`download`'s verification,
`inspect`, `convert`) pay for importing it first: 4-5 CPU-seconds, more than
`inspect` then spends on a shard of a few episodes, and once in every
conversion worker. The format is small enough to read exactly here:

* a record is an 8-byte little-endian length, the masked CRC-32C of those
  8 bytes, the data, and the masked CRC-32C of the data (TensorFlow's
  `tensorflow/core/io/record_writer.cc`); every CRC is checked, as
  TensorFlow's reader does;
* the file is gzip (one stream or several members), read by GzipStream,
  which checks every member's CRC-32 and length as well, which TensorFlow's
  reader leaves unread when a file's last bytes are cut off;
* CRC-32C is ISA-L's `crc32_iscsi` (python-isal, already a dependency: the
  store's decoder uses its CRC-32), tens of GB/s with SSE 4.2;
* `Example` is a protobuf class built from the schema of TensorFlow's
  `example.proto` and `feature.proto` (field numbers and types, the whole
  wire contract) in a private descriptor pool, so it never clashes with
  TensorFlow's own `tensorflow.Example` in a process that has both. Its
  messages have the same fields as `tf.train.Example`'s.

tests/test_tfrecord.py reads shards that TensorFlow wrote and checks every
record and every parsed Example against TensorFlow's reader and classes.
"""

from collections.abc import Iterator
import ctypes
import importlib.util
import struct

from google.protobuf import descriptor_pb2
from google.protobuf import descriptor_pool
from google.protobuf import message_factory

from fixed_replay.errors import CheckpointError
from fixed_replay.io.gzip_stream import GzipStream

HEADER_BYTES = 12  # The length (8 bytes) and its masked CRC.
FOOTER_BYTES = 4  # The data's masked CRC.
# A record longer than this is damage, not an episode: the longest Atari
# episode (108,000 frames of ~1-2 KB PNGs at most) is far below 1 GiB.
MAX_RECORD_BYTES = 1 << 30
_MASK_DELTA = 0xA282EAD8

_isal = ctypes.CDLL(importlib.util.find_spec('isal.isal_zlib').origin)
_crc32_iscsi = _isal.crc32_iscsi
_crc32_iscsi.restype = ctypes.c_uint32
_crc32_iscsi.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint32]


def masked_crc32c(data: bytes) -> int:
  """TFRecord's masked CRC-32C of `data` (rotated right by 15, plus delta)."""
  crc = _crc32_iscsi(data, len(data), 0xFFFFFFFF) ^ 0xFFFFFFFF
  return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def read_records(
  path: str, stream: GzipStream | None = None
) -> Iterator[tuple[int, bytes]]:
  """Yields (offset, data) of every record of a GZIP TFRecord file.

  `offset` is where the record starts in the uncompressed stream. Reads to
  the end of the file, so its gzip trailer is checked too.

  Args:
    path: str, local or any path `tf.io.gfile` reads (for messages too).
    stream: optional open GzipStream of `path` (the caller closes it).

  Raises:
    CheckpointError: naming the file and the offset, for a truncated or
      corrupted record (TensorFlow's words), or damaged gzip data.
  """
  if stream is None:
    with GzipStream(path) as opened:
      yield from read_records(path, opened)
    return
  while True:
    offset = stream.position
    header = stream.read_at_most(HEADER_BYTES)
    if not header:
      return
    if len(header) < HEADER_BYTES:
      raise CheckpointError(path, f'truncated record at {offset}')
    (length,) = struct.unpack('<Q', header[:8])
    if masked_crc32c(header[:8]) != struct.unpack('<I', header[8:])[0]:
      raise CheckpointError(path, f'corrupted record at {offset}')
    if length > MAX_RECORD_BYTES:
      raise CheckpointError(
        path, f'record at {offset} claims {length} bytes: damaged'
      )
    record = stream.read_at_most(length)
    footer = stream.read_at_most(FOOTER_BYTES)
    if len(footer) < FOOTER_BYTES:
      raise CheckpointError(path, f'truncated record at {offset}')
    if masked_crc32c(record) != struct.unpack('<I', footer)[0]:
      raise CheckpointError(path, f'corrupted record at {offset}')
    yield offset, record


def _example_schema() -> descriptor_pb2.FileDescriptorProto:
  """TensorFlow's Example/Features/Feature messages, as a descriptor."""
  field = descriptor_pb2.FieldDescriptorProto
  repeated, optional = field.LABEL_REPEATED, field.LABEL_OPTIONAL
  package = 'fixed_replay.tf_example'
  schema = descriptor_pb2.FileDescriptorProto(
    name='fixed_replay/tf_example.proto', package=package, syntax='proto3'
  )

  def add_message(name, fields, parent=None):
    message = (parent.nested_type if parent else schema.message_type).add()
    message.name = name
    for number, (field_name, label, kind, type_name) in enumerate(fields, 1):
      added = message.field.add(
        name=field_name, number=number, label=label, type=kind
      )
      if type_name:
        added.type_name = f'.{package}.{type_name}'
    return message

  add_message('BytesList', [('value', repeated, field.TYPE_BYTES, None)])
  add_message('FloatList', [('value', repeated, field.TYPE_FLOAT, None)])
  add_message('Int64List', [('value', repeated, field.TYPE_INT64, None)])
  feature = add_message(
    'Feature',
    [
      ('bytes_list', optional, field.TYPE_MESSAGE, 'BytesList'),
      ('float_list', optional, field.TYPE_MESSAGE, 'FloatList'),
      ('int64_list', optional, field.TYPE_MESSAGE, 'Int64List'),
    ],
  )
  feature.oneof_decl.add(name='kind')
  for kind in feature.field:
    kind.oneof_index = 0
  features = add_message(
    'Features',
    [('feature', repeated, field.TYPE_MESSAGE, 'Features.FeatureEntry')],
  )
  entry = add_message(
    'FeatureEntry',
    [
      ('key', optional, field.TYPE_STRING, None),
      ('value', optional, field.TYPE_MESSAGE, 'Feature'),
    ],
    parent=features,
  )
  entry.options.map_entry = True
  add_message(
    'Example', [('features', optional, field.TYPE_MESSAGE, 'Features')]
  )
  return schema


_pool = descriptor_pool.DescriptorPool()
_pool.Add(_example_schema())
Example = message_factory.GetMessageClass(
  _pool.FindMessageTypeByName('fixed_replay.tf_example.Example')
)
