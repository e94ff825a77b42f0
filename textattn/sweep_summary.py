"""A sweep's results summarised: per variant and seed, and paired against the base variant
(`python -m textattn.sweep summarize`; the paired difference over shared seeds, its sd, a 95%
t interval and the sign count)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os

import numpy as np

from textattn.errors import DataError, UsageError, one_line


def _records(path: str) -> list[tuple[int, dict]]:
  """(line number, record) per line of a sweep file; an unfinished last line (a sweep killed
  while writing it) is left out, any other line that is not a JSON object is a DataError."""
  try:
    with open(path, encoding="utf-8") as f:
      lines = f.read().split("\n")
  except (OSError, UnicodeDecodeError) as e:
    raise DataError(f"{path}: cannot be read as a sweep file ({one_line(e, 100)}).") from None
  records = []
  for number, line in enumerate(lines[:-1], 1):  # (the last piece: "" or unfinished)
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except ValueError:
      record = None
    if not isinstance(record, dict) or not {"variant", "seed"} <= set(record):
      raise DataError(f"{path}:{number}: not a sweep result line (a JSON object with its "
                      f"variant and seed); a sweep's --out holds only those.")
    records.append((number, record))
  return records


def finished_runs(path: str, variants: dict[str, dict]) -> dict[tuple[str, int], float]:
  """{(variant, seed): best validation} of the runs a sweep's --out already holds (a rerun of
  the sweep skips them), after cutting off an unfinished last line; a finished run of one of
  `variants` ({name: overrides}) written with other overrides is a DataError (the name would
  then mean two different runs). An --out that cannot be written is a DataError now, before
  hours of runs rather than after the first."""
  try:
    with open(path, "a+b") as f:
      f.seek(0)
      data = f.read()
  except OSError as e:
    raise DataError(f"--out={path}: cannot be written ({e.strerror}).") from None
  complete = data.rfind(b"\n") + 1
  if complete < len(data):
    with open(path, "r+b") as f:
      f.truncate(complete)
    print(f"{path}: cut off an unfinished last line (a sweep killed while writing it).")
  done = {}
  for number, r in _records(path):
    if "val_best" not in r:
      continue  # (an errored run: run again)
    name = r["variant"]
    if name in variants and r.get("overrides") != variants[name]:
      raise DataError(f"{path}:{number}: variant {name!r} ran with overrides "
                      f"{r.get('overrides')}, not {variants[name]}; give this sweep another "
                      f"--out, or its variant another name.")
    done[(name, r["seed"])] = r["val_best"]
  return done


def read_sweep_lines(paths: list[str]) -> dict[str, dict[int, float]]:
  """{variant: {seed: best validation}} over sweep files; a (variant, seed) twice is an error."""
  table: dict[str, dict[int, float]] = {}
  for path in paths:
    if not os.path.isfile(path):
      raise DataError(f"{path}: no such sweep file; give the --out file(s) of a sweep.")
    for number, r in _records(path):
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
    seeds = parse_seeds(args.seeds, "--seeds") if args.seeds else None
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


def best_of(curve: list[tuple[int, float]], higher_is_better: bool) -> tuple[int, float]:
  """(step, value) of a validation curve's best, the one the checkpoint manager keeps and a run
  reports from: of tied values the latest step."""
  pick = max if higher_is_better else min
  return pick(reversed(curve), key=lambda c: c[1])


def parse_seeds(text: str, flag: str) -> list[int]:
  """"0,1,2", "0-4" or both ("0-2,7") -> the seeds; anything else is a UsageError."""
  seeds = []
  for part in (p.strip() for p in str(text).split(",")):
    lo, dash, hi = part.partition("-")
    if not (lo.isdigit() and (not dash or hi.isdigit()) and int(hi or lo) >= int(lo)):
      raise UsageError(f"{flag}={text} must be seeds as 0,1,2 or a range 0-4 (or both, "
                       f"0-2,7).")
    seeds += list(range(int(lo), int(hi or lo) + 1))
  return seeds


@contextlib.contextmanager
def held(path: str):
  """The sweep's hold on its --out for the whole sweep (an exclusive lock on PATH.lock): a
  second sweep on it would run the same runs again and write them twice."""
  if not path:
    yield
    return
  try:
    handle = open(path + ".lock", "a")  # noqa: SIM115 -- (closed by the with below)
  except OSError as e:
    raise DataError(f"--out={path}: cannot be written ({e.strerror}).") from None
  with handle:
    try:
      fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      raise UsageError(f"--out={path} is in use by another sweep running now; wait for it, or "
                       f"give this one another --out.") from None
    yield


def print_best(results: dict[str, list[float]]) -> None:
  print("\nvariant                  n  mean best val  (per seed)")
  for name, values in results.items():
    if values:
      print(f"{name:24s} {len(values)}  {np.mean(values):.4f}         "
            + " ".join(f"{v:.4f}" for v in values))
