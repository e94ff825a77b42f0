"""One point, in its own subprocess: build the timed function (builders.py), compile it, time
it, and record its memory, FLOPs and (optionally) its difference from the reference
implementation.

The result, partial progress included, is written as JSON to the path the parent gave, so a
point that is killed (timeout, out of memory) still reports how far it got.
"""

from __future__ import annotations

import json
import os
import resource
import time

import jax
import ml_collections
import numpy as np

from textattn import attention as attention_lib
from textattn import models, sharding
from textattn import platform as platform_lib
from textattn.attention import ring
from textattn.benchmark import builders, collectives, layer_cost, utilization


def _vm_size_bytes() -> int:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmSize:"):
        return int(line.split()[1]) * 1024
  return 0


def _memory_situation() -> str:
  """Which memory ran out: this process's address-space cap, or the machine's."""
  cap = resource.getrlimit(resource.RLIMIT_AS)[0]
  available = "?"
  with open("/proc/meminfo") as f:
    for line in f:
      if line.startswith("MemAvailable:"):
        available = f"{int(line.split()[1]) / 2**20:.1f}"
  cap = "none" if cap == resource.RLIM_INFINITY else f"{cap / 2**30:.1f} GiB"
  return (f"address space {_vm_size_bytes() / 2**30:.1f} GiB of cap {cap}; machine "
          f"MemAvailable {available} GiB")


# RESOURCE_EXHAUSTED also names a kernel's on-chip limits (Triton's shared memory, Mosaic's
# VMEM): a tiling that does not fit the chip is a kernel error, not the point out of memory.
ON_CHIP_LIMITS = ("Shared memory size limit", "shared memory", "VMEM", "vmem")


def _is_oom(error: BaseException) -> bool:
  text = f"{type(error).__name__}: {error}"
  if any(marker in text for marker in ON_CHIP_LIMITS):
    return False
  return isinstance(error, MemoryError) or any(
      marker in text for marker in ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory",
                                    "bad_alloc", "Cannot allocate memory"))


# The rings' layouts (textattn/attention/sequence.py), whose blocks per device a --mesh row counts.
RING_LAYOUTS = {"softmax": None, "causal": "zigzag"}


def mesh_fields(spec: dict, config, compiled) -> dict:
  """A --mesh point's communication and load balance: collective bytes of the timed program
  (comm_step_bytes); of one attention layer's forward + backward at the point's sizes, compiled
  apart (textattn/benchmark/layer_cost.py), and its stated formula (comm_layer_bytes,
  comm_formula_bytes; collectives.py); for a ring, the chunk-blocks each device of the
  sequence axis computes in the forward pass (the backward follows the same schedule), from the
  ring's schedule, which depends on S and the layout only (run at length 2S)."""
  mesh = builders.point_mesh(spec)
  shards = builders.mesh_shape(spec)[1]
  m = config.model
  layer = layer_cost.layer_cost(spec["attention"], mesh, spec["batch_size"], spec["seq_len"],
                                m.embed_dim, m.num_heads, m.dtype)
  fields = {"comm_step_bytes": sum(collectives.collective_bytes(compiled.as_text(),
                                                                shards).values()),
            "comm_layer_bytes": layer["comm_total"], "comm_formula_bytes": layer["comm_formula"]}
  if spec["attention"] in RING_LAYOUTS and sharding.sequence_size(mesh) > 1:
    counts = ring.ring_block_counts(mesh, RING_LAYOUTS[spec["attention"]], batch=1,
                                    length=2 * shards)
    fields["ring_blocks"] = "/".join(str(int(c)) for c in counts)
  return fields


def _memory_fields(compiled) -> dict:
  analysis = compiled.memory_analysis()
  if analysis is None:
    return {}
  fields = {"argument_bytes": int(analysis.argument_size_in_bytes),
            "output_bytes": int(analysis.output_size_in_bytes),
            "temp_bytes": int(analysis.temp_size_in_bytes),
            "alias_bytes": int(analysis.alias_size_in_bytes)}
  fields["footprint_bytes"] = (fields["argument_bytes"] + fields["output_bytes"]
                               + fields["temp_bytes"] - fields["alias_bytes"])
  return fields


