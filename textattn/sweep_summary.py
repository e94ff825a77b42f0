"""A sweep's results summarised: per variant and seed, and paired against the base variant
(`python -m textattn.sweep summarize`; the paired difference over shared seeds, its sd, a 95%
t interval and the sign count)."""

from __future__ import annotations

import json
import os

import numpy as np

from textattn.errors import DataError


def read_sweep_lines(paths: list[str]) -> dict[str, dict[int, float]]:
  """{variant: {seed: best validation}} over sweep files; a (variant, seed) twice is an error."""
  table: dict[str, dict[int, float]] = {}
  for path in paths:
    if not os.path.isfile(path):
      raise DataError(f"{path}: no such sweep file; give the --out file(s) of a sweep.")
    with open(path) as f:
      for number, line in enumerate(f, 1):
        r = json.loads(line)
        if "val_best" not in r:
          continue
        seeds = table.setdefault(r["variant"], {})
        if r["seed"] in seeds:
          raise SystemExit(f"{path}:{number}: variant {r['variant']!r} seed {r['seed']} appears "
                           "twice in the sweep files; each run may be counted once.")
        seeds[r["seed"]] = r["val_best"]
  return table


def paired_summary(table: dict[str, dict[int, float]], base: str, other: str,
                   seeds: list[int] | None = None) -> dict:
  """Mean best validation of two variants over the same seeds, and their paired difference.

  Only seeds present on both sides are paired; `missing` lists wanted seeds absent on either.
  The interval is the paired-t 95% interval over seeds (the seed-to-seed spread, not the
  validation sample's)."""
  from scipy import stats  # (a gensim dependency; only the summary needs it)
  for name in (base, other):
    if name not in table:
      raise SystemExit(f"no finished runs of variant {name!r}; the files have "
                       f"{sorted(table) or 'none'}.")
  wanted = seeds if seeds is not None else sorted(set(table[base]) | set(table[other]))
  both = [s for s in wanted if s in table[base] and s in table[other]]
  missing = {name: [s for s in wanted if s not in table[name]] for name in (base, other)}
  a = np.array([table[base][s] for s in both])
  b = np.array([table[other][s] for s in both])
  d = b - a
  n = len(both)
  sd = float(np.std(d, ddof=1)) if n > 1 else float("nan")
  se = sd / np.sqrt(n) if n > 1 else float("nan")
  half = float(stats.t.ppf(0.975, n - 1)) * se if n > 1 else float("nan")
  return {"n": n, "seeds": both, "missing": missing,
          "mean_" + base: float(a.mean()) if n else float("nan"),
          "mean_" + other: float(b.mean()) if n else float("nan"),
          "mean_diff": float(d.mean()) if n else float("nan"), "sd_diff": sd, "se_diff": se,
          "ci95": (float(d.mean()) - half, float(d.mean()) + half) if n > 1 else None,
          "other_better": int((d > 0).sum()), "base_better": int((d < 0).sum()),
          "ties": int((d == 0).sum())}


def summarize(args) -> None:
  """Mean (and per-seed) best validation accuracy per variant over one or more sweep files;
  with --paired=BASE,OTHER also their paired difference over the seeds both have."""
  for path in args.files:  # Each file on its own: different sweeps reuse variant names.
    print(f"{path}:")
    for name, values in read_sweep_lines([path]).items():
      accs = [values[s] for s in sorted(values)]
      print(f"  {name:20s} n={len(accs)}  mean {np.mean(accs):.4f}  seeds {min(values)}-"
            f"{max(values)}  " + " ".join(f"{v:.4f}" for v in accs))
  if args.paired:  # Pooled over the files given (e.g. a CPU and a GPU half of one sweep).
    table = read_sweep_lines(args.files)
    names = args.paired.split(",")
    if len(names) != 2:
      raise SystemExit(f"--paired takes two variant names, BASE,OTHER; got {args.paired!r}.")
    seeds = None
    if args.seeds:
      lo, _, hi = args.seeds.partition("-")
      seeds = list(range(int(lo), int(hi or lo) + 1))
    r = paired_summary(table, names[0], names[1], seeds)
    base, other = names
    print(f"\npaired over {r['n']} seeds: {base} {r['mean_' + base]:.5f}, {other} "
          f"{r['mean_' + other]:.5f}; {other} - {base} = {r['mean_diff']:+.5f} "
          f"(SD {r['sd_diff']:.5f}, SE {r['se_diff']:.5f}, 95% CI "
          + (f"[{r['ci95'][0]:+.5f}, {r['ci95'][1]:+.5f}]" if r["ci95"] else "n/a")
          + f"); {other} higher on {r['other_better']}, {base} on {r['base_better']}, "
          f"ties {r['ties']}")
    for name, absent in r["missing"].items():
      if absent:
        print(f"missing {name}: seeds {absent}")
