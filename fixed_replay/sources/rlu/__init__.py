"""RL Unplugged's DQN Replay data: TFRecord shards, TFDS directories, plans."""
