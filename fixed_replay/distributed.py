"""Ray for fixed_replay: a private local cluster or a remote one, and tasks.

`fixed-replay sweep` and `convert --ray` share this module, the only one
that imports Ray, and only once `cluster()` is entered: `import
fixed_replay` and every other command stay free of it.

* `cluster()` starts a Ray for this process alone, on 127.0.0.1 (no
  dashboard, a small object store, Ray's logs out of the terminal), or joins
  a running cluster (`ray start --head` prints its address).
* `run_tasks()` keeps no more Tasks in flight than the cluster can run at
  once (so "running" means running), each attempt in a fresh worker by
  default, retries failures, logs them, and shows one TaskBoard.
"""

import collections
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
import contextlib
import dataclasses
import functools
import logging as std_logging
import os
import time
from typing import Any

from absl import logging

from fixed_replay import compat
from fixed_replay import progress

LOCALHOST = '127.0.0.1'
# Tasks exchange small results only; Ray's minimum is 75 MiB.
LOCAL_OBJECT_STORE_BYTES = 100 * 2**20
# Ray picks the machine's routable address for a local cluster unless its
# clusters are disabled, which makes every server listen on 127.0.0.1 only.
# Read when `ray` is first imported.
_LOCAL_ONLY_ENV = 'RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER'


def _import_ray():
  return compat.require(
    'ray', purpose='Ray clusters (sweeps, conversions)', extra='ray'
  )


@contextlib.contextmanager
def _loopback_only():
  """Keeps Ray's servers on 127.0.0.1 while a local cluster runs.

  Yields:
    The ray module.
  """
  saved = os.environ.get(_LOCAL_ONLY_ENV)
  os.environ[_LOCAL_ONLY_ENV] = '0'
  ray = _import_ray()
  from ray._private import ray_constants

  # An earlier import in this process (a test, a notebook) read the setting
  # already; the flag is looked up at call time, so it is set here as well.
  ray_constants.ENABLE_RAY_CLUSTER = False
  try:
    yield ray
  finally:
    if saved is None:
      os.environ.pop(_LOCAL_ONLY_ENV, None)
    else:
      os.environ[_LOCAL_ONLY_ENV] = saved
    enabled = saved is None or saved.lower() in ('1', 'true')
    ray_constants.ENABLE_RAY_CLUSTER = enabled


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
  """What `cluster()` connected to.

  Attributes:
    address: str, the GCS address (host:port).
    local: bool, True for the private local cluster.
    num_cpus: float, CPUs of the whole cluster.
    num_gpus: float, GPUs of the whole cluster.
    num_nodes: int.
    session_dir: str, Ray's session directory on this machine (its logs).
  """

  address: str
  local: bool
  num_cpus: float
  num_gpus: float
  num_nodes: int
  session_dir: str


@contextlib.contextmanager
def cluster(
  address: str | None = None,
  num_cpus: int | None = None,
  num_gpus: float | None = None,
) -> Iterator['ClusterInfo']:
  """Starts a local Ray or connects to a cluster; shuts it down on exit.

  Args:
    address: str or None. None or '' starts a private local cluster on
      127.0.0.1; 'auto' connects to the cluster `ray start` runs on this
      machine; 'HOST:PORT' to a cluster's head node; 'ray://HOST:PORT'
      through Ray Client.
    num_cpus: int or None, CPUs of the local cluster (all by default).
    num_gpus: int or None, GPUs of the local cluster (all by default).

  Yields:
    ClusterInfo.

  Raises:
    RuntimeError: if Ray is already initialised in this process, or the
      local cluster is not on 127.0.0.1.
  """
  local = not address
  with contextlib.ExitStack() as stack:
    ray = stack.enter_context(_loopback_only()) if local else _import_ray()
    if ray.is_initialized():
      raise RuntimeError('Ray is already initialised in this process')
    if local:
      context = ray.init(
        address='local',
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        include_dashboard=False,
        object_store_memory=LOCAL_OBJECT_STORE_BYTES,
        log_to_driver=False,
        # Only errors: its notices (e.g. that the cluster uses a token,
        # which it does) mean nothing to someone running a sweep.
        logging_level=std_logging.ERROR,
        _node_ip_address=LOCALHOST,
      )
    else:
      context = ray.init(
        address=address, log_to_driver=False, logging_level=std_logging.WARNING
      )
    stack.callback(ray.shutdown)
    resources, addresses = ray.cluster_resources(), context.address_info
    info = ClusterInfo(
      address=addresses.get('gcs_address') or addresses.get('address', ''),
      local=local,
      num_cpus=resources.get('CPU', 0.0),
      num_gpus=resources.get('GPU', 0.0),
      num_nodes=len([n for n in ray.nodes() if n.get('Alive')]),
      session_dir=addresses.get('session_dir', ''),
    )
    if local and context.address_info['node_ip_address'] != LOCALHOST:
      raise RuntimeError(
        'the local Ray cluster is not bound to 127.0.0.1 but to '
        f'{context.address_info["node_ip_address"]}'
      )
    logging.info(
      'Ray: %s %s, %g CPUs and %g GPUs on %d node(s); Ray logs in %s',
      'started a local cluster on' if local else 'connected to',
      info.address,
      info.num_cpus,
      info.num_gpus,
      info.num_nodes,
      info.session_dir,
    )
    yield info


