"""Exceptions raised for damaged or mismatched replay checkpoints."""


class CheckpointError(Exception):
  """A checkpoint file is missing, damaged or not what was asked for.

  Attributes:
    path: str, the file (or directory) at fault.
    problem: str, what is wrong with it.
  """

  def __init__(self, path, problem):
    super().__init__(f'{path}: {problem}')
    self.path = path
    self.problem = problem

  def __reduce__(self):
    # Rebuilt from (path, problem), so it survives a process pool's pickling.
    return type(self), (self.path, self.problem)
