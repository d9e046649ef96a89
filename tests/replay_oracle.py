"""Checking a buffer's batches against Dopamine's own buffer (the oracle)."""

import numpy as np


def as_dict(buffer, batch):
  """A buffer's batch tuple as {element name: array}."""
  names = [e.name for e in buffer.get_transition_elements(len(batch[0]))]
  return dict(zip(names, batch, strict=True))


def assert_equals_oracle(batch, oracle_of, names=None):
  """Each transition equals Dopamine's for its checkpoint and file row.

  Args:
    batch: dict of element name to array (see as_dict), with `suffix`.
    oracle_of: callable(suffix) -> Dopamine OutOfGraphReplayBuffer loaded
      with that checkpoint's whole file.
    names: the elements compared (None: all of Dopamine's).
  """
  for suffix in np.unique(batch['suffix']):
    members = batch['suffix'] == suffix
    oracle = oracle_of(int(suffix))
    expected = oracle.sample_transition_batch(
      int(members.sum()), indices=batch['indices'][members]
    )
    elements = oracle.get_transition_elements(int(members.sum()))
    elements = [e.name for e in elements]
    for name, array in zip(elements, expected, strict=True):
      if names is not None and name not in names:
        continue
      assert batch[name].dtype == array.dtype, name
      np.testing.assert_array_equal(
        batch[name][members], array, err_msg=f'{name} of checkpoint {suffix}'
      )
