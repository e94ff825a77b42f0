"""Every script under experiments/gpu/ rehearses on this CPU (REHEARSE=1: JAX_PLATFORMS=cpu, toy
sizes, Pallas in interpret mode, long steps checked for their wiring only; setup.sh and
rehearse.py), so a renamed module, flag, config field or variant, or a missing file, fails here
instead of on the next lent GPU.

All scripts start at once (module fixture); accelerators.sh, which runs one group of benchmark points
for real at toy sizes (the others planned with --dry_run), takes about 40 s, the rest seconds.
"""

import csv
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
GPU = ROOT / "experiments" / "gpu"
SCRIPTS = sorted(p.name for p in GPU.glob("*.sh") if p.name != "setup.sh")
HELPERS = ("setup.sh", "rehearse.py")  # sourced / called by every script


@pytest.fixture(scope="module")
def rehearsals(tmp_path_factory):
  started = {}
  for script in SCRIPTS:
    out = tmp_path_factory.mktemp(script.replace(".", "_"))
    # PYTHON: the scripts run this interpreter, not whatever python3 is first on PATH (an
    # unactivated venv's suite would otherwise rehearse with another environment).
    env = dict(os.environ, REHEARSE="1", OUT=str(out), JAX_PLATFORMS="cpu",
               PYTHON=sys.executable)
    started[script] = (subprocess.Popen(["bash", str(GPU / script)], cwd=ROOT, env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True), out)
  finished = {}

  def finish(script):
    if script not in finished:
      process, out = started[script]
      stdout, stderr = process.communicate(timeout=400)
      finished[script] = (process.returncode, stdout, stderr, out)
    return finished[script]

  yield finish
  for process, _ in started.values():
    if process.poll() is None:
      process.kill()
      process.communicate()


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_gpu_script_rehearses_on_the_cpu(rehearsals, script):
  returncode, stdout, stderr, out = rehearsals(script)
  assert returncode == 0, (stdout + stderr)[-3000:]
  summary = [line for line in stdout.splitlines() if line.startswith("rehearsal: ")][-1]
  assert summary.endswith(f"0 failed (OUT={out})"), summary
  assert "rehearsal (no GPU): nvidia-smi" in stdout  # the stand-in, not a GPU's


def test_the_accelerator_script_runs_every_kernel_at_toy_sizes(rehearsals):
  returncode, stdout, stderr, out = rehearsals("accelerators.sh")
  assert returncode == 0, (stdout + stderr)[-3000:]
  rows = []
  for results in sorted(out.glob("*/results.csv")):
    with open(results, newline="") as f:
      rows += list(csv.DictReader(f))
  # (Group 4 measures; the others are planned with --dry_run, every point named in its log.)
  assert {row["variant"] for row in rows} == {
      "causal_additive_recurrent", "causal_additive_recurrent_chunked",
      "causal_additive_recurrent_pallas"}
  planned = {line.split()[1] for log in out.glob("*.log") for line in log.read_text().splitlines()
             if line.startswith("point: ")}
  assert planned >= {"softmax_auto", "additive_auto", "additive", "additive_pallas",
                     "causal_linear_recurrent", "sliding_window_chunked", "performer"}
  for row in rows:
    assert row["status"] == "ok", row
    if row["max_abs_diff"] and row["dtype"] == "float32":  # (bfloat16: rounding differs)
      assert float(row["max_abs_diff"]) < 1e-4, row  # interpret-mode Pallas, chunked: = XLA
  assert {row["kernel"] for row in rows} >= {"pallas", "chunked", "scan"}


def test_every_file_in_the_gpu_folder_is_rehearsed():
  # A new script is rehearsed by the test above; a Python file must be run by one of them.
  scripts_text = "".join((GPU / name).read_text() for name in SCRIPTS + ["setup.sh"])
  for path in GPU.iterdir():
    if path.is_dir() or path.suffix == ".sh" or path.name in HELPERS:
      continue
    called = (path.name in scripts_text
              or any(path.stem in p.read_text() for p in GPU.glob("*.py") if p != path))
    assert called, f"experiments/gpu/{path.name} is run by no script (so never rehearsed)"
