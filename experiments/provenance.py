"""What every experiment records beside its figures: the CPU, the commit, and JSONL rows."""

from __future__ import annotations

import json
import os
import platform
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_name() -> str:
  """The CPU's model name (/proc/cpuinfo), else what `platform` knows."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def commit() -> str:
  """The repository's HEAD, short."""
  return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                        text=True, check=False).stdout.strip()


def read_lines(path: str) -> list[dict]:
  """The rows of a JSONL file ([] if it does not exist)."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]
