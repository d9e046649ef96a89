"""gs:// paths fail within a bounded time and name the cause.

Every request goes to servers of our own on 127.0.0.1 (loopback_servers.py):
TensorFlow's GCS client is pointed at them through `https_proxy`,
`GCE_METADATA_HOST` and `CURL_CA_BUNDLE`; name resolution fails inside the C
library before any packet is sent. Nothing leaves the machine.
"""

import json
import os
import subprocess
import sys
import time

import loopback_servers
import pytest

from fixed_replay.errors import RemoteError
from fixed_replay.io import remote

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLOSED = 'gs://atari-replay-datasets/dqn/Pong/1/replay_logs'
OTHER = 'gs://some-private-bucket/run/replay_logs'

# Runs every tool on a gs:// path once per scenario (one process: TensorFlow
# reads its GCS settings once, libcurl reads the proxy at each request).
_CHILD = r"""
import json, os, sys, tempfile, time
import fixed_replay
from fixed_replay.sources.dopamine import checkpoints, inspection
from fixed_replay.io import remote
from fixed_replay.replay.fixed_replay_buffer import FixedReplayBuffer
from fixed_replay.convert import convert
import tensorflow  # Imported before any timing.

scenarios = json.loads(sys.argv[1])
results = {}
for name, (path, limit, environment) in scenarios.items():
  for variable in ('https_proxy', 'HTTPS_PROXY', 'CURL_CA_BUNDLE'):
    os.environ.pop(variable, None)
  os.environ.update(environment)
  remote.set_timeout(limit)
  tools = {
    'find_checkpoints': lambda: checkpoints.find_checkpoints(path),
    'FixedReplayBuffer': lambda: FixedReplayBuffer(path, None),
    'inspect': lambda: inspection.summarize_directory(path).all_problems[0],
    'convert': lambda: convert.convert(path, tempfile.mkdtemp()),
  }
  if name == 'stall':  # Each waits the whole limit: two are enough.
    tools = {t: tools[t] for t in ('FixedReplayBuffer', 'inspect')}
  results[name] = {}
  for tool, function in tools.items():
    began = time.monotonic()
    try:
      outcome = function()
      kind, message = type(outcome).__name__, str(outcome)
    except Exception as error:
      kind, message = type(error).__name__, str(error)
    results[name][tool] = (kind, message, time.monotonic() - began)
print('RESULTS', json.dumps(results))
"""


@pytest.fixture(scope='module')
def servers(tmp_path_factory):
  """The loopback servers and a self-signed certificate for the GCS hosts."""
  certificate = loopback_servers.make_certificate(
    str(tmp_path_factory.mktemp('tls'))
  )
  running = {
    'metadata': loopback_servers.MetadataServer(),
    'stall': loopback_servers.HttpsProxy('stall'),
    'refuse_connect': loopback_servers.HttpsProxy('refuse_connect'),
  }
  if certificate:
    running['gcs_403'] = loopback_servers.HttpsProxy('gcs_403', certificate)
  yield running, certificate
  for server in running.values():
    server.close()


def _environment(servers):
  """This process's environment, minus proxies, plus GCS on loopback."""
  running, _ = servers
  environment = {
    k: v
    for k, v in os.environ.items()
    if k.lower() not in ('http_proxy', 'https_proxy', 'all_proxy', 'no_proxy')
  }
  environment['GCE_METADATA_HOST'] = running['metadata'].address
  environment['PYTHONPATH'] = REPO
  # The defaults' retry path, taken once instead of three times and with
  # shorter pauses (each retry also waits up to 1 s of TensorFlow's random
  # jitter): a faster test.
  environment['GCS_RETRY_CONFIG_MAX_RETRIES'] = '1'
  environment['GCS_RETRY_CONFIG_INIT_DELAY_TIME_US'] = '100000'
  environment['GCS_RETRY_CONFIG_MAX_DELAY_TIME_US'] = '200000'
  environment['GCS_REQUEST_CONNECTION_TIMEOUT_SECS'] = '2'
  return environment


def _scenarios(servers):
  running, certificate = servers
  metadata = running['metadata']
  proxy = lambda address, cert=None: loopback_servers.gcs_environment(  # noqa: E731
    address, metadata, cert
  )
  scenarios = {
    # First: its abandoned calls end (TensorFlow's own time-outs) while the
    # others run, so the process need not wait for them at exit.
    'stall': (CLOSED, 3.5, proxy(running['stall'].address)),
    'name_resolution': (
      OTHER,
      20,
      proxy(loopback_servers.UNRESOLVABLE_HOST + ':3128'),
    ),
    'refused': (
      OTHER,
      20,
      proxy(f'127.0.0.1:{loopback_servers.refused_port()}'),
    ),
    'proxy_403': (OTHER, 20, proxy(running['refuse_connect'].address)),
  }
  if certificate:
    scenarios['bucket_403'] = (
      CLOSED,
      20,
      proxy(running['gcs_403'].address, certificate),
    )
  return scenarios


# scenario: words every tool's message must hold.
_EXPECTED = {
  'name_resolution': ('name resolution failed',),
  'refused': ('connection refused',),
  'proxy_403': ('access denied (HTTP 403)',),
  'stall': ('timed out: no answer within 3.5 s',),
  'bucket_403': ('access denied (HTTP 403)', 'closed', 'RL Unplugged'),
}


