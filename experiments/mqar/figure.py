"""The recall study's figure, as Zoology draws it (Arora et al. 2023, Figure 2): MQAR test
accuracy against model width, a line per attention family, one panel per test setting (the
training setting first), from the rows experiments/mqar/study.py wrote. Each point is the run of
the best validation accuracy among the learning rates of its (family, width, seed), averaged
over seeds.

    python experiments/mqar/figure.py experiments/mqar/study.jsonl --out=experiments/mqar/figure.png
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from experiments.mqar.study import TRAINED, causal_order, chosen, read_lines  # noqa: E402


def series(rows: list[dict], setting: str) -> dict[str, list[tuple[int, float]]]:
  """family -> [(width, mean test accuracy at `setting`)], widths ascending."""
  picked = chosen(rows)
  out: dict[str, dict[int, list[float]]] = {}
  for (family, width, _), row in picked.items():
    value = row.get(f"test/{setting}/accuracy")
    if value is not None:
      out.setdefault(family, {}).setdefault(width, []).append(value)
  return {family: sorted((w, statistics.mean(v)) for w, v in widths.items())
          for family, widths in sorted(out.items(), key=lambda item: causal_order(item[0]))}


def settings_of(rows: list[dict]) -> list[str]:
  found = {k.split("/")[1] for r in rows for k in r
           if k.startswith("test/") and k.endswith("/accuracy") and k.count("/") == 2}
  ordered = sorted(found, key=lambda s: tuple(int(x) for x in s.split("x")))
  return ([TRAINED] if TRAINED in found else []) + [s for s in ordered if s != TRAINED]


def draw(rows: list[dict], out: str, settings: list[str]) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, len(settings), figsize=(3.2 * len(settings), 3.2), sharey=True,
                           squeeze=False)
  for axis, setting in zip(axes[0], settings):
    drawn = set()
    for family, points in series(rows, setting).items():
      widths, accuracies = zip(*points)
      axis.plot(widths, accuracies, marker="o", label=family)
      drawn.update(widths)
    axis.set_xscale("log", base=2)
    axis.set_xticks(sorted(drawn), [str(w) for w in sorted(drawn)])
    axis.set_title(f"{setting}" + (" (trained)" if setting == TRAINED else ""), fontsize=9)
    axis.set_xlabel("model width")
    axis.set_ylim(-0.02, 1.02)
  axes[0][0].set_ylabel("MQAR test accuracy")
  axes[0][-1].legend(fontsize=7, loc="lower right")
  fig.tight_layout()
  fig.savefig(out, dpi=120)
  print(f"wrote {out}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("rows", help="the study's JSONL (experiments/mqar/study.py --out)")
  parser.add_argument("--out", default="experiments/mqar/figure.png")
  parser.add_argument("--settings", default="", help="LxP,... (default: every test setting)")
  args = parser.parse_args()
  rows = read_lines(args.rows)
  if not rows:
    raise SystemExit(f"{args.rows}: no rows yet; run experiments/mqar/study.py first.")
  settings = args.settings.split(",") if args.settings else settings_of(rows)
  draw(rows, args.out, settings)


if __name__ == "__main__":
  main()
