"""Issue 54's comparison: every causal variant as a byte-level language model of IMDB reviews at
one budget, judged on test bits per byte, paired with causal softmax by seed.

Each run is `python -m textattn.main --config=configs/imdb_lm_<variant>.py` (imdb_lm_bytes.py for
causal softmax: 2 layers, embed 128, 4 heads, 256-byte packed rows, batch 32) shortened to
--steps (evaluation and a checkpoint at half and at the end, warm-up a tenth), without the
Kneser-Ney reference (the references are computed once: the test bytes are the same for every
run). A finished run is recorded once in --out and skipped when the study is run again, so an
interrupted study resumes where it stopped.

    TFDS_DATA_DIR=../shared/tensorflow_datasets python experiments/language_model/compare.py \
        --steps=300 --seeds=0,1,2 --out=experiments/language_model/compare_300.jsonl
    python experiments/language_model/compare.py --summarize experiments/language_model/compare_300.jsonl

Recorded per run: test and last validation bits per byte, training tokens/s (the median of the
logged windows after the first, which holds the compilation), wall time, commit, CPU, date.

`--study=imdb_classification`: the bidirectional families as IMDB classifiers at
configs/imdb_softmax.py's recipe (full 3 epochs, `--steps` ignored), `--config.model.attention=`
each variant, test accuracy paired with softmax by seed (RESULTS section 30):

    TFDS_DATA_DIR=../shared/tensorflow_datasets python experiments/language_model/compare.py \
        --study=imdb_classification --seeds=0,1,2
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

VARIANTS = ("causal", "causal_additive", "causal_additive_recurrent", "causal_linear",
            "sliding_window", "causal_performer", "retnet", "gla", "mamba2", "deltanet",
            "gated_deltanet")
BASE = "causal"
CLASSIFIERS = ("softmax", "linear", "local", "performer")


def config_path(variant: str) -> str:
  return "configs/imdb_lm_bytes.py" if variant == BASE else f"configs/imdb_lm_{variant}.py"


def run_main(command: list[str], variant: str, seed: int, workdir: str) -> float:
  """Runs one textattn.main command; its wall time in seconds, or exit naming the failed run."""
  started = time.perf_counter()
  done = subprocess.run(command, cwd=REPO, check=False)
  if done.returncode:
    raise SystemExit(f"{variant} seed {seed}: textattn.main exited {done.returncode} "
                     f"(workdir {workdir}); fix it and run the study again.")
  return time.perf_counter() - started


def run_classifier(variant: str, seed: int, runs: str) -> dict:
  """One IMDB classifier at imdb_softmax.py's recipe with only the attention changed."""
  workdir = os.path.join(runs, f"imdb_{variant}_s{seed}")
  command = [sys.executable, "-m", "textattn.main", "--config=configs/imdb_softmax.py",
             f"--workdir={workdir}", f"--config.seed={seed}", f"--config.model.attention={variant}"]
  wall = run_main(command, variant, seed, workdir)
  rows = read_lines(os.path.join(workdir, "metrics.jsonl"))
  train = [r["train/examples_per_sec"] for r in rows if "train/examples_per_sec" in r]
  val = [r["val/accuracy"] for r in rows if "val/accuracy" in r]
  return {"variant": variant, "seed": seed, "steps": 0, "test_accuracy": rows[-1]["test/accuracy"],
          "val_best": max(val) if val else None,
          "examples_per_s": statistics.median(train[1:] or train) if train else None,
          "wall_s": round(wall, 1), "commit": commit(), "cpu": cpu_name(),
          "date": datetime.date.today().isoformat(), "workdir": workdir}