def _cost(compiled, name: str) -> float | None:
  """One figure of XLA's cost analysis ("flops", "bytes accessed"), or None."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):  # older JAX: one dict per computation
    cost = cost[0] if cost else None
  if not cost or name not in cost:
    return None
  return float(cost[name])


def _utilization(spec: dict, config, args, device, result: dict) -> dict:
  """Kernel label, attention TFLOP/s, bandwidth and (train_step) MFU against the device's peak
  (textattn/benchmark/utilization.py states the formulas)."""
  m = config.model
  variant = attention_lib.get(spec["attention"])
  implementation = result.get("implementation") or spec["implementation"]
  heads, head_dim = m.num_heads, m.embed_dim // m.num_heads
  fields = {"kernel": dict(variant.kernels).get(implementation, implementation)}
  flop_count = utilization.attention_flops(variant.forward_flops, spec["mode"], spec["batch_size"],
                                           spec["seq_len"], heads, head_dim)
  model_flops = None
  if spec["mode"] == "train_step":
    # The attention term as a share of softmax's 4 L^2 H d (1; causal 0.5; a windowed or hybrid
    # variant its keys per query over L), at this point's sizes.
    length = spec["seq_len"]
    factor = (variant.forward_flops(1, length, heads, head_dim)
              / (4.0 * length * length * heads * head_dim) if variant.forward_flops else 0.0)
    # Embedding tables are looked up, not multiplied: PaLM's N counts the other parameters.
    parameters = models.count_parameters(
        {k: v for k, v in args[0].params.items() if k != "embedding"})
    model_flops = spec["batch_size"] * spec["seq_len"] * utilization.model_flops_per_token(
        parameters, m.num_layers, spec["seq_len"], m.embed_dim, factor)
  peak_tflops, peak_tbps = peak(device, m.dtype, len(jax.tree.leaves(args)[0].sharding.device_set))
  formula_bytes = utilization.core_bytes(variant.core_bytes, spec["mode"], spec["batch_size"],
                                         spec["seq_len"], heads, head_dim,
                                         np.dtype(models.DTYPES[m.dtype]).itemsize)
  fields.update(utilization.derived(result, attention_flop_count=flop_count,
                                    bytes_accessed=result.get("bytes_accessed"),
                                    model_flops=model_flops, peak_tflops=peak_tflops,
                                    peak_tbps=peak_tbps, formula_bytes=formula_bytes))
  return fields


def peak(device, dtype: str, devices_used: int) -> tuple[float | None, float | None]:
  """(peak TFLOP/s, peak TB/s) of what the point runs on: on a CPU the matmul peak measured
  on one device, which already uses every core (its devices, when several, share them); on
  an accelerator one device's datasheet peak times the devices the point's arrays span (a
  train step's batch, a mesh row)."""
  if device.platform == "cpu":
    return utilization.measured_cpu_peak(), None
  tflops, tbps = utilization.device_peak(device.device_kind, dtype)
  return (tflops * devices_used if tflops else tflops), (tbps * devices_used if tbps else tbps)


def _max_abs_diff(a, b) -> float:
  diffs = [float(np.max(np.abs(np.asarray(x, np.float32) - np.asarray(y, np.float32))))
           for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)) if np.size(x)]
  return max(diffs) if diffs else 0.0


