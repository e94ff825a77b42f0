"""Old vs new workdirs of run.sh: every metrics.jsonl row must be identical apart from timing.

    python experiments/runner_equivalence/compare.py OUT_OLD OUT_NEW
"""

import json
import pathlib
import sys

TIMING = ("examples_per_sec", "compile_s", "decode_seconds_")


def rows(path: pathlib.Path) -> list[dict]:
  out = []
  for line in path.read_text().splitlines():
    row = json.loads(line)
    out.append({k: v for k, v in row.items() if not any(t in k for t in TIMING)})
  return out


def main(old: str, new: str) -> int:
  failures = 0
  for run in sorted(p.name for p in pathlib.Path(old).iterdir() if p.is_dir()):
    a = rows(pathlib.Path(old, run, "metrics.jsonl"))
    b = rows(pathlib.Path(new, run, "metrics.jsonl"))
    same = a == b
    failures += not same
    print(f"{run}: {len(a)} rows old, {len(b)} new: {'identical' if same else 'DIFFERENT'}")
    if not same:
      for x, y in zip(a, b):
        if x != y:
          print(f"  first difference:\n    old {x}\n    new {y}")
          break
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main(*sys.argv[1:3]))
