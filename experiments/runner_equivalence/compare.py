"""Old vs new workdirs of run.sh: every metrics.jsonl row must be identical apart from timing,
and so must the test predictions (test_predictions.npz) and translations (test_translations.jsonl).

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
    for name in ("test_predictions.npz", "test_translations.jsonl"):
      old_file, new_file = pathlib.Path(old, run, name), pathlib.Path(new, run, name)
      if old_file.exists() or new_file.exists():
        equal = (old_file.exists() and new_file.exists()
                 and old_file.read_bytes() == new_file.read_bytes())
        print(f"{run}/{name}: {'identical' if equal else 'DIFFERENT'}")
        same = same and equal
    failures += not same
    print(f"{run}: {len(a)} metric rows old, {len(b)} new: {'identical' if a == b else 'DIFFERENT'}")
    if not same:
      for x, y in zip(a, b):
        if x != y:
          print(f"  first difference:\n    old {x}\n    new {y}")
          break
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main(*sys.argv[1:3]))
