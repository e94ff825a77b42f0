"""Errors a user meets: each message is one sentence naming the problem and what to do.

textattn.main prints these (and textattn.data.DataError, and config ValueErrors) as one line
with a non-zero exit, never as a traceback.
"""


class RunError(ValueError):
  """The workdir cannot be used with this command (another run's checkpoints, an unreadable
  file); nothing in it is changed."""


class NonFiniteLossError(RuntimeError):
  """The training loss or parameters became NaN/Inf; the last good checkpoint is kept."""
