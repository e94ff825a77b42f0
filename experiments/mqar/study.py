"""Issue 82's recall study: every causal attention family on Zoology's MQAR at widths 64 and 128
(and 256 for causal softmax and the two best recurrent families), the learning rate of each cell
the best of --lrs on the validation set, a figure as Zoology draws it (experiments/mqar/
figure.py: test accuracy against model width, a line per family).

Each run is `python -m textattn.main --config=configs/mqar.py` (two attention-only layers, one
head, vocabulary 8,192, training at 256 tokens x 32 pairs with easier settings mixed in, batch
64; docs/mqar.md) with the family (config.model.attention; rotary positions where the family
declares them, else none), the width (config.model.embed_dim), the learning rate, the seed,
--steps and --examples changed (validation examples, and test examples per setting: 250, a
quarter of the config's; at 1,000, compiling and evaluating were ~40% of a 400-step plan). A
finished run is one row of --out (JSONL) and is skipped when the study runs again, so an
interrupted study resumes where it stopped; several copies may run at once (each run is
claimed by a lock beside its workdir). `--only` runs a subset.

    python experiments/mqar/study.py --pilot --out=experiments/mqar/pilot.jsonl
    python experiments/mqar/study.py --estimate --steps=STEPS
    python experiments/mqar/study.py --steps=STEPS --out=experiments/mqar/study.jsonl
    python experiments/mqar/study.py --only=causal:128,causal_linear --out=...
    python experiments/mqar/study.py --summarize experiments/mqar/study.jsonl
    python experiments/mqar/figure.py experiments/mqar/study.jsonl

--pilot runs every (family, width) of the plan (--only: some) for --pilot_steps steps at the
first learning rate and records its seconds per step and its overhead (compilation and
evaluations); the study then prints, before it starts, the hours its plan takes at those speeds
(a width the pilot skipped is scaled as causal softmax's; --budget_hours: refused beyond it
unless --force; --estimate: print it and stop), so --steps is sized from a measurement. Width
256 (--wide=auto) is planned once every family has its width-128 rows: causal softmax and the
two recurrent families (all but the --quadratic ones) of best width-128 test accuracy at the
training setting; until then the estimate counts the two slowest recurrent ones.

Recorded per run: the family, width, position, learning rate, seed, steps, examples, the best
validation accuracy (what picks the learning rate), every test setting's accuracy
(test/<LxP>/accuracy) and their mean, seconds per training step (the median logged window
after the first), wall time, commit, CPU, date.
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from experiments.provenance import commit, cpu_name, read_lines  # noqa: E402
from textattn import attention  # noqa: E402 -- after the repository is on the path

CONFIG = "configs/mqar.py"
BASE = "causal"
TRAINED = "256x32"  # configs/mqar.py's training setting (test/<TRAINED>/accuracy)
QUADRATIC = ("causal", "causal_additive")  # every key scored per query: not recurrent


def causal_families() -> list[str]:
  return [name for name in attention.names() if attention.get(name).causal]


def position(family: str) -> str:
  return "rotary" if attention.get(family).rotary else "none"


def key(row: dict) -> tuple:
  return (row["family"], row["width"], row["lr"], row["seed"], row["steps"])


def run_one(family: str, width: int, lr: float, seed: int, steps: int, examples: int, runs: str,
            extra: list[str]) -> dict:
  """One textattn.main run; its row (or exit naming the failed run)."""
  name = f"{family}_w{width}_lr{lr:g}_s{seed}_{steps}"
  workdir = os.path.join(runs, name)
  evals = max(steps // 4, 1)
  command = [sys.executable, "-m", "textattn.main", f"--config={CONFIG}", f"--workdir={workdir}",
             f"--config.model.attention={family}", f"--config.model.position={position(family)}",
             f"--config.model.embed_dim={width}", f"--config.optimizer.learning_rate={lr}",
             f"--config.seed={seed}", f"--config.num_train_steps={steps}",
             f"--config.eval_every_steps={evals}", f"--config.checkpoint_every_steps={evals}",
             f"--config.log_every_steps={max(min(100, steps // 4), 1)}",
             f"--config.optimizer.warmup_steps={max(steps // 20, 1)}",
             f"--config.val_examples={examples}", f"--config.test_examples={examples}", *extra]
  started = time.perf_counter()
  done = subprocess.run(command, cwd=REPO, check=False)
  if done.returncode:
    raise SystemExit(f"{name}: textattn.main exited {done.returncode} (workdir {workdir}); fix "
                     f"it and run the study again.")
  wall = time.perf_counter() - started
  rows = read_lines(os.path.join(workdir, "metrics.jsonl"))
  speeds = [r["train/examples_per_sec"] for r in rows if "train/examples_per_sec" in r]
  with open(os.path.join(workdir, "config.json")) as f:
    batch = json.load(f)["batch_size"]
  tests = {k: v for k, v in rows[-1].items() if k.startswith("test/")}
  return {"family": family, "width": width, "position": position(family), "lr": lr,
          "seed": seed, "steps": steps, "examples": examples,
          "val_accuracy": max(r["val/accuracy"] for r in rows if "val/accuracy" in r),
          **tests,
          "s_per_step": batch / statistics.median(speeds[1:] or speeds) if speeds else None,
          "wall_s": round(wall, 1), "commit": commit(), "cpu": cpu_name(),
          "date": datetime.date.today().isoformat(), "workdir": workdir}


def chosen(rows: list[dict]) -> dict[tuple, dict]:
  """(family, width, seed) -> the run of the best validation accuracy among its learning rates
  (ties: the smaller learning rate)."""
  best: dict[tuple, dict] = {}
  for row in sorted(rows, key=lambda r: r["lr"]):
    cell = (row["family"], row["width"], row["seed"])
    if cell not in best or row["val_accuracy"] > best[cell]["val_accuracy"]:
      best[cell] = row
  return best


def wide_families(rows: list[dict], families: list[str], seeds: list[int],
                  lrs: list[float], quadratic: list[str]) -> list[str] | None:
  """Causal softmax and the two recurrent families of best width-128 test accuracy at the
  training setting (mean over seeds, each at its chosen learning rate); None until every
  family has all its width-128 rows."""
  done = {(r["family"], r["seed"], r["lr"]) for r in rows if r["width"] == 128}
  if any((f, s, lr) not in done for f in families for s in seeds for lr in lrs):
    return None
  picked = chosen([r for r in rows if r["width"] == 128])
  score = {f: statistics.mean(picked[(f, 128, s)][f"test/{TRAINED}/accuracy"] for s in seeds)
           for f in families if f not in quadratic}
  recurrent = sorted(score, key=lambda f: -score[f])[:2]
  return [f for f in families if f == BASE] + recurrent


def plan(args, rows: list[dict]) -> list[tuple]:
  """The runs (family, width, lr, seed) of the study, --only applied."""
  runs = [(f, w, lr, s) for s in args.seeds for f in args.families for w in args.widths
          for lr in args.lrs]
  if args.wide == "auto":
    wide = wide_families(rows, args.families, args.seeds, args.lrs, args.quadratic)
    if wide is None:
      print("Width 256 is planned once every family has its width-128 rows.", flush=True)
    else:
      runs += [(f, 256, lr, s) for s in args.seeds for f in wide for lr in args.lrs]
  if args.only:
    wanted = [tuple(part.split(":")) for part in args.only.split(",")]
    runs = [r for r in runs if any(
        w[0] == r[0] and (len(w) < 2 or int(w[1]) == r[1]) and
        (len(w) < 3 or float(w[2]) == r[2]) for w in wanted)]
  return runs


def run_seconds(row: dict, steps: int) -> float:
  """A pilot row's run time at `steps` steps: its seconds per step times the steps, plus what
  the pilot took beyond its own steps (compilation and the evaluations, which do not grow with
  the steps: four validation passes and the test sets either way)."""
  overhead = max(row["wall_s"] - row["steps"] * row["s_per_step"], 0.0)
  return steps * row["s_per_step"] + overhead


def estimate_hours(runs: list[tuple], steps: int, pilot: list[dict]) -> tuple[float, int] | None:
  """(hours of `runs` at the pilot's speeds, how many of them were extrapolated), or None when
  a family of the plan has no pilot row at all. A (family, width) the pilot did not measure is
  its family's time at a measured width times causal softmax's ratio between the two widths."""
  measured = {(r["family"], r["width"]): run_seconds(r, steps) for r in pilot}  # (the last)
  total, extrapolated = 0.0, 0
  for family, width, _, _ in runs:
    if (family, width) in measured:
      total += measured[(family, width)]
      continue
    known = [w for f, w in measured if f == family and (BASE, w) in measured]
    if not known or (BASE, width) not in measured:
      return None
    near = min(known, key=lambda w: abs(w - width))
    total += measured[(family, near)] * measured[(BASE, width)] / measured[(BASE, near)]
    extrapolated += 1
  return total / 3600, extrapolated


def wide_upper_bound(args, runs: list[tuple], pilot: list[dict], steps: int) -> list[tuple]:
  """The width-256 runs --wide=auto will add once width 128 is done, while it is not: causal
  softmax's and the two slowest recurrent families' (the estimate's upper bound)."""
  if args.wide != "auto" or args.only or any(r[1] == 256 for r in runs):
    return []
  recurrent = [f for f in args.families if f not in args.quadratic]
  def seconds(family):
    estimate = estimate_hours([(family, 256, 0, 0)], steps, pilot)
    return estimate[0] if estimate else 0.0
  slowest = sorted(recurrent, key=seconds)[-2:]
  wide = [f for f in args.families if f == BASE] + slowest
  return [(f, 256, lr, s) for s in args.seeds for f in wide for lr in args.lrs]


def summarize(path: str) -> str:
  rows = read_lines(path)
  picked = chosen(rows)
  settings = sorted({k.split("/")[1] for r in rows for k in r
                     if k.startswith("test/") and k.endswith("/accuracy") and k.count("/") == 2},
                    key=lambda s: tuple(int(x) for x in s.split("x")))
  header = "| family | width | position | lr (chosen) | seeds | val | " + " | ".join(
      settings) + " | mean |"
  lines = [header, "|" + "---|" * (7 + len(settings))]
  cells = sorted({(f, w) for f, w, _ in picked},
                 key=lambda c: (causal_order(c[0]), c[1]))
  for family, width in cells:
    mine = [picked[k] for k in picked if k[:2] == (family, width)]
    mean = lambda field: statistics.mean(r[field] for r in mine)  # noqa: B023
    lrs = ", ".join(format(r["lr"], "g") for r in mine)
    seeds = ", ".join(str(r["seed"]) for r in mine)
    accuracies = " | ".join(format(mean(f"test/{s}/accuracy"), ".3f") for s in settings)
    lines.append(f"| {family} | {width} | {mine[0]['position']} | {lrs} | {seeds} | "
                 f"{mean('val_accuracy'):.3f} | {accuracies} | {mean('test/accuracy'):.3f} |")
  return "\n".join(lines)


def causal_order(family: str) -> int:
  names = list(attention.names())
  return names.index(family) if family in names else len(names)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--families", default="", help="default: every causal variant registered")
  parser.add_argument("--widths", default="64,128")
  parser.add_argument("--wide", default="auto", choices=("auto", "none"),
                      help="auto: width 256 for softmax and the two best recurrent families")
  parser.add_argument("--quadratic", default=",".join(QUADRATIC),
                      help="families that are not recurrent (never among the two best)")
  parser.add_argument("--lrs", default="1e-3,3e-3,1e-2")
  parser.add_argument("--seeds", default="0")
  parser.add_argument("--steps", type=int, default=400)
  parser.add_argument("--only", default="", help="FAMILY[:WIDTH[:LR]],... : a subset")
  parser.add_argument("--examples", type=int, default=250,
                      help="validation examples, and test examples per setting, of each run")
  parser.add_argument("--runs", default="runs/mqar_study", help="where the workdirs go")
  parser.add_argument("--out", default="experiments/mqar/study.jsonl")
  parser.add_argument("--pilot", action="store_true",
                      help="measure each (family, width) for --pilot_steps steps into --out")
  parser.add_argument("--pilot_steps", type=int, default=32)
  parser.add_argument("--pilot_file", default="experiments/mqar/pilot.jsonl",
                      help="the pilot's rows, for the estimate")
  parser.add_argument("--budget_hours", type=float, default=6.0)
  parser.add_argument("--force", action="store_true", help="run beyond --budget_hours")
  parser.add_argument("--estimate", action="store_true", help="print the estimate and stop")
  parser.add_argument("--summarize", metavar="JSONL", help="print the table of a study and stop")
  args, extra = parser.parse_known_args()  # (extra: more --config.FIELD=VALUE for every run)
  if args.summarize:
    print(summarize(args.summarize))
    return
  args.families = args.families.split(",") if args.families else causal_families()
  unknown = sorted(set(args.families) - set(causal_families()))
  if unknown:
    raise SystemExit(f"--families: {', '.join(unknown)} is not a causal variant; allowed: "
                     f"{', '.join(causal_families())}.")
  args.widths = [int(w) for w in args.widths.split(",")]
  args.lrs = [float(lr) for lr in args.lrs.split(",")]
  args.seeds = [int(s) for s in args.seeds.split(",")]
  args.quadratic = args.quadratic.split(",")
  steps = args.steps
  if args.pilot:  # each (family, width) once, at the first learning rate and seed
    args.lrs, args.seeds, args.wide, steps = args.lrs[:1], args.seeds[:1], "none", args.pilot_steps
    args.widths = sorted(set(args.widths) | {256})
  os.makedirs(args.runs, exist_ok=True)
  runs = plan(args, read_lines(args.out))
  if not args.pilot:
    todo = [r for r in runs if (*r[:2], r[2], r[3], steps) not in
            {key(row) for row in read_lines(args.out)}]
    pilot = [r for r in read_lines(args.pilot_file) if r.get("examples") == args.examples]
    todo += wide_upper_bound(args, runs, pilot, steps)
    estimate = estimate_hours(todo, steps, pilot)
    hours = estimate[0] if estimate else None
    print(f"{len(todo)} runs to do, {steps} steps each: "
          + (f"about {hours:.1f} hours at the pilot's speeds ({estimate[1]} runs' widths "
             f"extrapolated)." if estimate
             else f"no estimate ({args.pilot_file} lacks a family of the plan at "
                  f"--examples={args.examples})."), flush=True)
    if args.estimate:
      return
    if hours is not None and hours > args.budget_hours and not args.force:
      raise SystemExit(f"The plan takes about {hours:.1f} hours, over --budget_hours="
                       f"{args.budget_hours:g}; lower --steps or run a subset with --only "
                       f"(or --force).")
  for family, width, lr, seed in runs:
    # The record file is read again before each run (another copy may have finished it).
    if (family, width, lr, seed, steps) in {key(r) for r in read_lines(args.out)}:
      continue
    claim_path = os.path.join(args.runs, f"{family}_w{width}_lr{lr:g}_s{seed}_{steps}.claim")
    claim = open(claim_path, "w")  # noqa: SIM115 -- held for the run
    try:
      fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      claim.close()
      continue
    with claim:
      record = run_one(family, width, lr, seed, steps, args.examples, args.runs, extra)
      with open(args.out, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)
  if not args.pilot and read_lines(args.out):
    print(summarize(args.out))


if __name__ == "__main__":
  main()
