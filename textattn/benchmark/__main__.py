"""`python -m textattn.benchmark`: the sweep, or (--point_spec) one point's subprocess."""

from absl import app

from textattn import benchmark
from textattn.benchmark import cli

__doc__ = benchmark.__doc__  # what absl's --help prints: the main module's docstring

if __name__ == "__main__":
  app.run(cli.main)
