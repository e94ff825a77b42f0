"""Errors a user meets: each message is one sentence naming the problem and what to do.

Every command prints them as one line, never as a traceback, and exits by their type
(`exit_code`): UsageError 2 (the command or its config is wrong; nothing was touched), the
others 1 (the data, the workdir or the run). textattn.data.DataError is one of them.
"""


class UsageError(ValueError):
  """A mistake in the command: a flag, a config file or a config field's value. Raised before
  the workdir is touched."""


class DataError(ValueError):
  """Bad data or data configuration; the message names the file, row and problem."""


class DataConfigError(UsageError, DataError):
  """A data setting of the config names data that cannot be used (no such file, a split file
  for a TFDS set, ...): the command is wrong (exit 2), and it is a DataError like every error
  about data."""


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


class Terminated(KeyboardInterrupt):
  """SIGTERM outside the training loop (whose own handler saves a checkpoint first), raised by
  loop.sigterm_as_interrupt's handler: handled as Ctrl-C is there, with SIGTERM's exit code."""
  exit_code = 143


def one_line(text, limit: int | None = None) -> str:
  """`text` with its whitespace runs collapsed to single spaces (and cut at `limit`)."""
  line = " ".join(str(text).split())
  return line if limit is None else line[:limit]


USER_ERRORS = (UsageError, DataError, RunError, NonFiniteLossError)


def fail(error: Exception) -> None:
  """Ends a command on a user's mistake or a failed run: its one sentence on stderr and the exit
  code of its type (2 for a UsageError, 1 for the others)."""
  import sys
  print(f"error: {one_line(error)}", file=sys.stderr)
  sys.exit(2 if isinstance(error, UsageError) else 1)


class user_errors:
  """Within the block, USER_ERRORS end the command through `fail` (one line, no traceback), and
  Ctrl-C (or SIGTERM as errors.Terminated) in one line with 128 + the signal (the commands
  write each output whole, atomically, or not at all); anything else is a bug and keeps its
  traceback."""

  def __enter__(self):
    return self

  def __exit__(self, kind, error, traceback):
    if error is not None and isinstance(error, USER_ERRORS):
      fail(error)
    if isinstance(error, KeyboardInterrupt):
      import sys
      print("interrupted: stopped here; what was written before is intact (each output file is "
            "written whole or not at all).", file=sys.stderr)
      sys.exit(getattr(error, "exit_code", 130))
    return False