def run_point(spec: dict, result_path: str) -> None:
  """Measure one point; the result (also partial progress) is written as JSON to result_path."""
  result = {"status": "error", "message": "started"}

  def save():
    tmp = result_path + ".tmp"
    with open(tmp, "w") as f:
      json.dump(result, f)
    os.replace(tmp, result_path)

  save()
  try:
    _measure(spec, result, save)
  except BaseException as error:  # noqa: BLE001 -- recorded, not raised: the parent reads it
    result["status"] = "oom" if _is_oom(error) else "error"
    message = " ".join(f"{type(error).__name__}: {error}".split())[:400]
    if result["status"] == "oom":
      message += f" [{_memory_situation()}]"
    result["message"] = message
  result.setdefault("rss_peak_bytes", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
  save()


def _measure(spec: dict, result: dict, save) -> None:
  config = ml_collections.ConfigDict(json.loads(spec["config"]))
  builders.request_mesh_devices(spec)
  if spec["mode"] == "train_step":
    platform_lib.request_cpu_devices(config)  # before any JAX operation
  attention_lib.load_plugins(spec.get("plugins", ()))  # before the point is built
  compiled, args, memory_limit, device = _compile(spec, config, result, save)
  if compiled is None:  # over the memory limit: not run
    return
  args = _time_calls(spec, compiled, args, device, result, save)
  try:  # The timing stands ("ok"): a failure after it (the profile, the reference, e.g. a
    # naive reference out of memory where the point's own kernel fits) is said, not its status.
    if spec.get("profile_dir"):
      args = _profile_calls(spec, compiled, args)
    result.update(_utilization(spec, config, args, device, result))
    save()
    if (spec["check_against_reference"]
        and spec["implementation"] != attention_lib.get(spec["attention"]).reference
        and spec["mode"] not in ("train_step", "decode_step")):
      result["message"] = _check_against_reference(spec, config, compiled, args, memory_limit,
                                                    result)
  except Exception as error:  # noqa: BLE001 -- recorded in the row's message
    what = "out of memory" if _is_oom(error) else f"{type(error).__name__}: {error}"
    result["message"] = " ".join(f"timed; what followed failed ({what})".split())[:400]


def _compile(spec: dict, config, result: dict, save):
  """Builds and compiles the point; records its platform, compile time, memory and FLOPs.
  Returns (compiled, args, memory_limit, device); compiled is None when the footprint exceeds
  the memory limit (the point is then recorded as "oom")."""
  device = jax.devices()[0]
  platform = device.platform
  result["platform"] = f"{platform}:{device.device_kind}" + (
      f" x{jax.device_count()}" if jax.device_count() > 1 else "")
  memory_limit = int(spec["memory_limit_gb"] * 2**30) if platform == "cpu" else 0

  injected = spec.get("inject")
  if injected == "error":
    raise RuntimeError("injected failure (--inject_failure)")
  if injected == "timeout":
    time.sleep(10 * 24 * 3600)
  start = time.perf_counter()
  function, args = builders.build(spec, config)
  if spec["implementation"] == "auto":  # what it resolved to, at this point's length
    result["implementation"] = models.resolved_kernel(config)
  jax.block_until_ready(args)
  result["setup_s"] = time.perf_counter() - start
  start = time.perf_counter()
  compiled = function.lower(*args).compile()
  result["compile_s"] = time.perf_counter() - start
  memory = _memory_fields(compiled)
  result.update({k: v for k, v in memory.items() if k != "footprint_bytes"})
  result["flops"] = _cost(compiled, "flops")
  result["bytes_accessed"] = _cost(compiled, "bytes accessed")
  if platform == "cpu":
    result["peak_bytes"] = memory.get("footprint_bytes")
    result["peak_source"] = "memory_analysis"
  if spec.get("mesh"):
    result.update(mesh_fields(spec, config, compiled))
  result["message"] = "compiled"
  save()
  if memory_limit and memory.get("footprint_bytes", 0) > memory_limit:
    result["status"] = "oom"
    result["message"] = (f"compiled footprint {memory['footprint_bytes'] / 2**30:.2f} GiB "
                         f"(memory_analysis) exceeds --point_memory_limit_gb="
                         f"{spec['memory_limit_gb']:g}; not run")
    return None, args, memory_limit, device
  if memory_limit:
    # A backstop for what the analysis misses: from here on the process may grow by the limit.
    # (The compiler's own memory is not the point's footprint, so the cap comes after it.)
    cap = _vm_size_bytes() + memory_limit
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
  if injected == "oom":
    if memory_limit:  # beyond the address-space cap: MemoryError at once, nothing touched
      np.empty(memory_limit + 2**30, np.uint8)
    raise MemoryError("injected failure (--inject_failure)")
  return compiled, args, memory_limit, device


def _time_calls(spec: dict, compiled, args, device, result: dict, save):
  """--warmup then --repeats synchronised calls (within --point_time_budget_s); records the
  times, rates and peak memory. Returns the arguments of the next call."""
  def timed_call(args):
    start = time.perf_counter()
    out = compiled(*args)
    jax.block_until_ready(out)
    return next_arguments(spec["mode"], args, out), time.perf_counter() - start

  budget_s = spec["time_budget_s"]
  calls_start = time.perf_counter()

  def over_budget():
    return budget_s > 0 and time.perf_counter() - calls_start >= budget_s

  warmup_times, times, note = [], [], ""
  for _ in range(spec["warmup"]):
    if over_budget():
      break
    args, seconds = timed_call(args)
    warmup_times.append(seconds)
  for i in range(spec["repeats"]):
    if over_budget():
      if not times:
        # The warm-up alone used the budget: a step this long is timed once, by its last
        # warm-up call (a first call's one-off costs are small next to such a step).
        times.append(warmup_times.pop())
        note = (f"--point_time_budget_s={budget_s:g} used up by the warm-up: its last call "
                f"is the one timed call")
      break
    args, seconds = timed_call(args)
    times.append(seconds)
    result["message"] = f"{i + 1} of {spec['repeats']} timed calls done"
    if i == 0 or seconds > 5:
      save()  # a timeout later still reports what was reached
  times_ms = np.asarray(times) * 1e3
  median_s = float(np.median(times))
  result.update(median_ms=float(np.median(times_ms)), p90_ms=float(np.percentile(times_ms, 90)),
                min_ms=float(np.min(times_ms)),
                first_call_ms=1e3 * (warmup_times or times)[0],
                # A decoding step makes one token per row, whatever the cache length.
                tokens_per_s=spec["batch_size"] * (1 if spec["mode"] == "decode_step"
                                                   else spec["seq_len"]) / median_s,
                examples_per_s=spec["batch_size"] / median_s,
                warmup=len(warmup_times), repeats=len(times))
  if device.platform != "cpu":
    stats = device.memory_stats() or {}
    if "peak_bytes_in_use" in stats:
      result["peak_bytes"] = int(stats["peak_bytes_in_use"])
      result["peak_source"] = "memory_stats"
  result["rss_peak_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  result["status"], result["message"] = "ok", note
  save()
  return args


PROFILED_STEPS = 10


def _profile_calls(spec: dict, compiled, args):
  """PROFILED_STEPS more calls under jax.profiler.trace, each a step named 'benchmark_step' (so
  the profile viewer splits them), after the timed ones (tracing slows the calls it sees).
  Returns the arguments of the next call."""
  with jax.profiler.trace(spec["profile_dir"], create_perfetto_trace=True):
    for step in range(PROFILED_STEPS):
      with jax.profiler.StepTraceAnnotation("benchmark_step", step_num=step):
        out = jax.block_until_ready(compiled(*args))
      args = next_arguments(spec["mode"], args, out)
  return args


def next_arguments(mode: str, args: tuple, out) -> tuple:
  """The next call's arguments: train_step donates the state (its output's first), and
  decode_step the cache (its output's second), so the next call takes the new one."""
  if mode == "train_step":
    return (out[0],) + tuple(args[1:])
  if mode == "decode_step":
    return (args[0], out[1]) + tuple(args[2:])
  return args


def _check_against_reference(spec, config, compiled, args, memory_limit, result) -> str:
  """Compares with the attention's reference implementation; returns the message to record
  (empty when compared)."""
  reference_implementation = attention_lib.get(spec["attention"]).reference
  reference, reference_args = builders.build(spec, config, implementation=reference_implementation)
  reference = reference.lower(*reference_args).compile()
  footprint = _memory_fields(reference).get("footprint_bytes", 0)
  if memory_limit and footprint > memory_limit:
    return (f"reference not compared: its footprint {footprint / 2**30:.2f} GiB exceeds the "
            f"memory limit")
  result["max_abs_diff"] = _max_abs_diff(compiled(*args), jax.block_until_ready(reference(*args)))
  return ""