def run_one(variant: str, seed: int, steps: int, runs: str) -> dict:
  workdir = os.path.join(runs, f"{variant}_s{seed}_{steps}")
  half = max(steps // 2, 1)
  command = [sys.executable, "-m", "textattn.main", f"--config={config_path(variant)}",
             f"--workdir={workdir}", f"--config.seed={seed}",
             f"--config.num_train_steps={steps}", f"--config.eval_every_steps={half}",
             f"--config.checkpoint_every_steps={half}",
             f"--config.optimizer.warmup_steps={max(steps // 10, 1)}", "--config.kn_order=0"]
  wall = run_main(command, variant, seed, workdir)
  with open(os.path.join(workdir, "lm_report.json")) as f:
    report = json.load(f)
  rows = read_lines(os.path.join(workdir, "metrics.jsonl"))
  train = [r["train/examples_per_sec"] for r in rows if "train/examples_per_sec" in r]
  val = [r["val/bits_per_byte"] for r in rows if "val/bits_per_byte" in r]
  with open(os.path.join(workdir, "config.json")) as f:
    max_len = json.load(f)["max_len"]
  return {"variant": variant, "seed": seed, "steps": steps,
          "test_bits_per_byte": report["rows"][0]["bits_per_byte"],
          "val_bits_per_byte": val[-1] if val else None,
          "xz_bits_per_byte": report["rows"][1]["bits_per_byte"],
          "tokens_per_s": statistics.median(train[1:] or train) * max_len if train else None,
          "wall_s": round(wall, 1), "commit": commit(), "cpu": cpu_name(),
          "date": datetime.date.today().isoformat(), "workdir": workdir}


def summarize(path: str) -> str:
  from textattn.sweep_summary import paired_summary
  records = read_lines(path)
  lm = "test_bits_per_byte" in records[0]
  metric, speed_key = (("test_bits_per_byte", "tokens_per_s") if lm
                       else ("test_accuracy", "examples_per_s"))
  variants, base = (VARIANTS, BASE) if lm else (CLASSIFIERS, "softmax")
  scale, digits = (1.0, 3) if lm else (100.0, 2)  # (accuracy in percent)
  table: dict[str, dict[int, float]] = {}
  for r in records:
    table.setdefault(r["variant"], {})[r["seed"]] = r[metric] * scale
  header = (f"| variant | seeds | {metric} (mean +- sd) | - {base}, paired (95% CI) "
            f"| {speed_key} | wall s |")
  lines = [header, "|---|---|---|---|---|---|"]
  for variant in [v for v in variants if v in table]:
    mine = [r for r in records if r["variant"] == variant]
    values = [r[metric] * scale for r in mine]
    sd = statistics.stdev(values) if len(values) > 1 else float("nan")
    paired = ""
    if variant != base and base in table:
      p = paired_summary(table, base, variant)
      if p["ci95"]:
        paired = (f"{p['mean_diff']:+.{digits}f} [{p['ci95'][0]:+.{digits}f}, "
                  f"{p['ci95'][1]:+.{digits}f}] (n={p['n']})")
    speed = statistics.mean(r[speed_key] for r in mine)
    wall = statistics.mean(r["wall_s"] for r in mine)
    lines.append(f"| {variant} | {','.join(str(r['seed']) for r in mine)} | "
                 f"{statistics.mean(values):.{digits}f} +- {sd:.{digits}f} | {paired} | "
                 f"{speed:,.0f} | "
                 f"{wall:.0f} |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--study", default="lm", choices=("lm", "imdb_classification"))
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--variants", default="", help="default: all of the study's")
  parser.add_argument("--runs", default="runs/lm_compare", help="where the workdirs go")
  parser.add_argument("--out", default="")
  parser.add_argument("--summarize", metavar="JSONL", help="print the table of a study and stop")
  args = parser.parse_args()
  if args.summarize:
    print(summarize(args.summarize))
    return
  lm = args.study == "lm"
  allowed = VARIANTS if lm else CLASSIFIERS
  steps = args.steps if lm else 0
  out = args.out or (f"experiments/language_model/compare_{steps}.jsonl" if lm
                     else "experiments/language_model/imdb_classification.jsonl")
  variants = args.variants.split(",") if args.variants else list(allowed)
  unknown = sorted(set(variants) - set(allowed))
  if unknown:
    raise SystemExit(f"--variants: {', '.join(unknown)} unknown; allowed: {', '.join(allowed)}.")
  os.makedirs(args.runs, exist_ok=True)
  for seed in (int(s) for s in args.seeds.split(",")):  # seed-major: pairs complete early
    for variant in variants:
      # Several copies of the study may run at once (one a core, `taskset -c N`): each run is
      # claimed by an exclusive lock on a file beside its workdir (released if a copy dies),
      # and the record file is read again before each run.
      done = ({(r["variant"], r["seed"], r["steps"]) for r in read_lines(out)}
              if os.path.exists(out) else set())
      if (variant, seed, steps) in done:
        continue
      claim = open(os.path.join(args.runs, f"{variant}_s{seed}_{steps}.claim"), "w")  # noqa: SIM115
      try:
        fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        claim.close()
        continue
      with claim:
        record = (run_one(variant, seed, steps, args.runs) if lm
                  else run_classifier(variant, seed, args.runs))
        with open(out, "a") as f:
          f.write(json.dumps(record) + "\n")
      print(json.dumps(record), flush=True)
  print(summarize(out))


if __name__ == "__main__":
  main()
