r"""`fixed-replay train`: trains an offline agent on a replay dataset.

Every iteration trains from the fixed dataset (no environment step), then
evaluates the agent in the real game; checkpoints, logs/ and TensorBoard
events go to --base_dir, and rerunning resumes. Same flags as
`python -m fixed_replay.train` (and batch_rl's train.py):

  fixed-replay train --base_dir=/tmp/dqn_pong --replay_dir=/data/Pong/1 \
      --agent_name=dqn --gin_files=configs/dqn.gin
"""

from absl import flags

from fixed_replay import train

# The flags live in fixed_replay.train; show them in this command's --help.
flags.adopt_module_key_flags(train)
flags.mark_flags_as_required(train.REQUIRED_FLAGS)

main = train.main
