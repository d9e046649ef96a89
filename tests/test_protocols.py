"""The extension points' implementations satisfy their Protocols.

Each Protocol names the methods its callers use; an implementation that
lacks one, or takes other parameters, fails here rather than deep inside a
conversion.
"""

import inspect

import pytest

from fixed_replay.convert import checkpoint_commit
from fixed_replay.convert import checkpoint_source
from fixed_replay.convert import compact_output
from fixed_replay.convert import convert_runners
from fixed_replay.convert import dopamine_output
from fixed_replay.convert import rlu_source


def _members(protocol):
  return sorted(
    name
    for name, value in vars(protocol).items()
    if callable(value)
    and (not name.startswith('_') or name in ('__enter__', '__exit__'))
  )


def _parameters(function):
  return list(inspect.signature(function).parameters)


@pytest.mark.parametrize(
  'protocol, implementation',
  [
    (checkpoint_commit.ConverterOutput, compact_output.CompactOutput),
    (checkpoint_commit.ConverterOutput, dopamine_output.DopamineOutput),
    (checkpoint_source.CheckpointSource, checkpoint_source.GzipSource),
    (checkpoint_source.CheckpointSource, rlu_source.EpisodeSource),
    (checkpoint_source.CheckpointSource, checkpoint_source.StoredSource),
    (checkpoint_source.SourceReader, checkpoint_source._GzipReader),
    (checkpoint_source.SourceReader, rlu_source._EpisodeReader),
    (checkpoint_source.SourceReader, checkpoint_source._StoredReader),
    (convert_runners.ConversionRunner, convert_runners.InProcess),
    (convert_runners.ConversionRunner, convert_runners.ProcessPool),
    (convert_runners.ConversionRunner, convert_runners.RayRunner),
  ],
)
def test_implementation_has_every_method_of_its_protocol(
  protocol, implementation
):
  members = _members(protocol)
  assert members
  for name in members:
    method = getattr(implementation, name, None)
    assert callable(method), f'{implementation.__name__} lacks {name}'
    wanted = _parameters(getattr(protocol, name))
    if wanted[1:2] != ['exc_info']:
      assert _parameters(method) == wanted, (implementation.__name__, name)
