"""The streaming reader equals np.load on real gzip .npy files."""

import gzip
import os
import struct

import numpy as np
import pytest

from fixed_replay.errors import CheckpointError
from fixed_replay.io import gzip_stream
from fixed_replay.io import npy_stream


def _write(path, array, compresslevel=6):
  with gzip.open(path, 'wb', compresslevel=compresslevel) as f:
    np.save(f, array, allow_pickle=False)
  return str(path)


@pytest.fixture(name='frames_file')
def _frames_file(tmp_path):
  rng = np.random.default_rng(0)
  # Mostly-constant frames compress like Atari screens; noise keeps rows apart.
  frames = np.zeros((3000, 84, 84), np.uint8)
  frames[:, 10:20, :] = rng.integers(0, 255, (3000, 10, 84), dtype=np.uint8)
  return _write(tmp_path / 'frames.gz', frames), frames


@pytest.mark.parametrize('backend', sorted(gzip_stream.BACKENDS))
def test_random_windows_equal_np_load(frames_file, backend, monkeypatch):
  path, frames = frames_file
  monkeypatch.setattr(gzip_stream, 'DEFAULT_BACKEND', backend)
  rng = np.random.default_rng(1)
  windows = [(0, 1), (0, 3000), (2999, 1), (2950, 50), (0, 0)]
  windows += [
    (int(s), int(rng.integers(0, 3000 - s))) for s in rng.integers(0, 3000, 6)
  ]
  for start, count in windows:
    got = npy_stream.read_rows(path, start, count)
    np.testing.assert_array_equal(got, frames[start : start + count])
    assert got.dtype == frames.dtype


def test_small_output_chunks_do_not_change_result(frames_file, monkeypatch):
  path, frames = frames_file
  monkeypatch.setattr(gzip_stream, 'READ_CHUNK_BYTES', 4099)
  monkeypatch.setattr(gzip_stream, 'SKIP_CHUNK_BYTES', 3001)
  monkeypatch.setattr(gzip_stream, 'INPUT_CHUNK_BYTES', 517)
  np.testing.assert_array_equal(
    npy_stream.read_rows(path, 1234, 77), frames[1234:1311]
  )


@pytest.mark.parametrize(
  'array',
  [
    np.array(12345, dtype=np.int64),
    np.arange(7, dtype=np.int64),
    np.linspace(-1, 1, 11, dtype=np.float32),
    np.random.default_rng(0).random((5, 4, 1)),
  ],
)
def test_dtypes_and_shapes(tmp_path, array):
  path = _write(tmp_path / 'a.gz', array)
  got = npy_stream.read_rows(path)
  np.testing.assert_array_equal(got, np.load(gzip.open(path)))
  assert got.shape == array.shape and got.dtype == array.dtype
  assert npy_stream.verify(path).shape == array.shape


def test_multi_member_gzip_reads_as_one_stream(tmp_path):
  array = np.arange(1000, dtype=np.int32)
  path = _write(tmp_path / 'a.gz', array)
  payload = gzip.decompress(open(path, 'rb').read())
  half = len(payload) // 2
  with open(path, 'wb') as f:
    f.write(gzip.compress(payload[:half]) + gzip.compress(payload[half:]))
  np.testing.assert_array_equal(
    npy_stream.read_rows(path, 900, 100), array[900:]
  )
  npy_stream.verify(path)


def test_truncated_file_names_file(frames_file, tmp_path):
  path, _ = frames_file
  data = open(path, 'rb').read()
  short = tmp_path / 'short.gz'
  short.write_bytes(data[: len(data) // 2])
  with pytest.raises(CheckpointError, match='short.gz: truncated'):
    npy_stream.read_rows(str(short))
  with pytest.raises(CheckpointError, match='truncated'):
    npy_stream.verify(str(short))


def test_corrupt_bytes_are_detected(frames_file, tmp_path):
  path, _ = frames_file
  data = bytearray(open(path, 'rb').read())
  for position in range(len(data) // 2, len(data) // 2 + 64):
    data[position] ^= 0x5A
  bad = tmp_path / 'bad.gz'
  bad.write_bytes(bytes(data))
  with pytest.raises(CheckpointError, match='bad.gz'):
    npy_stream.verify(str(bad))


def test_not_gzip_and_missing_file(tmp_path):
  plain = tmp_path / 'plain.gz'
  np.save(open(plain, 'wb'), np.arange(3))
  with pytest.raises(CheckpointError, match='plain.gz: corrupt gzip'):
    npy_stream.read_rows(str(plain))
  with pytest.raises(CheckpointError, match='nothere.gz: cannot open'):
    npy_stream.read_rows(str(tmp_path / 'nothere.gz'))


def _npy_with_header(header_text, payload=b''):
  header = header_text.encode('latin1')
  return (
    b'\x93NUMPY\x01\x00' + struct.pack('<H', len(header)) + header + payload
  )


@pytest.mark.parametrize(
  'content, problem',
  [
    (b'hello world, no npy', 'bad magic'),
    (_npy_with_header("{'descr': '<u1', 'fortran_order': False, "), 'bad .npy'),
    (
      _npy_with_header(
        "{'descr': '|O', 'fortran_order': False, 'shape': (3,)}"
      ),
      'object arrays',
    ),
    (
      _npy_with_header(
        "{'descr': '<u1', 'fortran_order': True, " "'shape': (3, 2)}"
      ),
      'Fortran',
    ),
    (
      _npy_with_header(
        "{'descr': '<u1', 'fortran_order': False, " "'shape': (30,)}", b'x' * 10
      ),
      'header promises 30',
    ),
  ],
)
def test_bad_npy_content(tmp_path, content, problem):
  path = tmp_path / 'broken.gz'
  path.write_bytes(gzip.compress(content))
  with pytest.raises(CheckpointError, match=f'broken.gz: .*{problem}'):
    npy_stream.verify(str(path))


def test_verify_rejects_extra_payload(tmp_path):
  path = tmp_path / 'long.gz'
  payload = gzip.decompress(
    open(_write(tmp_path / 'ok.gz', np.arange(10)), 'rb').read()
  )
  path.write_bytes(gzip.compress(payload + b'\x00' * 8))
  with pytest.raises(CheckpointError, match='header promises'):
    npy_stream.verify(str(path))


def test_expected_dtype_and_row_shape(frames_file):
  path, _ = frames_file
  with pytest.raises(CheckpointError, match='dtype is uint8, expected float32'):
    npy_stream.read_rows(path, dtype=np.float32)
  with pytest.raises(CheckpointError, match=r'shape \(84, 84\), expected'):
    npy_stream.read_rows(path, row_shape=(96, 96))
  with pytest.raises(CheckpointError, match=r'rows \[2990, 3010\)'):
    npy_stream.read_rows(path, 2990, 20)


def test_reader_stops_early(frames_file):
  """Reading the first rows must not decompress the whole file."""
  path, _ = frames_file
  with gzip_stream.GzipStream(path) as stream:
    header = npy_stream.read_header(stream)
    stream.skip(10 * header.row_bytes)
    assert stream.position < header.nbytes / 10
  assert os.path.getsize(path) > 0