@dataclasses.dataclass(frozen=True)
class Task:
  """One unit of work for `run_tasks`.

  Attributes:
    key: str, unique within a job; names the task in logs and results.
    fn: a function Ray can pickle; a module-level one is sent by reference,
      so its module must be importable on every node.
    args: tuple of picklable arguments.
    num_cpus: float, CPUs reserved while it runs.
    num_gpus: float, GPUs reserved while it runs (fractions share a GPU).
  """

  key: str
  fn: Any
  args: tuple = ()
  num_cpus: float = 1.0
  num_gpus: float = 0.0


@dataclasses.dataclass
class Outcome:
  """What `run_tasks` did.

  Attributes:
    results: dict, key -> return value, for tasks that succeeded.
    failures: dict, key -> list of error texts (one per attempt), for tasks
      that failed every attempt.
    retried: dict, key -> error texts of failed attempts of tasks that
      succeeded later.
    seconds: dict, key -> wall seconds of the successful attempt, from its
      submission to its result.
    causes: dict, key -> the last failed attempt's exception (the task's own
      where it raised one), for tasks with a failed attempt.
  """

  results: dict = dataclasses.field(default_factory=dict)
  failures: dict = dataclasses.field(default_factory=dict)
  retried: dict = dataclasses.field(default_factory=dict)
  seconds: dict = dataclasses.field(default_factory=dict)
  causes: dict = dataclasses.field(default_factory=dict)


def _call(fn, args):
  """Runs inside a Ray worker, a process of ours (see heavy_imports.py)."""
  from fixed_replay import heavy_imports

  heavy_imports.install()
  return fn(*args)


@functools.cache
def _remote_call(ray, fresh_process):
  """The remote form of _call; max_calls=1 ends the worker after one task."""
  return ray.remote(max_calls=1 if fresh_process else 0, max_retries=0)(_call)


def describe_error(error: BaseException) -> str:
  """One line naming a failed attempt's error (its cause for task errors)."""
  cause = getattr(error, 'cause', None) or error
  text = str(cause).strip().splitlines()
  return f'{type(cause).__name__}: {text[-1] if text else ""}'.strip()


def _needs(tasks):
  """The most CPUs and GPUs one of `tasks` reserves, by Ray resource name."""
  return {
    'CPU': max(t.num_cpus for t in tasks),
    'GPU': max(t.num_gpus for t in tasks),
  }


def _slots(ray, tasks):
  """How many of `tasks` the cluster can run at once (at least 1)."""
  resources = ray.cluster_resources()
  limits = [
    int(resources.get(name, 0.0) / need + 1e-9)
    for name, need in _needs(tasks).items()
    if need > 0
  ]
  return max(1, min(limits)) if limits else len(tasks)


def check_feasible(info: 'ClusterInfo', tasks: Sequence['Task']) -> None:
  """Raises ValueError if no node of the cluster can hold a task's resources.

  Ray would otherwise keep such a task pending forever.
  """
  import ray

  need = _needs(tasks)
  nodes = [n.get('Resources', {}) for n in ray.nodes() if n.get('Alive')]
  if any(all(r.get(k, 0.0) >= v for k, v in need.items()) for r in nodes):
    return
  largest = ', '.join(
    f'{r.get("CPU", 0.0):g} CPUs and {r.get("GPU", 0.0):g} GPUs' for r in nodes
  )
  raise ValueError(
    f'each task needs {need["CPU"]:g} CPUs and {need["GPU"]:g} GPUs but no '
    f'node of the Ray cluster at {info.address} has that many (nodes: '
    f'{largest}); lower --cpus_per_trial / --gpus_per_trial or add nodes'
  )


