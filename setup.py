"""Installs fixed_replay and its pinned Dopamine stack."""

import pathlib

import setuptools

_HERE = pathlib.Path(__file__).parent


def _requirements():
  lines = (_HERE / 'requirements.txt').read_text().splitlines()
  return [
    line.strip() for line in lines if line.strip() and not line.startswith('#')
  ]


setuptools.setup(
  name='fixed_replay',
  version='0.1.0',
  description=(
    'Offline RL on the DQN Replay Dataset and any Dopamine replay '
    'logs, streaming checkpoints instead of loading them whole.'
  ),
  long_description=(_HERE / 'README.md').read_text(),
  long_description_content_type='text/markdown',
  packages=setuptools.find_packages(include=['fixed_replay', 'fixed_replay.*']),
  python_requires='>=3.11,<3.12',
  install_requires=_requirements(),
  entry_points={'console_scripts': ['fixed-replay=fixed_replay.cli:main']},
  license='Apache 2.0',
)
