"""Makes Dopamine 4.1.2 importable without manual set-up.

Three things stand between a fresh install and `from dopamine.discrete_domains
import atari_lib` (or a batch_rl gin config):

* Dopamine's TF agents are written against Keras 2, so TensorFlow must be told
  to use `tf_keras` before it is first imported (`TF_USE_LEGACY_KERAS=1`).
* `atari_lib` imports OpenAI `baselines` at module level, an undeclared
  dependency whose PyPI release drags in mpi4py. Dopamine only uses it for
  `use_ppo_preprocessing=True`. When `baselines` is not installed we register a
  placeholder module whose attributes raise an ImportError saying what to
  install, so everything else imports and the one path that needs it fails
  clearly.
* `gin.tf` (imported by `import gin.tf.external_configurables`, the line that
  registers `tf.train.AdamOptimizer` and the other TF1 names in batch_rl's
  configs) ends by importing `gin.tf.utils`, whose only content is a
  `tf.estimator` hook; TensorFlow 2.16+ has no `tf.estimator`. When the
  `tensorflow_estimator` package is absent we register a placeholder
  `gin.tf.utils` whose `GinConfigSaverHook` raises an ImportError saying why,
  so gin's own `external_configurables` imports and registers everything.
"""

import importlib.util
import os
import sys
import types

_BASELINES_HINT = (
  'OpenAI baselines is not installed. Dopamine needs '
  '`baselines.common.atari_wrappers` only for use_ppo_preprocessing=True; '
  'install it with `pip install "baselines @ '
  'git+https://github.com/openai/baselines"` to use that path.'
)


_GIN_TF_UTILS_HINT = (
  'gin.tf.utils.GinConfigSaverHook is a tf.estimator hook and this '
  'TensorFlow has no tf.estimator (removed in TensorFlow 2.16).'
)


class _MissingModule(types.ModuleType):
  """A module whose every attribute lookup raises an ImportError."""

  def __init__(self, name, hint):
    super().__init__(name)
    self.__dict__['_hint'] = hint
    self.__dict__['__path__'] = []  # Lets `import name.sub` find submodules.

  def __getattr__(self, attribute):
    if attribute.startswith('__'):
      raise AttributeError(attribute)
    raise ImportError(f'{self.__name__}.{attribute}: {self._hint}')


class _MissingClass:
  """Stands for a class that cannot exist here; using it raises ImportError."""

  hint = ''

  def __init__(self, *args, **kwargs):
    del args, kwargs
    raise ImportError(self.hint)


def _install_baselines_placeholder():
  """Registers placeholder `baselines` modules if the real one is absent."""
  if 'baselines' in sys.modules or importlib.util.find_spec('baselines'):
    return
  for name in (
    'baselines',
    'baselines.common',
    'baselines.common.atari_wrappers',
  ):
    sys.modules[name] = _MissingModule(name, _BASELINES_HINT)
  sys.modules['baselines'].common = sys.modules['baselines.common']
  sys.modules['baselines.common'].atari_wrappers = sys.modules[
    'baselines.common.atari_wrappers'
  ]


def _install_gin_tf_utils_placeholder():
  """Lets `gin.tf` import without tf.estimator (see the module docstring)."""
  if 'gin.tf.utils' in sys.modules or importlib.util.find_spec(
    'tensorflow_estimator'
  ):
    return
  module = types.ModuleType('gin.tf.utils', _GIN_TF_UTILS_HINT)
  module.GinConfigSaverHook = type(
    'GinConfigSaverHook', (_MissingClass,), {'hint': _GIN_TF_UTILS_HINT}
  )
  sys.modules['gin.tf.utils'] = module


def _use_legacy_keras():
  """Selects Keras 2 for TensorFlow unless the user chose otherwise."""
  if 'tensorflow' in sys.modules and 'TF_USE_LEGACY_KERAS' not in os.environ:
    # Too late to switch: TensorFlow already picked its Keras.
    sys.stderr.write(
      'fixed_replay: TensorFlow was imported before fixed_replay; set '
      "TF_USE_LEGACY_KERAS=1 or import fixed_replay first for Dopamine's "
      'TF agents.\n'
    )
  os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')


class MissingExtraError(ImportError):
  """A feature's optional dependency is absent; the message says what to run.

  The CLI prints it as one line (no traceback): it is an installation step,
  not a bug.
  """


def require(module_name, pip_name=None, purpose='', extra=None):
  """Imports a module or raises an ImportError naming what to install.

  Args:
    module_name: str, the module to import.
    pip_name: str, the PyPI distribution that provides it (defaults to
      module_name).
    purpose: str, what the caller needs it for, shown in the message.
    extra: str or None, the fixed_replay extra that installs it (e.g.
      'ray'); the message then names `pip install 'fixed_replay[extra]'`.

  Returns:
    The imported module.

  Raises:
    MissingExtraError: if `extra` is given and the module cannot be
      imported.
    ImportError: if the module cannot be imported.
  """
  try:
    module = importlib.import_module(module_name)
    if getattr(module, '__file__', None) is None:
      # A namespace package: a directory of that name on sys.path (Ray's
      # /tmp/ray, say, when run from /tmp), not the package itself.
      raise ModuleNotFoundError(f'{module_name} is a bare directory')
    return module
  except ImportError as error:
    reason = f' for {purpose}' if purpose else ''
    if extra:
      raise MissingExtraError(
        f'{pip_name or module_name} is needed{reason} and is not installed: '
        f"pip install 'fixed_replay[{extra}]'"
      ) from error
    raise ImportError(
      f'{module_name} is needed{reason}: pip install '
      f'{pip_name or module_name}'
    ) from error


def install():
  """Applies the three fixes; safe to call more than once."""
  _use_legacy_keras()
  _install_baselines_placeholder()
  _install_gin_tf_utils_placeholder()