def test_every_tool_names_the_cause_in_bounded_time(servers):
  scenarios = _scenarios(servers)
  completed = subprocess.run(
    [sys.executable, '-c', _CHILD, json.dumps(scenarios)],
    env=_environment(servers),
    capture_output=True,
    text=True,
    timeout=300,
    cwd=REPO,
  )
  assert completed.returncode == 0, completed.stderr[-3000:]
  line = next(
    x for x in completed.stdout.splitlines() if x.startswith('RESULTS ')
  )
  results = json.loads(line[len('RESULTS ') :])
  for name, (path, limit, _) in scenarios.items():
    for tool, (kind, message, seconds) in results[name].items():
      where = f'{name} / {tool}: {kind} {message}'
      # inspect collects problems, the others raise.
      assert kind == ('Problem' if tool == 'inspect' else 'RemoteError'), where
      assert path in message, where
      assert 'does not exist' not in message, where
      for words in _EXPECTED[name]:
        assert words in message, where
      assert seconds < limit + 1.5, where
  # A wait of more than a few seconds says what it waits for.
  assert f'Still waiting for {CLOSED} (checking the directory)' in (
    completed.stderr
  )
  running, _ = servers
  assert running['stall'].requests, 'the stalled proxy was never asked'


def test_cli_names_the_closed_bucket(servers):
  running, certificate = servers
  if not certificate:
    pytest.skip('openssl is needed for the TLS endpoint')
  environment = _environment(servers)
  environment.update(
    loopback_servers.gcs_environment(
      running['gcs_403'].address, running['metadata'], certificate
    )
  )
  completed = subprocess.run(
    [sys.executable, '-m', 'fixed_replay.cli', 'inspect', CLOSED],
    env=environment,
    capture_output=True,
    text=True,
    timeout=300,
    cwd=REPO,
  )
  assert completed.returncode == 1
  assert 'access denied (HTTP 403)' in completed.stderr
  assert 'RL Unplugged' in completed.stderr
  assert 'does not exist' not in completed.stderr
  assert 'Traceback' not in completed.stderr


@pytest.mark.parametrize(
  'message, cause',
  [
    (
      "Error executing an HTTP request: libcurl code 6 meaning 'Could not "
      "resolve hostname', error details: Could not resolve proxy: x.invalid",
      'name resolution failed',
    ),
    (
      'All 3 retry attempts failed. The last failure: Error executing an '
      "HTTP request: libcurl code 7 meaning 'Couldn't connect to server'",
      'connection refused',
    ),
    (
      "Error executing an HTTP request: libcurl code 28 meaning 'Timeout was "
      "reached'",
      'timed out',
    ),
    (
      'Error executing an HTTP request: HTTP response code 403 with body '
      '\'{"error": {"code": 403}}\'',
      'access denied (HTTP 403)',
    ),
    (
      "libcurl code 56 meaning 'Failure when receiving data from the peer', "
      'error details: CONNECT tunnel failed, response 403',
      'access denied (HTTP 403)',
    ),
    ('something else entirely', None),
  ],
)
def test_causes_are_told_apart(message, cause):
  assert remote.classify(message) == cause


def test_time_limit_is_configurable_and_bounded(monkeypatch):
  assert remote.DEFAULT_TIMEOUT_S <= 30
  monkeypatch.delenv(remote.TIMEOUT_ENV, raising=False)
  assert remote.timeout() == remote.DEFAULT_TIMEOUT_S
  monkeypatch.setenv(remote.TIMEOUT_ENV, '7.5')
  assert remote.timeout() == 7.5
  remote.set_timeout(0.2)
  try:
    assert remote.timeout() == 0.2
    with pytest.raises(RemoteError, match=r'timed out: no answer within 0.2 s'):
      remote.call('waiting', 'gs://b/x', time.sleep, 0.5)
  finally:
    remote.set_timeout(None)
  with pytest.raises(ValueError, match='remote timeout'):
    remote.set_timeout(0)


def test_cli_exits_soon_after_a_timeout(servers):
  """A timed-out command says so after one limit and leaves at once.

  inspect makes several calls to the stalled bucket; only the first waits
  the limit, and the process does not wait for TensorFlow to give up.
  """
  running, _ = servers
  environment = _environment(servers)
  environment.update(
    loopback_servers.gcs_environment(
      running['stall'].address, running['metadata']
    )
  )
  process = subprocess.Popen(
    [
      sys.executable,
      '-m',
      'fixed_replay.cli',
      'inspect',
      OTHER,
      '--remote_timeout_s=4',
    ],
    env=environment,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    cwd=REPO,
  )
  waiting_at = error_at = None
  lines = []
  for line in process.stderr:  # Until the process closes stderr (exits).
    lines.append(line)
    if waiting_at is None and 'Still waiting for' in line:
      waiting_at = time.monotonic()  # 3 s into the first call.
    if error_at is None and 'timed out: no answer within 4 s' in line:
      error_at = time.monotonic()
  process.wait(timeout=300)
  exited_at = time.monotonic()
  stderr = ''.join(lines)
  assert waiting_at is not None and error_at is not None, stderr[-3000:]
  assert process.returncode != 0, stderr[-3000:]
  # One limit (4 s), not one per call: the first call's 1 s left, plus slack.
  assert error_at - waiting_at < 4, (error_at - waiting_at, stderr[-3000:])
  assert exited_at - error_at < 5, (exited_at - error_at, stderr[-3000:])


def test_a_remote_reader_closes_as_a_with_block_ends(tmp_path):
  """Six callers read `with storage.open_read(path)`: a gs:// path's
  reader (TensorFlow's gfile, here on a local file) is a context manager."""
  from fixed_replay.io import files

  path = tmp_path / 'data'
  path.write_bytes(b'0123456789')
  with files._RemoteReader(str(path)) as reader:  # noqa: SLF001
    assert reader.read(4) == b'0123'
    assert reader._file._read_buf is not None  # noqa: SLF001  (gfile's own)
  assert reader._file._read_buf is None  # noqa: SLF001  Closed: no buffer.
