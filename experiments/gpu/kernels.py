"""The kernels of textattn/attention/lowering.py's table (KERNELS) on a lent GPU: the additive
core's bandwidth, and every kernel's autotune configurations (experiments/gpu/accelerators.sh,
parts 2 and 3).

  python experiments/gpu/kernels.py bandwidth OUT_DIR [--rehearse]
  python experiments/gpu/kernels.py tune OUT_DIR [--rehearse]

bandwidth: the additive core alone (no projections), forward and backward in bfloat16, XLA
against the fused Pallas kernel at its default configuration, at batch 16 and 4, 16K and 4K
tokens (4 heads of 64), most important first; the Pallas rows under XLA's default command
buffers and with command buffers off, and at batch 4 and 16K also with CUSTOM_CALL commands
added and with jax#27988's flag that put Pallas' Triton calls in (COMMAND_BUFFERS: measured, not
assumed; jaxlib 0.10.2's XLA no longer knows that flag and refuses it, a row then says so).
Bytes are counted by formula (the kernel's `core_bytes`: 11 passes of [batch, length, 256] for a forward
and backward), so a row's TB/s is what the maths must move over the time taken, against the
device's bandwidth (textattn/benchmark/utilization.py PEAKS; 4.8 TB/s on an H200). At batch 4
and 16K the core moves ~370 MB: ~0.08 ms at full H200 bandwidth, where launch overheads show.

tune: each kernel of the table with autotune configurations, every configuration (at most four)
at [4, 16384, 4, 64] in bfloat16 against the kernel's XLA reference (timed first): the
shared-memory estimate (pallas_gpu.py), compile time, median time, and the largest relative
error of the output and gradients against the reference, each tensor against its own scale
(bfloat16 on both sides: a few 1e-3 is rounding).

Each point is timed in a child process (`points`): jax.jit of value_and_grad of sum(output^2)
(what a training step runs), compiled at most COMPILE_CAP_S (a point past it is recorded as
such and the next one starts in a fresh process: a compile cannot be interrupted), 2 warm-up
calls, median of 10. Results: OUT_DIR/{bandwidth,tune}.csv and .md, one line per point as it
finishes. --rehearse (a CPU; tests/test_gpu_scripts.py through accelerators.sh): toy sizes,
Pallas in interpret mode, one configuration per kernel, caps x4 (a shared CPU).
"""

from __future__ import annotations

import csv
import functools
import json
import os
import queue
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

from textattn.attention import lowering, pallas_gpu
from textattn.benchmark import utilization

COMPILE_CAP_S = 30.0
# Besides the compile: process start (JAX, CUDA) for a child's first point, and the timed calls.
START_S, RUN_S = 40.0, 20.0
# XLA_FLAGS of each command-buffer setting a point runs under, in the order they run (one
# group of processes each: a refused flag fails in a second, so it goes before the last).
COMMAND_BUFFERS = {
    "default": "",
    "off": "--xla_gpu_enable_command_buffer=",
    "legacy_triton": "--legacy_command_buffer_custom_call_targets=__gpu$xla.gpu.triton",
    "custom_call": "--xla_gpu_enable_command_buffer=+CUSTOM_CALL",
}
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIELDS = ("kernel", "config", "dtype", "batch", "length", "heads", "head_dim", "command_buffers",
          "status", "estimate_bytes", "compile_s", "median_ms", "core_bytes", "tbps",
          "pct_of_bandwidth", "rel_err", "device", "message")


def bandwidth_points(rehearse: bool) -> list[dict]:
  """(shape, the command-buffer settings of its Pallas rows), most important first."""
  if rehearse:  # (the other settings' flags are checked apart: `check_flags`)
    shape = (2, 40, 1, 8)
    return [_point("additive_pallas", None, shape, reference=True),
            _point("additive_pallas", None, shape)]
  plan = [((16, 16384, 4, 64), ("default", "off")), ((4, 16384, 4, 64), tuple(COMMAND_BUFFERS)),
          ((16, 4096, 4, 64), ("default",)), ((4, 4096, 4, 64), ("default", "off"))]
  points = []
  for shape, settings in plan:
    points.append(_point("additive_pallas", None, shape, reference=True))
    points += [_point("additive_pallas", None, shape, command_buffers=setting)
               for setting in settings]
  return points


def tune_points(rehearse: bool) -> list[dict]:
  """Per GPU kernel with configurations: its XLA reference, then each configuration compared
  with it. A rehearsal: the first configuration of each, the reference and the comparison for
  the first kernel only (the causal scan's compile alone takes 15-25 s on a CPU)."""
  shape = (2, 40, 1, 8) if rehearse else (4, 16384, 4, 64)
  points = []
  for name, kernel in lowering.KERNELS.items():
    if not kernel.configs or kernel.platform != "cuda":
      continue
    compare = not rehearse or not points
    if compare:
      points.append(_point(name, None, shape, reference=True))
    for config in kernel.configs[:1] if rehearse else kernel.configs:
      points.append(_point(name, tuple(config), shape, compare=compare))
  return points


