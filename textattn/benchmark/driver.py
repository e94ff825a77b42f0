"""What `python -m textattn.benchmark` does once its flags are parsed (cli.py): plan the points
and run the sweep (the parent), or, with --point_spec, measure the one point (the child).

cli.py imports this module only inside main, so `--help` never loads the attention registry,
the models or JAX.
"""

from __future__ import annotations

import json
import os
import sys
import time

import ml_collections

from textattn import attention, defaults, models
from textattn.benchmark import measure, plan, report, sweep
from textattn.errors import UsageError, user_errors


def _check_out_dir(out_dir: str, overwrite: bool) -> None:
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise UsageError(f"--out_dir={out_dir} exists and is not a directory; give a new "
                     f"or an existing directory.")
  existing = [name for name in report.OUTPUTS if os.path.exists(os.path.join(out_dir, name))]
  if existing and not overwrite:
    raise UsageError(f"--out_dir={out_dir} already holds results ({', '.join(existing)}); "
                     f"give a new --out_dir, or --overwrite to replace them.")


def _plan(flag: dict, config, mode: str) -> list[dict]:
  """The points the flags ask for; UsageError (one sentence) for any bad flag or config."""
  attention.load_plugins(flag["plugin"])  # before any variant name is looked up
  if flag["warmup"] < 0 or flag["repeats"] < 1:
    raise UsageError(f"--warmup={flag['warmup']} must be >= 0 and --repeats={flag['repeats']} "
                     ">= 1.")
  given = {name: flag[name] for name in ("variants", "seq_lens", "batch_size", "embed_dim",
                                         "num_heads", "num_layers", "dtype", "vocab_size")}
  mesh = plan.parse_mesh(flag["mesh"])
  settings = plan.resolve_settings(config, mode, given, mesh)
  injections = plan.parse_injections(flag["inject_failure"])
  specs = plan.plan_points(
      config, settings, mode, warmup=flag["warmup"], repeats=flag["repeats"],
      time_budget_s=flag["point_time_budget_s"], memory_limit_gb=flag["point_memory_limit_gb"],
      check_against_reference=flag["check_against_reference"], seed=flag["seed"],
      num_classes=flag["num_classes"], injections=injections, lengths=flag["lengths"],
      plugins=tuple(flag["plugin"]), profile_dir=flag["profile_dir"], mesh=mesh)
  for spec in specs:  # the config errors a point would hit, once, before any point runs
    models.validate_model_config(ml_collections.ConfigDict(json.loads(spec["config"])))
  return specs


def _print_train_step_summary(rows: list[dict]) -> None:
  for row in rows:
    if row["status"] == "ok":
      print(f"train_step {row['variant']} L={row['seq_len']} batch={row['batch_size']} "
            f"{row['dtype']} lengths={row['lengths']}: {row['examples_per_s']:,.1f} "
            f"examples/s (median "
            f"{row['median_ms']:.2f} ms/step, p90 {row['p90_ms']:.2f} ms; compile "
            f"{row['compile_s']:.1f} s, not included)")
    else:
      print(f"train_step {row['variant']} L={row['seq_len']}: {row['status']} "
            f"({row['message']})")


def main(flag: dict, argv: list[str]) -> None:
  """`flag`: every flag's value by name (cli.py's); `argv`: the command line, for the report."""
  if flag["point_spec"]:
    with open(flag["point_spec"]) as f:
      measure.run_point(json.load(f), flag["point_result"])
    return
  config = defaults.complete(flag["config"] if flag["config"] is not None
                             else defaults.classification())  # (with every opt-in part)
  mode = flag["mode"]
  out_dir = flag["out_dir"] or os.path.join(
      "runs", "benchmark", time.strftime("%Y%m%d-%H%M%S", time.gmtime()))
  with user_errors():  # every bad flag or config value: one line, exit 2 (UsageError)
    plan.check_limits(point_timeout_s=flag["point_timeout_s"],
                      point_time_budget_s=flag["point_time_budget_s"],
                      point_memory_limit_gb=flag["point_memory_limit_gb"],
                      num_classes=flag["num_classes"])
    _check_out_dir(out_dir, flag["overwrite"])
    specs = _plan(flag, config, mode)
  if flag["dry_run"]:
    for spec in specs:
      print(f"point: {spec['variant']} L={spec['seq_len']} implementation="
            f"{spec['implementation']} dtype={spec['dtype']}")
    print(f"--dry_run: {len(specs)} points planned, none run.")
    return

  command = "python -m textattn.benchmark " + " ".join(argv[1:])
  try:
    rows = sweep.run_sweep(specs, timeout_s=flag["point_timeout_s"], out_dir=out_dir,
                           command=command)
  except KeyboardInterrupt as error:  # (the running point's process was killed with it)
    print(f"interrupted: the points finished before are in "
          f"{os.path.join(out_dir, 'results.csv')}.", file=sys.stderr)
    sys.exit(getattr(error, "exit_code", 130))
  if mode == "train_step":
    _print_train_step_summary(rows)
  print("Wrote " + ", ".join(os.path.join(out_dir, name) for name in report.OUTPUTS))
