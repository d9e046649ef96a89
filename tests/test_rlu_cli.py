"""`fixed-replay convert` and `inspect` of RL Unplugged data, new processes."""

import json
import os
import signal
import subprocess
import sys
import time

from dopamine_data import file_digests

from fixed_replay.convert import dopamine_output
from fixed_replay.convert import rlu_convert
from fixed_replay.convert.convert_options import ConvertOptions
from fixed_replay.store import manifest as manifest_lib


def _cli(*args, **kwargs):
  return subprocess.run(
    [sys.executable, '-m', 'fixed_replay.cli', *map(str, args)],
    capture_output=True,
    text=True,
    **kwargs,
  )


def test_several_runs_need_run(rlu_dir, tmp_path):
  completed = _cli('convert', rlu_dir[0], tmp_path / 'store')
  assert completed.returncode == 1
  assert 'holds shards of runs [1, 2]: choose one with --run' in (
    completed.stderr
  )
  assert '--run=all' in completed.stderr
  assert not (tmp_path / 'store').exists()


def test_run_all_converts_each_run_as_alone(rlu_dir, tmp_path):
  """--run=all: DST/run_<r>/ of each run, the bytes of --run=r alone."""
  directory, _ = rlu_dir
  completed = _cli('convert', directory, tmp_path / 'all', '--run=all')
  assert completed.returncode == 0, completed.stderr[-3000:]
  assert sorted(os.listdir(tmp_path / 'all')) == ['run_1', 'run_2']
  assert completed.stdout.count('compact output') == 2
  for run in (1, 2):
    alone = tmp_path / f'alone_{run}'
    rlu_convert.convert_rlu(directory, alone, run=run, workers=0)
    assert file_digests(tmp_path / 'all' / f'run_{run}') == file_digests(alone)


def test_killed_dopamine_conversion_resumes_identical(rlu_dir, tmp_path):
  """Killed after its first checkpoint; the rerun ends byte-identical."""
  directory, _ = rlu_dir
  options = ConvertOptions(output_format='dopamine')
  reference = tmp_path / 'reference'
  rlu_convert.convert_rlu(
    directory, reference, run=2, options=options, workers=0
  )
  store = tmp_path / 'store'
  process = subprocess.Popen(
    [
      sys.executable,
      '-m',
      'fixed_replay.cli',
      'convert',
      str(directory),
      str(store),
      '--run=2',
      '--format=dopamine',
      '--workers=0',
    ],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  meta = store / dopamine_output.META_DIR
  deadline = time.time() + 180
  while time.time() < deadline:
    if meta.exists() and any(n.endswith('.json') for n in os.listdir(meta)):
      break
    time.sleep(0.002)
  os.kill(process.pid, signal.SIGKILL)
  process.wait()
  done = [n for n in os.listdir(meta) if n.endswith('.json')]
  assert 1 <= len(done) < 3, done

  completed = _cli(
    'convert', directory, store, '--run=2', '--format=dopamine', '--workers=0'
  )
  assert completed.returncode == 0, completed.stderr[-3000:]
  assert 'dopamine output' in completed.stdout
  assert file_digests(store) == file_digests(reference)


def test_inspect_shards_verify(rlu_dir):
  completed = _cli('inspect', rlu_dir[0], '--run=2', '--verify', '--json')
  assert completed.returncode == 0, completed.stderr[-3000:]
  summary = json.loads(completed.stdout)
  assert summary['ok'] and summary['verified']
  _, episodes = rlu_dir
  assert [c['episodes'] for c in summary['checkpoints']] == [
    len(episodes[2, c]) for c in range(3)
  ]
  assert summary['checkpoints'][1]['parts'] == [
    'run_2-00000-of-00003',
    'run_2-00001-of-00003',
  ]


def test_inspect_store_finds_a_damaged_block(rlu_dir, tmp_path):
  store = tmp_path / 'store'
  rlu_convert.convert_rlu(rlu_dir[0], store, run=1, workers=0)
  completed = _cli('inspect', store)
  assert completed.returncode == 0, completed.stderr[-3000:]
  assert '3/3 complete' in completed.stdout
  blocks = store / 'checkpoint_1' / manifest_lib.UNITS_FILE
  data = bytearray(blocks.read_bytes())
  data[len(data) // 2] ^= 0x40
  blocks.write_bytes(bytes(data))
  completed = _cli('inspect', store, '--verify')
  assert completed.returncode == 1
  assert 'checkpoint_1/observation.units: damaged' in completed.stderr
