"""Draws batches through torchdata's StatefulDataLoader, as a training run.

`draw(spec)` runs in the test's process; `python resumed_loader.py SPEC`
runs the same in a fresh process, as a run restarted after being killed:
it loads the loader's saved state (torch.save) and writes the batches it
draws next (np.save). A spec is JSON: kind ('replay', 'segments' or
'mixture'), data, arguments, num_workers, batches, and optionally state
(a file to resume from), save_state and out (files to write).
"""

import json
import os
import subprocess
import sys

import numpy as np
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from fixed_replay import torch as fixed_replay_torch

DATASETS = {
  'replay': fixed_replay_torch.ReplayDataset,
  'segments': fixed_replay_torch.SegmentDataset,
  'mixture': fixed_replay_torch.MixtureDataset,
}


def draw(spec):
  """[indices of each batch] drawn after resuming from spec's state."""
  arguments = dict(spec['arguments'])
  if 'observation_dtype' in arguments:
    arguments['observation_dtype'] = np.dtype(arguments['observation_dtype'])
  dataset = DATASETS[spec['kind']](spec['data'], **arguments)
  loader = StatefulDataLoader(
    dataset, batch_size=None, num_workers=spec['num_workers']
  )
  if spec.get('state'):
    loader.load_state_dict(torch.load(spec['state']))
  iterator = iter(loader)
  drawn = [next(iterator)['indices'].numpy() for _ in range(spec['batches'])]
  if spec.get('save_state'):
    torch.save(loader.state_dict(), spec['save_state'])
  del iterator, loader
  dataset.close()
  return drawn


def assert_resumes_exactly(spec, tmp_path, killed_after=5, then=4):
  """Batches killed_after+1.. of a run resumed in a fresh process from the
  state saved after batch `killed_after` are the uninterrupted run's."""
  uninterrupted = draw(dict(spec, batches=killed_after + then))
  state = tmp_path / 'loader_state.pt'
  draw(dict(spec, batches=killed_after, save_state=str(state)))
  resumed_spec = dict(
    spec, batches=then, state=str(state), out=str(tmp_path / 'resumed.npy')
  )
  (tmp_path / 'spec.json').write_text(json.dumps(resumed_spec))
  ran = subprocess.run(
    [sys.executable, __file__, str(tmp_path / 'spec.json')],
    check=True,
    env=dict(os.environ),
    timeout=300,
    capture_output=True,
    text=True,
  )
  # torchdata replays the batches when a dataset keeps no state.
  assert 'fast-forward' not in ran.stderr
  resumed = np.load(resumed_spec['out'])
  np.testing.assert_array_equal(resumed, np.stack(uninterrupted[killed_after:]))
  # Batches differ from each other: a resume from the wrong place fails.
  assert len({b.tobytes() for b in uninterrupted}) == len(uninterrupted)


if __name__ == '__main__':
  with open(sys.argv[1]) as f:
    spec = json.load(f)
  np.save(spec['out'], np.stack(draw(spec)))
