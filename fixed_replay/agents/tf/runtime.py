"""TensorFlow 1 graph-mode set-up shared by the offline TF agents.

Dopamine's TF agents build TF1 graphs. Three things they and their gin
configs need, kept in this one place:

* graph mode: Dopamine's `train.py` calls
  `tf.compat.v1.disable_v2_behavior()` before creating an agent, and
  RainbowAgent (C51) builds tensors before DQNAgent would; every path that
  creates a TF agent here calls `use_graph_mode()` first;
* the device: `tf_device='/gpu:0'` (batch_rl's configs) on a machine without
  a GPU falls back to the CPU, saying so once;
* gin names: importing this module imports `gin.tf.external_configurables`
  (TF1's optimizers as `tf.train.AdamOptimizer`, `tf.train.RMSPropOptimizer`,
  ..., learning-rate decays, losses, activations; see fixed_replay/compat.py
  for why it imports on TensorFlow 2.18), and registers
  `preferred_tf_device` (our configs bind `tf_device =
  @preferred_tf_device()`).
"""

import re

from absl import logging
import gin
import gin.tf.external_configurables  # noqa: F401  (tf.train.* names)
import tensorflow as tf

_CPU_DEVICE = '/cpu:*'
_warned_devices = set()


def use_graph_mode() -> None:
  """Switches TensorFlow to TF1 graph mode, as Dopamine's train.py does.

  Process-wide and idempotent. Call it before creating a Dopamine TF agent:
  RainbowAgent creates tensors in its constructor, which fail later with
  "Attempting to capture an EagerTensor" when created eagerly.
  """
  if tf.executing_eagerly():
    tf.compat.v1.disable_v2_behavior()


def _has_gpu():
  return bool(tf.config.list_physical_devices('GPU'))


def resolve_device(tf_device: str) -> str:
  """Returns tf_device, or the CPU when it names a GPU this machine lacks.

  Args:
    tf_device: str, a TensorFlow device such as '/gpu:0' or '/cpu:*'.

  Returns:
    str, the device to build the graph on.
  """
  if not re.search(r'(^|/)(device:)?gpu(:|$)', str(tf_device).lower()):
    return tf_device
  if _has_gpu():
    return tf_device
  if tf_device not in _warned_devices:
    _warned_devices.add(tf_device)
    logging.warning(
      "tf_device=%r but TensorFlow sees no GPU: building on '%s' instead.",
      tf_device,
      _CPU_DEVICE,
    )
  return _CPU_DEVICE


@gin.configurable
def preferred_tf_device() -> str:
  """Returns '/gpu:0' if TensorFlow sees a GPU, else '/cpu:*'.

  Dopamine's default ('/cpu:*') never uses a GPU, and a GPU device on a
  machine without one works only through soft placement, with a flood of
  placement warnings.
  """
  return '/gpu:0' if _has_gpu() else _CPU_DEVICE
