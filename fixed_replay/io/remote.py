"""Remote storage calls with a time limit and an error that names the cause.

`tf.io.gfile` on its own retries a failing request for minutes, prints
nothing meanwhile, and some of its calls (`isdir`, `listdir`) turn a network
failure into "not a directory". Every remote call of this package therefore
runs here:

* in a daemon thread, waited for at most `timeout()` seconds (default 30,
  `set_timeout` or the environment variable FIXED_REPLAY_REMOTE_TIMEOUT_S);
  a call still running after a few seconds logs what it waits for;
* a failure becomes a `RemoteError` saying which of name resolution, a
  timeout, a refused connection or an HTTP 403 it was (the closed public
  bucket of the DQN Replay Dataset gets a pointer to RL Unplugged); only a
  genuine "not found" answer becomes FileNotFoundError.

A call that times out is abandoned, not stopped: TensorFlow gives no way to
cancel it. While it runs, later calls to the same bucket fail at once with
the same cause rather than each waiting the whole limit again (a command
that makes three calls would otherwise take three times the limit to say
what is wrong). Its daemon thread ends with TensorFlow's own limits, which
`set_tensorflow_defaults` lowers (when the user has not set them) so that a
failure's real cause usually arrives within our limit. A process must not
exit while such a call runs (TensorFlow's C++ teardown then aborts it): at
exit we wait for abandoned calls to end, for at most EXIT_WAIT_S, and the
command-line tools leave at once through `exit_now`.
"""

import atexit
from collections.abc import Callable
import os
import re
import sys
import threading
import time
from typing import Any

from absl import logging

from fixed_replay.errors import RemoteError

DEFAULT_TIMEOUT_S = 30.0
TIMEOUT_ENV = 'FIXED_REPLAY_REMOTE_TIMEOUT_S'
_FIRST_LOG_S = 3.0
_LOG_EVERY_S = 10.0
CLOSED_BUCKET = 'atari-replay-datasets'
_CLOSED_BUCKET_HINT = (
  'the public DQN Replay Dataset bucket gs://atari-replay-datasets is '
  'closed (HTTP 403/404 since 2025): use the same data from RL Unplugged '
  '(TFDS dataset rlu_atari_checkpoints_ordered, gs://rl_unplugged/atari)'
)

# TensorFlow's GCS client reads these once, when TensorFlow is imported; its
# own defaults (10 retries up to 32 s apart, 120 s to connect) hide a
# failure's cause for minutes. Set only where the user has not.
TENSORFLOW_GCS_DEFAULTS = {
  'GCS_RETRY_CONFIG_MAX_RETRIES': '3',
  'GCS_RETRY_CONFIG_INIT_DELAY_TIME_US': '1000000',
  'GCS_RETRY_CONFIG_MAX_DELAY_TIME_US': '4000000',
  'GCS_REQUEST_CONNECTION_TIMEOUT_SECS': '10',
  'GCS_REQUEST_IDLE_TIMEOUT_SECS': '20',
  'GCS_METADATA_REQUEST_TIMEOUT_SECS': '20',
}

EXIT_WAIT_S = 60.0

_timeout_s = None  # None: the environment variable, else the default.
_abandoned = []  # Calls that timed out and may still be running.
_abandoned_lock = threading.Lock()


def set_tensorflow_defaults() -> None:
  """Sets TensorFlow's GCS retry and timeout settings the user left unset.

  Has an effect only before TensorFlow is imported (fixed_replay's import
  calls it).
  """
  if 'tensorflow' in sys.modules:
    return
  for name, value in TENSORFLOW_GCS_DEFAULTS.items():
    os.environ.setdefault(name, value)


def set_timeout(seconds: float | None) -> None:
  """Sets the longest wait for one remote call, in seconds (None: default).

  Raises:
    ValueError: unless seconds is None or positive.
  """
  global _timeout_s
  if seconds is not None and not seconds > 0:
    raise ValueError(f'remote timeout must be > 0 seconds, got {seconds}')
  _timeout_s = None if seconds is None else float(seconds)


def timeout() -> float:
  """The longest wait for one remote call, in seconds."""
  if _timeout_s is not None:
    return _timeout_s
  value = os.environ.get(TIMEOUT_ENV)
  if value:
    try:
      seconds = float(value)
    except ValueError:
      seconds = 0.0
    if seconds > 0:
      return seconds
    logging.warning('Ignoring %s=%r: not a positive number', TIMEOUT_ENV, value)
  return DEFAULT_TIMEOUT_S


# (cause, pattern of TensorFlow's / libcurl's message), first match wins.
_CAUSES = (
  (
    'name resolution failed',
    re.compile(
      r'libcurl code [56]\b|resolve (host|proxy)|name or service', re.I
    ),
  ),
  (
    'connection refused',
    re.compile(
      r"libcurl code 7\b|connection refused|couldn't connect|failed to connect",
      re.I,
    ),
  ),
  (
    'timed out',
    re.compile(r'libcurl code 28\b|timed? ?out|timeout was reached', re.I),
  ),
  (
    'access denied (HTTP 403)',
    re.compile(r'\b403\b|forbidden|permission[ _]denied', re.I),
  ),
  ('not authorized (HTTP 401)', re.compile(r'\b401\b|unauthorized', re.I)),
)