def run_tasks(
  tasks: Sequence['Task'],
  max_attempts: int = 3,
  fresh_process: bool = True,
  desc: str = 'tasks',
  unit: str = 'task',
  already_done: int = 0,
  progress_of: Callable[..., Any] | None = None,
  on_failed_attempt: Callable[..., Any] | None = None,
  poll_seconds: float = 5.0,
) -> 'Outcome':
  """Runs tasks on the connected Ray cluster until each succeeds or gives up.

  Args:
    tasks: list of Task, with distinct keys.
    max_attempts: int, attempts per task before it counts as failed.
    fresh_process: bool, run every attempt in a new worker process (no
      state left over from another task: TensorFlow graphs, gin bindings).
    desc: str, the job's name in progress lines.
    unit: str, what a task is, e.g. 'trial'.
    already_done: int, tasks of the job finished before (shown as done).
    progress_of: callable(Task) -> float in [0, 1] or None, the share of
      a task's work done; polled for tasks in flight, for the ETA.
    on_failed_attempt: callable(Task, attempt, error_text, will_retry) or
      None, called after each failed attempt.
    poll_seconds: float, how often progress is refreshed.

  Returns:
    Outcome.
  """
  import ray

  if len({task.key for task in tasks}) != len(tasks):
    raise ValueError('task keys must be distinct')
  outcome = Outcome()
  if not tasks:
    return outcome
  remote = _remote_call(ray, fresh_process)
  total = len(tasks) + already_done
  board = progress.TaskBoard(total, desc, unit=unit)
  queue = collections.deque((task, 1) for task in tasks)
  in_flight = {}  # ObjectRef -> (task, attempt, submitted)
  fractions = {task.key: 0.0 for task in tasks}
  errors = collections.defaultdict(list)  # key -> texts of failed attempts
  if progress_of:
    # Work an earlier invocation did (a resumed task) counts as done.
    _poll(progress_of, tasks, fractions)
  last_poll = time.monotonic()
  try:
    while queue or in_flight:
      while queue and len(in_flight) < _slots(ray, tasks):
        task, attempt = queue.popleft()
        ref = remote.options(
          num_cpus=task.num_cpus, num_gpus=task.num_gpus, name=task.key
        ).remote(task.fn, task.args)
        in_flight[ref] = (task, attempt, time.monotonic())
        logging.info('%s: started %s (attempt %d)', desc, task.key, attempt)
      ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=poll_seconds)
      for ref in ready:
        task, attempt, submitted = in_flight.pop(ref)
        if _finish(ray, ref, task, attempt, submitted, outcome, errors):
          fractions[task.key] = 1.0
          continue
        will_retry = attempt < max_attempts
        summary = errors[task.key][-1].splitlines()[0]
        verdict = 'retrying' if will_retry else 'giving up'
        logging.warning(
          '%s: %s failed (attempt %d of %d): %s; %s',
          *(desc, task.key, attempt, max_attempts, summary, verdict),
        )
        if on_failed_attempt:
          on_failed_attempt(task, attempt, errors[task.key][-1], will_retry)
        if will_retry:
          queue.appendleft((task, attempt + 1))
        else:
          outcome.failures[task.key] = errors[task.key]
          fractions[task.key] = 1.0
      if progress_of and time.monotonic() - last_poll >= poll_seconds:
        last_poll = time.monotonic()
        _poll(
          progress_of, [task for task, _, _ in in_flight.values()], fractions
        )
      board.update(
        done=already_done + len(outcome.results),
        running=len(in_flight),
        failed=len(outcome.failures),
        fraction=(already_done + sum(fractions.values())) / total,
        retrying=sum(1 for _, attempt, _ in in_flight.values() if attempt > 1),
      )
  except BaseException:
    for ref in in_flight:
      ray.cancel(ref, force=True)
    raise
  finally:
    board.close()
  return outcome


def _poll(progress_of, tasks, fractions) -> None:
  for task in tasks:
    try:
      fraction = progress_of(task)
    except Exception as error:  # Progress must never end the job.
      logging.log_every_n_seconds(
        logging.WARNING, 'No progress of %s: %s', 600, task.key, error
      )
      continue
    if fraction is not None:
      fractions[task.key] = min(max(fraction, 0.0), 1.0)


def _finish(ray, ref, task, attempt, submitted, outcome, errors) -> bool:
  """Stores an attempt's result; returns False (error noted) if it failed.

  A failed attempt's error text is its first line, a short summary, then the
  full text Ray gives (with the remote traceback).
  """
  try:
    result = ray.get(ref)
  except ray.exceptions.RayError as error:
    errors[task.key].append(f'{describe_error(error)}\n{error}')
    outcome.causes[task.key] = getattr(error, 'cause', None) or error
    return False
  outcome.results[task.key] = result
  outcome.seconds[task.key] = time.monotonic() - submitted
  if errors.get(task.key):
    outcome.retried[task.key] = errors[task.key]
  logging.info('%s done after %d attempt(s)', task.key, attempt)
  return True
