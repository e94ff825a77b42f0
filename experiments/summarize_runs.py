"""The table of experiments/imdb_baselines.sh: per group of workdirs (names NAME_sSEED), the
parameter count, mean wall time, test accuracy mean +- sd (sample sd) over the seeds, then
McNemar's exact test between neighbours in that order, on their seed-0 test predictions. With
--paired=GROUP, a column with each group's difference from GROUP paired by seed (paired-t 95%
interval over the seeds both have) and, for runs with an attention transfer stage, its mean
seconds (the whole run's are the wall column, from RUNS/times.tsv where the script wrote one).

    python experiments/summarize_runs.py RUNS [--paired=softmax]
"""

import collections
import itertools
import json
import os
import pathlib
import re
import sys

import numpy as np

from textattn import compare
from textattn.sweep_summary import paired_summary


def test_accuracy(workdir):
  ensemble = os.path.join(workdir, "ensemble.json")
  if os.path.exists(ensemble):
    with open(ensemble) as f:
      return json.load(f)["test_accuracy"]
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return [r for r in rows if "test/params_from_step" in r][-1]["test/accuracy"]


def parameters(workdir):
  if os.path.exists(os.path.join(workdir, "ensemble.json")):
    with open(os.path.join(workdir, "ensemble.json")) as f:
      return sum(parameters(m["workdir"]) for m in json.load(f)["members"])
  import jax

  import textattn
  from textattn.models import baselines
  params = textattn.load(workdir).params  # (trained ones: a bag model's fixed weights left out)
  return int(sum(np.prod(p.shape) for path, p in jax.tree_util.tree_flatten_with_path(params)[0]
                 if not baselines.is_frozen(path)))


def stage_seconds(workdir):
  """The attention transfer stage's seconds (its curve's last row), or None."""
  path = pathlib.Path(workdir, "attention_transfer.jsonl")
  if not path.exists():
    return None
  rows = [json.loads(line) for line in path.read_text().splitlines()]
  return rows[-1].get("attention_transfer/seconds") if rows else None


def main(runs, paired=None):
  groups = collections.defaultdict(dict)
  for name in sorted(os.listdir(runs)):
    match = re.fullmatch(r"(.+)_s(\d+)", name)
    if match and os.path.isdir(os.path.join(runs, name)):
      try:
        groups[match[1]][int(match[2])] = (os.path.join(runs, name),
                                           test_accuracy(os.path.join(runs, name)))
      except (OSError, IndexError, KeyError):
        print(f"(skipped {name}: no test report)", file=sys.stderr)
  times = collections.defaultdict(list)
  if os.path.exists(os.path.join(runs, "times.tsv")):
    for line in pathlib.Path(runs, "times.tsv").read_text().splitlines():
      name, seconds = line.split()
      times[re.sub(r"_s\d+$", "", name)].append(float(seconds))
  order = sorted(groups, key=lambda g: np.mean([a for _, a in groups[g].values()]))
  table = {g: {seed: 100 * a for seed, (_, a) in r.items()} for g, r in groups.items()}
  extra = f" − {paired}, paired (95% CI) | transfer stage s (mean) |" if paired else ""
  print(f"| model | params | train + test wall s (mean) | test accuracy % | seeds |{extra}")
  print("| --- | --- | --- | --- | --- |" + (" --- | --- |" if paired else ""))
  for group in order:
    runs_of = groups[group]
    accuracies = 100 * np.array([a for _, a in runs_of.values()])
    accuracy = (f"{accuracies.mean():.2f} ± {accuracies.std(ddof=1):.2f}" if len(accuracies) > 1
                else f"{accuracies[0]:.2f}")  # (one seed: no spread to state)
    first = runs_of[min(runs_of)][0]
    wall = f"{np.mean(times[group]):.0f}" if times[group] else "-"
    cells = ""
    if paired:
      p = paired_summary(table, paired, group) if group != paired else None
      stages = [t for t in (stage_seconds(w) for w, _ in runs_of.values()) if t is not None]
      cells = (" – |" if not p else " – (no shared seed) |" if p["n"] == 0
               else f" {p['mean_diff']:+.2f} (n=1) |" if p["n"] == 1 else
               f" {p['mean_diff']:+.2f} [{p['ci95'][0]:+.2f}, {p['ci95'][1]:+.2f}] (n={p['n']}) |")
      cells += f" {np.mean(stages):.0f} |" if stages else " – |"
    print(f"| {group} | {parameters(first):,} | {wall} | {accuracy} | "
          f"{','.join(map(str, sorted(runs_of)))} |{cells}")
  print("\nMcNemar, seed-0 test predictions, neighbours in the order above:")
  for a, b in itertools.pairwise(order):
    if 0 not in groups[a] or 0 not in groups[b]:
      continue
    la, pa = compare.load_predictions(groups[a][0][0])
    lb, pb = compare.load_predictions(groups[b][0][0])
    r = compare.compare(la, pa, lb, pb)
    print(f"{a} -> {b}: {100 * r.difference:+.2f} points (95% CI {100 * r.ci95[0]:+.2f} to "
          f"{100 * r.ci95[1]:+.2f}); only {a} right {r.only_a_right}, only {b} right "
          f"{r.only_b_right}; McNemar p = {r.mcnemar_p:.3g}")


if __name__ == "__main__":
  flags = [a for a in sys.argv[1:] if a.startswith("--paired=")]
  places = [a for a in sys.argv[1:] if not a.startswith("--paired=")]
  if len(places) != 1 or any(p.startswith("--") for p in places):
    raise SystemExit("usage: python experiments/summarize_runs.py RUNS [--paired=GROUP]")
  main(places[0], flags[0].split("=", 1)[1] if flags else None)
