"""Imports TensorFlow, Dopamine, JAX... with the cyclic collector paused.

Importing TensorFlow, Dopamine and JAX leaves some 800,000 objects alive
(modules, classes, functions, op registrations). CPython's collector runs
after every 700 net allocations, and every so often walks all the objects
alive, so during these imports it walks them again and again. It keeps
walking them after the imports too, while the agent builds its graph and
trains. `python benchmarks/sweep_benchmark.py --parts=startup` measures
the imports in fresh processes (docs/benchmarks.md, "Start-up and
sweeps"). On the project's 2-core machine (2026-12-02, by the former
`startup_benchmark.py`, which also timed a train iteration) the
training imports took 0.53x the CPU of a plain import, and one tiny
`fixed-replay train` iteration 0.59x (4.4 CPU-s instead of 7.4).

After `install()`, a module of HEAVY_PACKAGES imported while no pause is on
runs with the collector off, and so does all it imports. When it returns,
every object alive is frozen (`gc.freeze`: moved to a generation no
collection walks; they live as long as the process anyway), and the
collector is turned back on. Freezing keeps nothing alive (reference
counting still frees a frozen object); only a cycle among frozen objects
that becomes garbage later stays until the process ends. What the imports
left as cyclic garbage is frozen with them: after the training imports a
full collection found about 5,000 such objects, and cost 0.6 CPU-s.

Only processes of this project install it: the command-line entry points,
Ray workers running its tasks, the test processes. `import fixed_replay`
does not, since freezing is a decision about a whole program, its host's to
make.
"""

import contextlib
import gc
import importlib.abc
import importlib.util
import sys
import threading

# Top-level packages whose imports are heavy, or which import the heavy ones
# (Dopamine, flax, ...). A module of one of them imported while no pause is
# on is paused; what it imports runs inside its pause.
HEAVY_PACKAGES = frozenset(
  {
    'dopamine',
    'flax',
    'gym',
    'gymnasium',
    'jax',
    'optax',
    'orbax',
    'ray',
    'tensorflow',
    'tensorflow_datasets',
    'tensorflow_probability',
    'tf_keras',
    'torch',
  }
)

_lock = threading.Lock()
_depth = 0  # Pauses in progress (nested heavy imports, several threads).
_was_enabled = True  # The collector's state before the outermost pause.


@contextlib.contextmanager
def _collector_paused():
  """Runs the block with the collector off; freezes what it left alive.

  Nested or concurrent pauses end together: the collector stays off until
  the last one ends, and is then turned on only if it was on before the
  first.
  """
  global _depth, _was_enabled
  with _lock:
    if _depth == 0:
      _was_enabled = gc.isenabled()
      gc.disable()
    _depth += 1
  try:
    yield
  finally:
    with _lock:
      _depth -= 1
      if _depth == 0:
        gc.freeze()
        if _was_enabled:
          gc.enable()


class _PausedLoader(importlib.abc.Loader):
  """Executes a module with its real loader, the collector paused."""

  def __init__(self, loader):
    self.loader = loader

  def create_module(self, spec):
    return self.loader.create_module(spec)

  def exec_module(self, module):
    # The module sees its own loader, during its import and after it.
    module.__spec__.loader = module.__loader__ = self.loader
    with _collector_paused():
      self.loader.exec_module(module)


class _Finder(importlib.abc.MetaPathFinder):
  """Finds HEAVY_PACKAGES with the finders after it; pauses their import."""

  def find_spec(self, fullname, path=None, target=None):
    if _depth or fullname.partition('.')[0] not in HEAVY_PACKAGES:
      return None  # Inside a pause already, or not heavy.
    for finder in sys.meta_path:
      if finder is not self and hasattr(finder, 'find_spec'):
        spec = finder.find_spec(fullname, path, target)
        if spec is not None:
          break
    else:
      return None
    if not hasattr(spec.loader, 'exec_module'):
      return spec  # A loader of the old protocol: imported as it is.
    spec.loader = _PausedLoader(spec.loader)
    return spec


_FINDER = _Finder()


def install() -> None:
  """Pauses the collector while a module of HEAVY_PACKAGES imports.

  Idempotent. Modules already imported are left as they are.
  """
  if _FINDER not in sys.meta_path:
    sys.meta_path.insert(0, _FINDER)
