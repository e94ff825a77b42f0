"""Every script under experiments/gpu/ rehearses on this CPU (REHEARSE=1: JAX_PLATFORMS=cpu, toy
sizes, Pallas in interpret mode, long steps checked for their wiring only; setup.sh and
rehearse.py), so a renamed module, flag, config field or variant, or a missing file, fails here
instead of on the next lent GPU.

All scripts start at once (module fixture); accelerators.sh, which lowers every autotune
configuration at full size and runs each part's kernels for real at toy sizes (the layer
benchmark planned with --dry_run), takes 40-60 s, the rest seconds. Scripts run here rather than
on the GPU machine (LOCAL: prepare_peer.sh downloads a wheel) are not rehearsed.
"""

import csv
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
GPU = ROOT / "experiments" / "gpu"
LOCAL = ("prepare_peer.sh",)  # run on this machine before a GPU call, not on the GPU
SCRIPTS = sorted(p.name for p in GPU.glob("*.sh") if p.name not in ("setup.sh",) + LOCAL)
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


def _csv(path):
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def test_the_accelerator_script_runs_every_part_at_toy_sizes(rehearsals):
  from textattn.attention import lowering
  returncode, stdout, stderr, out = rehearsals("accelerators.sh")
  assert returncode == 0, (stdout + stderr)[-3000:]
  parts = [line.split()[1].rstrip(":") for line in stdout.splitlines() if line.startswith("== ")]
  assert parts == ["lowering", "numerics", "bandwidth", "tune", "peer", "layers"], parts
  # 0. Every autotune configuration of every GPU kernel lowers for CUDA at the 16K shape.
  lowered = (out / "lowering.log").read_text()
  for name, kernel in lowering.KERNELS.items():
    for config in kernel.configs:
      assert f"ok     {name:34s} bfloat16  {config.label()} [" in lowered, (name, config)
  assert "FAILED" not in lowered
  # 2. The additive core, XLA and Pallas (interpret mode), with bytes by formula; the flags of
  # one other command-buffer setting tried, the others listed.
  bandwidth = _csv(out / "kernels" / "bandwidth.csv")
  timed = {(row["kernel"], row["command_buffers"]) for row in bandwidth if row["status"] == "ok"}
  assert timed == {("additive_pallas (XLA reference)", "default"), ("additive_pallas", "default")}
  assert all(float(row["core_bytes"]) > 0 and float(row["tbps"]) > 0
             for row in bandwidth if row["status"] == "ok")
  settings = {row["command_buffers"]: row["status"] for row in bandwidth if not row["config"]
              and row["batch"] == "0"}
  assert settings == {"off": "flags_ok", "custom_call": "planned", "legacy_triton": "planned"}
  # 3. Each GPU kernel's first configuration timed, with its shared-memory estimate; the first
  # kernel's compared with its XLA reference (bfloat16 on both sides).
  tune = _csv(out / "kernels" / "tune.csv")
  tuned = {row["kernel"]: row for row in tune if row["config"]}
  assert set(tuned) == {n for n, k in lowering.KERNELS.items() if k.configs}
  for row in tuned.values():
    assert row["status"] == "ok" and int(row["estimate_bytes"]) > 0, row
  assert float(tuned["additive_pallas"]["rel_err"]) < 3e-2
  # 5. The layer benchmark, planned.
  planned = {line.split()[1] for line in (out / "layers.log").read_text().splitlines()
             if line.startswith("point: ")}
  assert planned == {"softmax_auto", "additive", "additive_pallas"}


def test_every_file_in_the_gpu_folder_is_rehearsed():
  # A new script is rehearsed by the test above; a Python file must be run by one of them.
  scripts_text = "".join((GPU / name).read_text() for name in SCRIPTS + ["setup.sh"])
  for path in GPU.iterdir():
    if path.is_dir() or (path.suffix == ".sh" and path.name not in LOCAL) or path.name in HELPERS:
      continue
    called = (path.name in scripts_text
              or any(path.stem in p.read_text() for p in GPU.glob("*.py") if p != path))
    assert called, f"experiments/gpu/{path.name} is run by no script (so never rehearsed)"
