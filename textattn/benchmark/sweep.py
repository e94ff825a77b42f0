"""The sweep (parent process): every point in its own subprocess, one after another, so its peak
memory is its own and an out-of-memory, a crash or a hang costs that point only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence

from textattn.benchmark import report

STATUSES = ("ok", "oom", "timeout", "error")
# The checkout (or install) root that holds the textattn package: on the child's path.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_point_in_subprocess(spec: dict, timeout_s: float) -> dict:
  """Runs one point in a fresh interpreter; always returns a row-shaped dict with a status.

  The child runs in this process's working directory with ROOT first on its PYTHONPATH, so the
  modules of spec["plugins"] import there as they do here."""
  with tempfile.TemporaryDirectory(prefix="textattn_benchmark_") as tmp:
    spec_path, result_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "result.json")
    with open(spec_path, "w") as f:
      json.dump(spec, f)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    command = [sys.executable, "-m", "textattn.benchmark", f"--point_spec={spec_path}",
               f"--point_result={result_path}"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env=env, start_new_session=True)
    timed_out = False
    try:
      output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      timed_out = True
      os.killpg(process.pid, 9)
      output, _ = process.communicate()
    except BaseException:  # Ctrl-C (its own session: the terminal's signal never reaches it)
      os.killpg(process.pid, 9)
      process.communicate()
      raise
    result = {}
    if os.path.exists(result_path):
      with open(result_path) as f:
        result = json.load(f)
  return _settle(result, process.returncode, output.decode(errors="replace"), timed_out,
                 timeout_s)


def _settle(result: dict, returncode: int, text: str, timed_out: bool, timeout_s: float) -> dict:
  """The point's final status from what the child recorded and how it ended."""
  if timed_out:
    result["status"] = "timeout"
    progress = result.get("message", "")
    result["message"] = (f"exceeded --point_timeout_s={timeout_s:g}"
                         + (f" ({progress})" if progress else ""))
  elif returncode != 0 and result.get("status") != "oom":
    # Died without recording its end: killed (the kernel's OOM killer sends SIGKILL) or crashed.
    lines = [line for line in text.splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    oom = returncode == -9 or any(
        marker in text for marker in ("RESOURCE_EXHAUSTED", "Out of memory", "bad_alloc",
                                      "MemoryError"))
    result["status"] = "oom" if oom else "error"
    result["message"] = f"child exited with {returncode}: {last}"[:500]
  elif result.get("status") not in STATUSES:
    result["status"] = "error"
    result["message"] = "child recorded no result"
  return result


def run_sweep(specs: Sequence[dict], *, timeout_s: float, out_dir: str, command: str) -> list[dict]:
  """Runs every point in its own subprocess, one after another; writes and returns the rows."""
  os.makedirs(out_dir, exist_ok=True)
  rows = []
  print(report.table_header(), flush=True)
  for spec in specs:
    load = os.getloadavg()[0]
    result = run_point_in_subprocess(spec, timeout_s)
    row = {column: "" for column in report.COLUMNS}
    # Requested warm-up/repeats first; a measured point's result says what it did.
    row.update({k: v for k, v in spec.items() if k in report.COLUMNS})
    row.update({k: v for k, v in result.items() if k in report.COLUMNS and v is not None})
    row["load_1m"] = round(load, 2)
    rows.append(row)
    print(report.table_line(row), flush=True)
    # Kept up to date as points finish.
    report.write_csv(rows, os.path.join(out_dir, "results.csv"))
  first = specs[0] if specs else {}
  sweep_settings = (f"requested warm-up {first.get('warmup')} + {first.get('repeats')} timed "
                    f"calls, time budget {first.get('time_budget_s', 0):g} s, timeout "
                    f"{timeout_s:g} s, memory limit {first.get('memory_limit_gb', 0):g} GiB (CPU) "
                    f"per point; 'calls' = warm-up + timed calls made")
  report.write_markdown(rows, os.path.join(out_dir, "results.md"), command, sweep_settings)
  report.write_plots(rows, out_dir)
  return rows
