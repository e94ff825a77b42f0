"""Summarises experiments/cpu_auto/auto_vs_best.sh: per (variant, length), the median over rounds
of each implementation's median step time, the kernel "auto" resolved to, and auto / min(native,
XLA). Exit status 1 if any ratio exceeds 1.10 (issue 42: auto never more than 10% slower than the
better choice), 0 otherwise.

    python experiments/cpu_auto/summarize.py OUT_DIR
"""

from __future__ import annotations

import csv
import pathlib
import statistics
import sys
from collections import defaultdict

# The XLA kernel "auto" falls back to on a CPU (textattn/attention/softmax.py, additive.py).
FALLBACK = {"softmax": "fused", "causal": "fused", "additive": "xla"}
LIMIT = 1.10


def read_rows(out_dir: pathlib.Path) -> list[dict]:
  rows = []
  for path in sorted(out_dir.rglob("results.csv")):
    with open(path, newline="") as f:
      rows.extend(csv.DictReader(f))
  return rows


def summarize(rows: list[dict]) -> tuple[list[str], bool]:
  """The Markdown table's lines, and whether every ratio is within LIMIT."""
  times = defaultdict(list)  # (attention, length, implementation) -> median_ms per round
  resolved = defaultdict(set)  # (attention, length) -> what auto ran
  failed = []
  for row in rows:
    chosen = "auto" if row["variant"].endswith("_auto") else row["implementation"]
    key = (row["attention"], int(row["seq_len"]))
    if row["status"] != "ok":
      failed.append(f"{row['variant']} L={row['seq_len']}: {row['status']} ({row['message']})")
      continue
    times[key + (chosen,)].append(float(row["median_ms"]))
    if chosen == "auto":
      resolved[key].add(row["implementation"])
  lines = [("| variant | length | auto chose | auto ms | native ms | XLA ms (kernel) | "
            "chosen / best | auto / best |"),
           "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
  ok = not failed
  for attention, length in sorted(resolved, key=lambda k: (k[0], k[1])):
    fallback = FALLBACK.get(attention, "xla")
    median = {impl: statistics.median(times[(attention, length, impl)])
              for impl in ("auto", "native", fallback) if times[(attention, length, impl)]}
    if len(median) < 3:
      lines.append(f"| {attention} | {length} | {'/'.join(sorted(resolved[(attention, length)]))} "
                   f"| incomplete | | | | |")
      ok = False
      continue
    best = min(median["native"], median[fallback])
    chose = sorted(resolved[(attention, length)])
    chosen_ratio = max(median.get(c, float("nan")) for c in chose) / best
    ratio = median["auto"] / best
    ok &= ratio <= LIMIT
    lines.append(f"| {attention} | {length} | {'/'.join(chose)} | {median['auto']:.1f} | "
                 f"{median['native']:.1f} | {median[fallback]:.1f} ({fallback}) | "
                 f"{chosen_ratio:.2f} | **{ratio:.2f}**{'' if ratio <= LIMIT else ' > 1.10'} |")
  lines.append("")
  lines.append(f"auto / best = the auto row's median / min(native, XLA); chosen / best = the "
               f"same for the row of the kernel auto chose (free of the auto row's own noise). "
               f"Medians over rounds of each point's median step time. "
               f"{'Every' if ok else 'NOT every'} auto / best <= {LIMIT:.2f}.")
  lines.extend(f"Failed point: {line}" for line in failed)
  return lines, ok


def main(argv: list[str]) -> int:
  if len(argv) != 2:
    print(__doc__, file=sys.stderr)
    return 2
  rows = read_rows(pathlib.Path(argv[1]))
  if not rows:
    print(f"no results.csv under {argv[1]}", file=sys.stderr)
    return 2
  lines, ok = summarize(rows)
  print("\n".join(lines))
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main(sys.argv))
