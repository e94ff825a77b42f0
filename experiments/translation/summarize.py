"""Translation runs grouped by name (workdirs NAME_sSEED): best and last validation next-token
accuracy, test token accuracy, BLEU and chrF (greedy, beam), mean +- sd (sample sd) over seeds,
as a Markdown table, plus each run's wall time from its run_timed.py log (DIR.log) when there is one.

    python experiments/translation/summarize.py RUNS
"""

import collections
import json
import os
import pathlib
import re
import sys

import numpy as np


def run_row(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  val = [r["val/accuracy"] for r in rows if "val/accuracy" in r]
  test = [r for r in rows if "test/params_from_step" in r][-1]
  out = {"val best": max(val), "val last": val[-1], "test accuracy": test["test/accuracy"]}
  for key, value in test.items():
    if key.startswith(("test/bleu_", "test/chrf_")) and not key.endswith("signature"):
      out[key.split("/", 1)[1]] = value
  log = workdir.rstrip("/") + ".log"
  if os.path.exists(log):
    total = re.findall(r"total (\d+) s", pathlib.Path(log).read_text(encoding="utf-8"))
    if total:
      out["wall s"] = float(total[-1])
  return out


def main(root):
  groups = collections.defaultdict(dict)
  for name in sorted(os.listdir(root)):
    match = re.fullmatch(r"(.+)_s(\d+)", name)
    path = os.path.join(root, name)
    if match and os.path.isdir(path) and os.path.exists(os.path.join(path, "test_translations.jsonl")):
      groups[match.group(1)][int(match.group(2))] = run_row(path)
  columns = sorted({k for runs in groups.values() for r in runs.values() for k in r},
                   key=lambda k: (k != "val best", k != "val last", k != "test accuracy", k))
  print("| runs (seeds) | " + " | ".join(columns) + " |")
  print("|---" * (len(columns) + 1) + "|")
  for group, runs in groups.items():
    cells = []
    for column in columns:
      values = np.array([r[column] for r in runs.values() if column in r], float)
      scale = 100 if column.startswith(("val", "test accuracy")) else 1
      cells.append(f"{scale * values.mean():.2f} ± {scale * values.std(ddof=1):.2f}"
                   if len(values) > 1 else f"{scale * values.mean():.2f}" if len(values) else "–")
    print(f"| {group} ({','.join(map(str, sorted(runs)))}) | " + " | ".join(cells) + " |")
  for group, runs in groups.items():
    for seed, r in sorted(runs.items()):
      print(f"{group} seed {seed}: " + ", ".join(f"{k} {v:.4f}" for k, v in r.items()))


if __name__ == "__main__":
  main(sys.argv[1])