def classify(message: str) -> str:
  """Returns the cause named in a TensorFlow / libcurl error message."""
  return next((cause for cause, rule in _CAUSES if rule.search(message)), None)


def remote_error(path: str, what: str, error: BaseException) -> RemoteError:
  """Builds the RemoteError for a failed call, naming its cause."""
  message = str(getattr(error, 'message', None) or error)
  cause = classify(message) or 'network or storage error'
  problem = f'{cause} while {what}: {" ".join(message.split())[:400]}'
  if cause.startswith(('access denied', 'not authorized')):
    problem += closed_bucket_hint(path)
  return RemoteError(str(path), problem)


def closed_bucket_hint(path: str) -> str:
  """For a path in the closed public bucket, a note saying where to go."""
  closed = f'{path}/'.startswith(f'gs://{CLOSED_BUCKET}/')
  return f'. Note: {_CLOSED_BUCKET_HINT}' if closed else ''


def _is_not_found(error):
  try:
    import tensorflow as tf
  except ImportError:  # pragma: no cover - tf.io.gfile needs TensorFlow.
    return False
  return isinstance(error, tf.errors.NotFoundError)


class _Call:
  """One call running in its own daemon thread."""

  def __init__(self, function, args) -> None:
    self.done = threading.Event()
    self.limit = None  # Set when abandoned: the limit it ran past,
    self.where = None  # and the storage it waits for (_storage).
    self.result = None
    self.error = None
    threading.Thread(
      target=self._run,
      args=(function, args),
      name='fixed_replay_remote',
      daemon=True,  # A call stuck in the network must not block exit.
    ).start()

  def _run(self, function, args) -> None:
    try:
      self.result = function(*args)
    except BaseException as error:  # noqa: BLE001 - handed to the caller.
      self.error = error
    finally:
      self.done.set()


def call(what: str, path: str, function: Callable[..., Any], *args: Any) -> Any:
  """Runs function(*args), a remote storage call, within the time limit.

  Args:
    what: str, what the call does, for messages ('listing the directory').
    path: str, the remote path.
    function: callable doing the call (e.g. a tf.io.gfile function).
    *args: its arguments.

  Returns:
    What function returns.

  Raises:
    FileNotFoundError: when the storage answered that the path is absent.
    RemoteError: on a timeout or any other failure, naming the cause.
  """
  limit = timeout()
  where = _storage(path)
  stuck = next((c for c in _still_running() if c.where == where), None)
  if stuck is not None:
    # The same storage has not answered an earlier call: waiting the whole
    # limit again for each later one would multiply the user's wait.
    raise RemoteError(
      str(path),
      f'timed out: no answer within {stuck.limit:g} s to an earlier call '
      f'to {stuck.where} (still unanswered), so not {what} (is the network '
      f'down?). Raise the limit with {TIMEOUT_ENV} or --remote_timeout_s.',
    )
  began = time.monotonic()
  running = _Call(function, args)
  next_log = _FIRST_LOG_S
  while not running.done.wait(
    min(next_log, limit) - (time.monotonic() - began)
  ):
    waited = time.monotonic() - began
    if waited >= limit:
      running.limit = limit
      running.where = where
      _abandon(running)
      raise RemoteError(
        str(path),
        f'timed out: no answer within {limit:g} s while {what} (is the '
        f'network down?). Raise the limit with {TIMEOUT_ENV} or '
        '--remote_timeout_s.',
      )
    logging.warning(
      'Still waiting for %s (%s) after %.0f s (limit %g s)',
      path,
      what,
      waited,
      limit,
    )
    next_log += _LOG_EVERY_S
  if running.error is None:
    return running.result
  error = running.error
  if isinstance(error, FileNotFoundError) or _is_not_found(error):
    raise FileNotFoundError(str(path)) from error
  raise remote_error(path, what, error) from error


def _abandon(running) -> None:
  with _abandoned_lock:
    if not _abandoned:
      atexit.register(_wait_for_abandoned)
    _abandoned.append(running)


def _storage(path):
  """What a call talks to: 'gs://bucket' (or the path's scheme and host)."""
  match = re.match(r'^([a-z0-9]+://[^/]*)', str(path))
  return match.group(1) if match else str(path)


def _still_running():
  with _abandoned_lock:
    _abandoned[:] = [c for c in _abandoned if not c.done.is_set()]
    return list(_abandoned)


def _wait_for_abandoned() -> None:
  """At exit: lets abandoned calls end before TensorFlow is torn down."""
  running = _still_running()
  if not running:
    return
  logging.warning(
    'Waiting up to %.0f s for %d unanswered remote call(s) to give up '
    'before exiting',
    EXIT_WAIT_S,
    len(running),
  )
  deadline = time.monotonic() + EXIT_WAIT_S
  for running_call in running:
    running_call.done.wait(max(deadline - time.monotonic(), 0))
  exit_now(1)  # Exiting normally now would abort in TensorFlow's teardown.


def hanging() -> bool:
  """Whether a remote call that timed out is still running."""
  return bool(_still_running())


def exit_now(code: int) -> None:
  """For command-line tools: exits at once with `code` if calls are stuck.

  Otherwise returns, and the caller exits as usual.
  """
  if _still_running():
    # Before os._exit: writes out what the streams (and quiet's filter) hold.
    from fixed_replay import quiet

    quiet.flush_streams()
    quiet.stop()
    os._exit(code)
