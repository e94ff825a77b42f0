"""Errors a user meets: each message is one sentence naming the problem and what to do.

textattn.main prints these (and textattn.data.DataError, and config ValueErrors) as one line
with a non-zero exit, never as a traceback.
"""


class RunError(ValueError):
  """The workdir cannot be used with this command (another run's checkpoints, an unreadable
  file); nothing in it is changed."""


class NonFiniteLossError(RuntimeError):
  """The training loss or parameters became NaN/Inf; the last good checkpoint is kept."""


class Stopped(Exception):
  """Training stopped on SIGINT/SIGTERM after saving a checkpoint; the run resumes exactly when
  the same command is run again. `exit_code`: 128 + the signal number (130 SIGINT, 143
  SIGTERM), what a shell reports for a process ended by that signal."""

  def __init__(self, message: str, exit_code: int):
    super().__init__(message)
    self.exit_code = exit_code


def one_line(text, limit: int | None = None) -> str:
  """`text` with its whitespace runs collapsed to single spaces (and cut at `limit`)."""
  line = " ".join(str(text).split())
  return line if limit is None else line[:limit]
