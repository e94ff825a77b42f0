"""`python -m textattn.benchmark`: the sweep, or (--point_spec) one point's subprocess."""

from absl import app

from textattn import benchmark, command_line
from textattn.benchmark import cli

__doc__ = benchmark.__doc__  # what absl's --help prints: the main module's docstring

if __name__ == "__main__":
  # Flag errors (a bad value, an unreadable --config): one line, exit 2, as the checks in main.
  app.run(cli.main, flags_parser=command_line.flags_parser("config"))
