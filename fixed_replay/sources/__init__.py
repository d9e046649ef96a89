"""Where replay data comes from: one package per source, and what a path holds.

`dopamine/` reads, checks and writes Dopamine's checkpoint files (the DQN
Replay Dataset's own format); `rlu/` reads RL Unplugged's TFRecord shards and
TFDS directories. Neither knows the other: what they share (summaries of
episodes) sits here, and `layout.py` says which of them, or a compact store,
a path holds.
"""
