"""Keeps third-party start-up noise out of the command-line tools' output.

One short `fixed-replay train` used to write some 75 lines to stderr before
its own: CUDA plugin registration and cuInit errors on CPU machines, absl's
"InitializeLog" banner, Gym's "unmaintained" notice, orbax's "Handler ...
already exists", distutils and TensorFlow deprecation warnings, Dopamine's
parameter dumps. They come from three places, each needing its own remedy:

* C++ code in TensorFlow and XLA writes straight to file descriptor 2,
  partly through absl's C++ logging, which ignores TF_CPP_MIN_LOG_LEVEL.
  Only a filter on the descriptor itself reaches those lines: `install()`
  points descriptor 2 at a pipe and a thread forwards every line to the
  real stderr except the known noise (`_NOISE`), so errors still show.
* Python logging records (absl, orbax, Dopamine, TensorFlow's
  deprecations) are kept when they come from fixed_replay, or are errors
  raised by anyone else.
* Python warnings of the deprecation kinds are not shown.

`fixed-replay --verbose COMMAND` (or `--verbose` anywhere after COMMAND),
or FIXED_REPLAY_VERBOSE=1, shows everything again; the flag sets the
variable, so the processes a command starts (Ray workers, converters) are
verbose too. `import fixed_replay`
only sets TF_CPP_MIN_LOG_LEVEL (`set_environment`); the filters are
installed by the command-line entry point, since a library must not take
over its host program's stderr.
"""

import atexit
import contextlib
import logging as std_logging
import os
import re
import select
import sys
import threading
import warnings

VERBOSE_ENV = 'FIXED_REPLAY_VERBOSE'
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# How long a line without its newline (a progress bar) is held back.
_PARTIAL_LINE_S = 0.05

# Lines written to descriptor 2 by C++ code or bare print() calls.
_NOISE = re.compile(
  rb'|'.join(
    (
      rb'Unable to register cu(DNN|FFT|BLAS) factory',
      rb'failed call to cuInit',
      rb'All log messages before absl::InitializeLog\(\) is called',
      rb'mlir_graph_optimization_pass\.cc',
      rb'oneDNN custom operations are on',
      rb'cpu_feature_guard\.cc',
      rb'This TensorFlow binary is optimized to use available CPU',
      rb'To enable the following instructions: .* rebuild TensorFlow',
      rb'computation placer already registered',
      # Gym 0.25's notice (gym_notices), printed on import, three lines.
      rb'^Gym has been unmaintained since 2022',
      rb'^Please upgrade to Gymnasium, the maintained drop-in',
      rb'^See the migration guide at https://gymnasium\.farama\.org',
    )
  )
)

_forwarder = None


def verbose() -> bool:
  """Whether the user asked for third-party output (FIXED_REPLAY_VERBOSE)."""
  return os.environ.get(VERBOSE_ENV, '').strip().lower() in (
    '1',
    'true',
    'yes',
  )


def set_verbose() -> None:
  """Asks for third-party output in this process and the ones it starts.

  Call before `install()` (and before TensorFlow is imported).
  """
  os.environ[VERBOSE_ENV] = '1'


def set_environment() -> None:
  """Quiets TensorFlow's C++ INFO and WARNING lines unless verbose.

  Has an effect only before TensorFlow is imported; a value the user set is
  kept.
  """
  if not verbose():
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')


_DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


def _quiet_showwarning(show):
  """Wraps warnings.showwarning to drop deprecation warnings."""

  def showwarning(message, category, *args, **kwargs):
    if not issubclass(category, _DEPRECATIONS):
      show(message, category, *args, **kwargs)

  showwarning.quiet = True
  return showwarning


class _ThirdPartyFilter(std_logging.Filter):
  """Passes fixed_replay's records, and errors from anyone."""

  def filter(self, record):
    if record.levelno >= std_logging.ERROR:
      # gin reports each place it looked for an include before finding it.
      return 'resource_reader.py' not in record.pathname
    return record.pathname.startswith(_PACKAGE_DIR)


class _Forwarder:
  """Forwards the lines written to descriptor 2, less the noise."""

  def __init__(self):
    sys.stderr.flush()
    self.real = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    self.read_end = read_end
    self.thread = threading.Thread(
      target=self._forward, name='fixed_replay_stderr', daemon=True
    )
    self.thread.start()

  def _write(self, data):
    while data:
      try:
        data = data[os.write(self.real, data) :]
      except InterruptedError:
        continue
      except OSError:
        return

  def _emit(self, lines):
    kept = [line for line in lines if not _NOISE.search(line)]
    if kept:
      self._write(b''.join(kept))

  def _forward(self):
    pending = b''
    while True:
      if pending:
        ready, _, _ = select.select([self.read_end], [], [], _PARTIAL_LINE_S)
        if not ready:  # A line without its end yet: a progress bar.
          self._write(pending)
          pending = b''
          continue
      try:
        chunk = os.read(self.read_end, 65536)
      except InterruptedError:
        continue
      except OSError:
        chunk = b''
      if not chunk:
        self._emit([pending])
        return
      lines = (pending + chunk).splitlines(keepends=True)
      pending = b'' if lines[-1].endswith((b'\n', b'\r')) else lines.pop()
      self._emit(lines)

  def stop(self, timeout=2.0):
    """Gives descriptor 2 back and forwards what is left in the pipe."""
    flush_streams()
    os.dup2(self.real, 2)  # Closes our write end of the pipe.
    # Child processes may hold the write end still; do not wait for them.
    self.thread.join(timeout)


def flush_streams() -> None:
  """Flushes stdout and stderr, whichever are still open."""
  for stream in (sys.stdout, sys.stderr):
    with contextlib.suppress(OSError, ValueError):
      stream.flush()


def install():
  """Filters third-party noise from this process's output unless verbose.

  Safe to call more than once.
  """
  global _forwarder
  set_environment()
  if verbose():
    return
  if not getattr(warnings.showwarning, 'quiet', False):
    # Not a filter: libraries insert their own filters ahead of ours.
    warnings.showwarning = _quiet_showwarning(warnings.showwarning)
  from absl import logging

  handlers = [logging.get_absl_handler()] + std_logging.getLogger().handlers
  for handler in handlers:
    if not any(isinstance(f, _ThirdPartyFilter) for f in handler.filters):
      handler.addFilter(_ThirdPartyFilter())
  if _forwarder is None:
    try:
      _forwarder = _Forwarder()
    except OSError:  # No descriptor 2 to filter (a closed stderr).
      return
    atexit.register(stop)


def stop():
  """Ends the descriptor filter, forwarding its last lines (before exit)."""
  global _forwarder
  if _forwarder is not None:
    forwarder, _forwarder = _forwarder, None
    forwarder.stop()
