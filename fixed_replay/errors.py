"""Exceptions raised for damaged or mismatched replay checkpoints."""

from collections.abc import Sequence


class CheckpointError(Exception):
  """A checkpoint file is missing, damaged or not what was asked for.

  Attributes:
    path: str, the file (or directory) at fault.
    problem: str, what is wrong with it.
  """

  def __init__(self, path: str, problem: str) -> None:
    super().__init__(f'{path}: {problem}')
    self.path = path
    self.problem = problem

  def __reduce__(self):
    # Rebuilt from (path, problem), so it survives a process pool's pickling.
    return type(self), (self.path, self.problem)


class CheckpointProblems(CheckpointError):
  """Several problems at once (convert checks every checkpoint first).

  Attributes:
    errors: list of CheckpointError, each naming its file.
  """

  def __init__(self, path: str, errors: Sequence[CheckpointError]) -> None:
    self.errors = list(errors)
    lines = '\n'.join(f'  {error}' for error in self.errors)
    super().__init__(path, f'{len(self.errors)} problem(s):\n{lines}')

  def __reduce__(self):
    return type(self), (self.path, self.errors)


class RemoteError(CheckpointError):
  """Remote storage did not answer, or refused: the cause, never 'missing'."""


class UsageError(ValueError):
  """A mistake in what was asked for: an agent name, a gin file, the data.

  The command line prints its message as one line, without a traceback.
  """