def _point(kernel, config, shape, reference=False, command_buffers="default", compare=False):
  batch, length, heads, head_dim = shape
  return {"kernel": kernel, "config": config, "dtype": "bfloat16", "batch": batch,
          "length": length, "heads": heads, "head_dim": head_dim, "reference": reference,
          "command_buffers": command_buffers, "compare": compare}


def label(point: dict) -> str:
  what = (f"{point['kernel']}'s XLA reference" if point["reference"]
          else f"{point['kernel']} " + (f"config {point['config']}" if point["config"]
                                        else "default"))
  return (f"{what}, {point['dtype']} [{point['batch']}, {point['length']}, {point['heads']}, "
          f"{point['head_dim']}]" + (f", command buffers {point['command_buffers']}"
                                 if point["command_buffers"] != "default" else ""))


# ---- the child: one process, a list of points, a JSON line per point -------------------------

def run_points(points: list[dict]) -> None:
  device = jax.devices()[0]
  references = {}  # (kernel, dtype, shape) -> the XLA reference's loss and gradients
  for index, point in enumerate(points):
    print(json.dumps({"event": "started", "index": index}), flush=True)
    kernel = lowering.KERNELS[point["kernel"]]
    dtype = jnp.dtype(point["dtype"])
    shape = (point["batch"], point["length"], point["heads"], point["head_dim"])
    features = point["heads"] * point["head_dim"]
    config = pallas_gpu.TritonConfig(*point["config"]) if point["config"] else None
    result = {"index": index, "device": device.device_kind}
    if config is not None and kernel.shared_memory is not None:
      result["estimate_bytes"] = kernel.shared_memory(config, features, dtype.itemsize,
                                                      point["heads"])
    try:
      args = kernel.inputs(dtype, *shape)
      key = (point["kernel"], point["dtype"], shape)
      if point["compare"] and key not in references:  # (its compile is not the kernel's)
        print(json.dumps({"event": "reference", "index": index}), flush=True)
        references[key] = jax.jit(lowering.forward_backward(kernel.reference,
                                                            kernel.argnums))(*args)
      print(json.dumps({"event": "compiling", "index": index}), flush=True)
      function = (kernel.reference if point["reference"]
                  else functools.partial(kernel.run, config=config))
      step = jax.jit(lowering.forward_backward(function, kernel.argnums))
      start = time.perf_counter()
      compiled = step.lower(*args).compile()
      result["compile_s"] = time.perf_counter() - start
      print(json.dumps({"event": "compiled", "index": index}), flush=True)
      out = jax.block_until_ready(compiled(*args))  # (2 warm-up calls)
      if point["reference"]:
        references[key] = out
      jax.block_until_ready(compiled(*args))
      times = []
      for _ in range(2 if device.platform == "cpu" else 10):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
      result["median_ms"] = float(np.median(times)) * 1e3
      if kernel.core_bytes is not None:
        result["core_bytes"] = kernel.core_bytes(point["batch"], point["length"], features,
                                                 dtype.itemsize)
        result["tbps"] = result["core_bytes"] / (result["median_ms"] / 1e3) / 1e12
        peak = utilization.device_peak(device.device_kind, point["dtype"])[1]
        if peak:
          result["pct_of_bandwidth"] = 100.0 * result["tbps"] / peak
      if point["compare"]:
        result["rel_err"] = _relative_error(out, references[key])
      result["status"] = "ok"
    except Exception as error:  # noqa: BLE001 -- a point's failure is its result
      result["status"] = "refused" if "shared memory" in str(error).lower() else "error"
      result["message"] = " ".join(f"{type(error).__name__}: {error}".split())[:300]
    print(json.dumps({"event": "done", **result}), flush=True)


def _relative_error(got, want) -> float:
  errors = []
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
    errors.append(float(np.max(np.abs(g - w)) / max(float(np.max(np.abs(w))), 1e-30)))
  return max(errors)


# ---- the parent: children under a watchdog, results in OUT_DIR --------------------------------

def _child_env(command_buffers: str) -> dict:
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + COMMAND_BUFFERS[command_buffers]).strip()
  return env


def _read_lines(stream, lines: queue.Queue) -> None:
  for line in stream:
    lines.put(line)
  lines.put(None)


