"""Checks the wiring of one command of an experiments/gpu script without running it (rehearsal).

    python experiments/gpu/rehearse.py -m MODULE ARGS...   # or SCRIPT.py ARGS...

The scripts' long steps (sweeps over hours, the GPU test suite) call `wired` (setup.sh), which on
a GPU runs the command and with REHEARSE=1 runs this instead, so a renamed module, flag or config
field, or a missing file, fails the test suite (tests/test_gpu_scripts.py) rather than the next
GPU run:
  -m pytest      collects the tests the command selects (files, -k), runs none;
  -m MODULE      imports it and parses the arguments with its own parser (absl flags with the
                 config file loaded and its --config.* overrides applied, or argparse), then
                 stops before its main work;
  SCRIPT.py      imports it and calls its `rehearse()`, which checks the commands it would run;
and every argument naming a committed file (configs/*.py, experiments/...) must exist. Data the
scripts read from .gpu/ (gitignored exports made beforehand, as each script's header says) is
not checked. Exit status 0 when the wiring holds, else the parser's or an error's.
"""

from __future__ import annotations

import argparse
import os
import runpy
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pytest options of plugins the GPU machines have and CI may not (the value is kept out too).
OPTIONAL_PLUGIN_OPTIONS = {"--timeout": "pytest-timeout"}


class _Parsed(Exception):
  """Raised once a module's arguments have parsed: the command is wired."""


def _check_files(args: list[str]) -> None:
  for arg in args:
    value = arg.split("=", 1)[-1]
    if (value.endswith((".py", ".sh")) and not value.startswith(".gpu/")
        and not os.path.exists(os.path.join(REPO, value))):
      raise SystemExit(f"rehearsal: {arg!r} names a file that does not exist")


def _pytest_args(args: list[str]) -> list[str]:
  """The command's pytest arguments for a collection-only run: xdist's worker count and options
  of plugins missing here dropped (each said)."""
  import importlib.util
  kept, skip_value = [], False
  for arg in args:
    if skip_value:
      skip_value = False
      continue
    option = arg.split("=", 1)[0]
    plugin = OPTIONAL_PLUGIN_OPTIONS.get(option)
    if plugin and importlib.util.find_spec(plugin.replace("-", "_")) is None:
      print(f"rehearsal: {arg} left out ({plugin} is not installed here)")
      skip_value = "=" not in arg
      continue
    if option in ("-n", "--numprocesses"):  # (collection needs no workers)
      skip_value = "=" not in arg
      continue
    kept.append(arg)
  return kept + ["--collect-only", "-q", "-p", "no:cacheprovider"]


def parse_only(module: str, args: list[str]) -> None:
  """Runs `python -m module args` up to its argument parsing (absl or argparse)."""
  from absl import app, flags

  original = argparse.ArgumentParser.parse_args

  def parse_args(self, *a, **k):
    original(self, *a, **k)
    raise _Parsed

  def run(main, argv=None, flags_parser=None):
    del main
    argv = sys.argv if argv is None else argv
    (flags_parser or flags.FLAGS)(argv)
    raise _Parsed

  argparse.ArgumentParser.parse_args = parse_args
  app.run = run
  sys.argv = [module] + args
  try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
  except _Parsed:
    return
  raise SystemExit(f"rehearsal: python -m {module} finished without parsing its arguments "
                   f"through argparse or absl; rehearse it another way")


def check(command: list[str]) -> None:
  """The wiring of `python3 COMMAND...`, in a fresh interpreter (absl flags are process-wide)."""
  result = subprocess.run([sys.executable, os.path.abspath(__file__), *command], cwd=REPO,
                          check=False)
  if result.returncode:
    raise SystemExit(f"rehearsal failed ({result.returncode}): python3 {' '.join(command)}")


def main(argv: list[str]) -> None:
  if not argv:
    raise SystemExit(__doc__)
  _check_files(argv)
  if argv[0] == "-m" and argv[1] == "pytest":
    import pytest
    sys.exit(pytest.main(_pytest_args(argv[2:])))
  if argv[0] == "-m":
    parse_only(argv[1], argv[2:])
  elif argv[0].endswith(".py"):
    namespace = runpy.run_path(os.path.join(REPO, argv[0]), run_name="rehearsal")
    if "rehearse" not in namespace:
      raise SystemExit(f"rehearsal: {argv[0]} has no rehearse() to check the commands it runs")
    namespace["rehearse"](argv[1:])
  else:
    raise SystemExit(f"rehearsal: cannot rehearse python3 {' '.join(argv)}")
  print(f"rehearsal: wired: python3 {' '.join(argv)}"[:300])


if __name__ == "__main__":
  main(sys.argv[1:])
