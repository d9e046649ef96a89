"""Misbehaving network servers on 127.0.0.1, for the remote-path tests.

TensorFlow's GCS client (libcurl) honours `https_proxy`, `CURL_CA_BUNDLE`
and `GCE_METADATA_HOST`; pointing them here sends every request of a gs://
path to these servers and nowhere else:

* `HttpsProxy('stall')` accepts connections and never answers;
* `HttpsProxy('refuse_connect')` answers the CONNECT with 403 (a proxy that
  refuses);
* `HttpsProxy('gcs_403')` accepts the CONNECT, plays the GCS endpoint with
  a self-signed certificate (trusted through CURL_CA_BUNDLE) and answers
  every request with GCS's 403 JSON error, as the closed public bucket does;
* `MetadataServer` answers the GCE metadata requests (credentials) with 404;
* `refused_port()` is a port nothing listens on;
* `UNRESOLVABLE_HOST` fails name resolution inside the C library, before any
  packet is sent (a 64-character label is not a valid DNS name).
"""

import contextlib
import os
import socket
import ssl
import subprocess
import threading

UNRESOLVABLE_HOST = 'a' * 64 + '.invalid'
_GCS_HOSTS = ('www.googleapis.com', 'storage.googleapis.com')
_FORBIDDEN_BODY = (
  b'{"error": {"code": 403, "message": "anonymous caller does not have '
  b'storage.objects.list access to the Google Cloud Storage bucket.", '
  b'"errors": [{"reason": "forbidden"}]}}'
)


def make_certificate(directory):
  """Writes a self-signed certificate for the GCS hosts; returns its paths.

  Returns:
    (certificate path, key path), or None when openssl is not installed.
  """
  certificate = os.path.join(directory, 'gcs.pem')
  key = os.path.join(directory, 'gcs.key')
  names = ','.join(f'DNS:{host}' for host in _GCS_HOSTS)
  try:
    subprocess.run(
      [
        'openssl',
        'req',
        '-x509',
        '-newkey',
        'rsa:2048',
        '-nodes',
        '-days',
        '1',
        '-subj',
        f'/CN={_GCS_HOSTS[0]}',
        '-addext',
        f'subjectAltName={names}',
        '-keyout',
        key,
        '-out',
        certificate,
      ],
      check=True,
      capture_output=True,
    )
  except (OSError, subprocess.CalledProcessError):
    return None
  return certificate, key


class _Server:
  """Accepts connections on 127.0.0.1 and handles each in a thread."""

  def __init__(self):
    self._socket = socket.create_server(('127.0.0.1', 0))
    self.port = self._socket.getsockname()[1]
    self._closed = threading.Event()
    self.requests = []
    self._connections = []
    threading.Thread(target=self._accept, daemon=True).start()

  @property
  def address(self):
    return f'127.0.0.1:{self.port}'

  def _accept(self):
    while not self._closed.is_set():
      try:
        connection, _ = self._socket.accept()
      except OSError:
        return
      self._connections.append(connection)
      threading.Thread(
        target=self._serve, args=(connection,), daemon=True
      ).start()

  def _serve(self, connection):
    raise NotImplementedError

  def close(self):
    self._closed.set()
    self._socket.close()
    for connection in self._connections:
      with contextlib.suppress(OSError):
        connection.close()


def _read_head(connection):
  """Reads an HTTP request head (up to the blank line)."""
  data = b''
  while b'\r\n\r\n' not in data:
    chunk = connection.recv(65536)
    if not chunk:
      break
    data += chunk
  return data


class MetadataServer(_Server):
  """A GCE metadata server that knows no credentials (404)."""

  def _serve(self, connection):
    with contextlib.suppress(OSError):
      self.requests.append(_read_head(connection))
      connection.sendall(
        b'HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n'
        b'Connection: close\r\n\r\n'
      )
      connection.close()


class HttpsProxy(_Server):
  """An https_proxy that stalls, refuses CONNECT, or answers GCS's 403."""

  def __init__(self, mode, certificate=None):
    self._mode = mode
    self._tls = None
    if mode == 'gcs_403':
      self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
      self._tls.load_cert_chain(*certificate)
    super().__init__()

  def _serve(self, connection):
    with contextlib.suppress(OSError, ssl.SSLError):
      head = _read_head(connection)
      self.requests.append(head)
      if self._mode == 'stall':
        self._closed.wait()
      elif self._mode == 'refuse_connect':
        connection.sendall(
          b'HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n'
          b'Connection: close\r\n\r\n'
        )
      elif self._mode == 'gcs_403':
        connection.sendall(b'HTTP/1.1 200 Connection established\r\n\r\n')
        tunnel = self._tls.wrap_socket(connection, server_side=True)
        self.requests.append(_read_head(tunnel))
        tunnel.sendall(
          b'HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\n'
          b'Content-Length: %d\r\nConnection: close\r\n\r\n'
          % len(_FORBIDDEN_BODY)
          + _FORBIDDEN_BODY
        )
        tunnel.close()
        return
      connection.close()


def refused_port():
  """A loopback port with nothing listening (connections are refused)."""
  with socket.create_server(('127.0.0.1', 0)) as probe:
    return probe.getsockname()[1]


def gcs_environment(proxy_host_port, metadata, certificate=None):
  """Environment variables sending TF's GCS traffic to loopback servers.

  Args:
    proxy_host_port: str, host:port of the https proxy.
    metadata: MetadataServer.
    certificate: optional (certificate, key) paths trusted by libcurl.

  Returns:
    dict of environment variables to add.
  """
  environment = {
    'https_proxy': f'http://{proxy_host_port}',
    'HTTPS_PROXY': f'http://{proxy_host_port}',
    'GCE_METADATA_HOST': metadata.address,
    'NO_PROXY': '',
    'no_proxy': '',
  }
  if certificate:
    environment['CURL_CA_BUNDLE'] = certificate[0]
  return environment