def run_group(points: list[dict], command_buffers: str, report, scale: float = 1.0) -> None:
  """Runs `points` in children with the same XLA flags, restarting after a point that runs
  past its cap; `report(point, result)` is called once per point. `scale` multiplies every
  cap (a rehearsal: a shared CPU compiles interpret-mode kernels slowly)."""
  cap, start_s, run_s = COMPILE_CAP_S * scale, START_S * scale, RUN_S * scale
  remaining = list(points)
  while remaining:
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "points",
                              json.dumps(remaining)], cwd=REPO, env=_child_env(command_buffers),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_read_lines, args=(child.stdout, lines), daemon=True).start()
    deadline = time.monotonic() + start_s + cap + run_s
    phase, done, tail = "starting", 0, []
    while True:
      try:
        line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
      except queue.Empty:
        child.kill()
        why = ({"compiling": f"compile over the {cap:.0f} s cap",
                "running": f"calls over {run_s:.0f} s"}.get(phase, f"no result ({phase})"))
        report(remaining[done], {"status": "timeout", "message": why})
        done += 1
        break
      if line is None:  # the child ended
        child.wait()
        if done < len(remaining):
          said = " | ".join(tail[-3:])
          status = "flag_refused" if "Unknown flag in XLA_FLAGS" in said else "error"
          report(remaining[done], {"status": status, "message": (
              f"the process ended (exit {child.returncode}): {said}")[:300]})
          done += 1
          if status == "flag_refused":  # (every point of this group would say the same)
            for point in remaining[done:]:
              report(point, {"status": status, "message": "as above"})
            done = len(remaining)
        break
      try:
        message = json.loads(line)
      except json.JSONDecodeError:
        tail.append(line.strip())
        continue
      if message["event"] in ("started", "reference"):  # (a first point's start: JAX, CUDA)
        phase = "starting" if message["event"] == "started" else "reference"
        deadline = time.monotonic() + cap + run_s + (start_s if message["index"] == 0 else 0)
      elif message["event"] == "compiling":
        phase, deadline = "compiling", time.monotonic() + cap
      elif message["event"] == "compiled":
        phase, deadline = "running", time.monotonic() + run_s
      else:
        report(remaining[done], message)
        done += 1
    remaining = remaining[done:]


def check_flags(setting: str) -> dict:
  """Whether this XLA takes a command-buffer setting's flags (a rehearsal's stand-in for its
  rows: an unknown flag ends a process at its backend's start; on a GPU such a row says
  "flag_refused", a result)."""
  child = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], cwd=REPO,
                         env=_child_env(setting), capture_output=True, text=True, timeout=60)
  if child.returncode == 0:
    return {"status": "flags_ok", "message": COMMAND_BUFFERS[setting] or "(none)"}
  said = " | ".join(child.stderr.strip().splitlines()[-2:])
  return {"status": "flag_refused" if "Unknown flag" in said else "error", "message": said[:300]}


def _cell(value) -> str:
  if isinstance(value, float):
    return f"{value:.3g}"
  return "" if value is None else str(value)


def measure(part: str, out_dir: str, rehearse: bool) -> int:
  points = bandwidth_points(rehearse) if part == "bandwidth" else tune_points(rehearse)
  os.makedirs(out_dir, exist_ok=True)
  rows = []

  def report(point, result):
    row = {**point, **result, "config": point["config"] and "x".join(map(str, point["config"]))}
    row["kernel"] = point["kernel"] + (" (XLA reference)" if point["reference"] else "")
    rows.append(row)
    print(f"{row.get('status', '?'):8s} {label(point):90s} "
          + " ".join(f"{key}={_cell(row.get(key))}" for key in (
              "estimate_bytes", "compile_s", "median_ms", "tbps", "pct_of_bandwidth", "rel_err")
                     if row.get(key) is not None)
          + (f"  {row['message'][:160]}" if row.get("message") else ""), flush=True)

  # One group of children per command-buffer setting (XLA_FLAGS are read at start), XLA's
  # default first; each group in order of importance.
  for command_buffers in COMMAND_BUFFERS:
    group = [p for p in points if p["command_buffers"] == command_buffers]
    if group:
      run_group(group, command_buffers, report, scale=4.0 if rehearse else 1.0)
    elif rehearse and part == "bandwidth":  # (one setting's flags tried: a process each)
      report(_point("additive_pallas", None, (0, 0, 0, 0), command_buffers=command_buffers),
             check_flags(command_buffers) if command_buffers == "off"
             else {"status": "planned", "message": COMMAND_BUFFERS[command_buffers]})
  with open(os.path.join(out_dir, f"{part}.csv"), "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
  with open(os.path.join(out_dir, f"{part}.md"), "w") as f:
    f.write("| " + " | ".join(FIELDS) + " |\n|" + "---|" * len(FIELDS) + "\n")
    for row in rows:
      f.write("| " + " | ".join(_cell(row.get(k)).replace("|", "/") for k in FIELDS) + " |\n")
  # A configuration refused (shared memory), past its compile cap or a flag this XLA does not
  # know is a result; an error is not.
  return 0 if rows and all(row.get("status") in ("ok", "refused", "timeout", "flag_refused",
                                                 "flags_ok", "planned") for row in rows) else 1


def main(argv: list[str]) -> int:
  if argv[:1] == ["points"]:
    run_points(json.loads(argv[1]))
    return 0
  if len(argv) < 2 or argv[0] not in ("bandwidth", "tune"):
    raise SystemExit(__doc__)
  return measure(argv[0], argv[1], "--rehearse" in argv)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
