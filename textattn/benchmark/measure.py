"""One point, in its own subprocess: build the timed function, compile it, time it, and record
its memory, FLOPs and (optionally) its difference from the reference implementation.

The result, partial progress included, is written as JSON to the path the parent gave, so a
point that is killed (timeout, out of memory) still reports how far it got.
"""

from __future__ import annotations

import json
import os
import resource
import time

from textattn.errors import UsageError


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


def _is_oom(error: BaseException) -> bool:
  text = f"{type(error).__name__}: {error}"
  return isinstance(error, MemoryError) or any(
      marker in text for marker in ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory",
                                    "bad_alloc", "Cannot allocate memory"))


def _random_inputs(spec: dict, seq_len: int, batch_size: int):
  import numpy as np
  rng = np.random.default_rng(spec["seed"])
  lengths = rng.integers(seq_len // 2 if seq_len > 1 else 1, seq_len + 1, batch_size)
  lengths[0] = seq_len  # the full length is always exercised
  if spec.get("lengths", "half_to_full") == "full":
    lengths[:] = seq_len
  padding_mask = np.arange(seq_len)[None, :] < lengths[:, None]
  tokens = np.where(padding_mask, rng.integers(1, max(spec["vocab_size"], 2),
                                               (batch_size, seq_len)), 0).astype(np.int32)
  labels = rng.integers(0, spec["num_classes"], batch_size).astype(np.int32)
  return rng, padding_mask, tokens, labels


def _build_attention(config, rng, padding_mask, key, short, backward=False, mesh=None):
  """The attention layer alone; with a `mesh` its sequence-sharded module (sequence.build) on
  inputs split along (data, sequence), parameters replicated, and the cotangent an argument
  split like x (captured, it would be a constant whole on every device)."""
  import jax
  import jax.numpy as jnp

  from textattn import attention as attention_lib
  from textattn import models, sharding
  from textattn.attention import sequence

  models.validate_model_config(config)
  m = config.model
  dtype = models.DTYPES[m.dtype]
  # "auto" resolved for this point's length (not the short init's): models.resolved_kernel.
  module = sequence.build(attention_lib.get(m.attention), mesh, num_heads=m.num_heads,
                          implementation=models.resolved_kernel(config), dtype=dtype)
  batch_size, seq_len = padding_mask.shape
  x = jnp.asarray(rng.standard_normal((batch_size, seq_len, m.embed_dim)), dtype)
  mask = jnp.asarray(padding_mask)
  params = jax.jit(module.init)(key, x[:1, :short], mask[:1, :short])["params"]
  if mesh is not None:
    params = jax.device_put(params, jax.NamedSharding(mesh, jax.P()))
    x = jax.device_put(x, sharding.length_sharding(mesh, 3))
    mask = jax.device_put(mask, sharding.length_sharding(mesh, 2))
  if backward:  # gradients of the parameters and the input, for a fixed random cotangent
    cotangent = jnp.asarray(rng.standard_normal(x.shape), dtype)

    def loss(p, x, mask, cotangent):
      return jnp.sum((module.apply({"params": p}, x, mask) * cotangent).astype(jnp.float32))

    gradient = jax.value_and_grad(loss, argnums=(0, 1))
    if mesh is not None:
      cotangent = jax.device_put(cotangent, sharding.length_sharding(mesh, 3))
      return jax.jit(gradient), (params, x, mask, cotangent)
    return jax.jit(lambda p, x, mask: gradient(p, x, mask, cotangent)), (params, x, mask)
  return jax.jit(lambda p, x, mask: module.apply({"params": p}, x, mask)), (params, x, mask)


def _build_decode_step(config, rng, key, short):
  """One decoding step of the causal layer at the last position of a cache of max_len
  positions: (params, cache, x_t, mask_t) -> (output, cache). The same call each repeat."""
  import jax
  import jax.numpy as jnp

  from textattn import attention as attention_lib
  from textattn import models

  m = config.model
  dtype = models.DTYPES[m.dtype]
  module = attention_lib.get(m.attention).build(
      num_heads=m.num_heads, implementation=models.resolved_kernel(config), dtype=dtype)
  batch_size, seq_len = config.batch_size, config.max_len
  x = jnp.asarray(rng.standard_normal((batch_size, seq_len, m.embed_dim)), dtype)
  mask = jnp.ones((batch_size, seq_len), bool)
  params = jax.jit(module.init)(key, x[:, :short], mask[:, :short])["params"]
  _, variables = jax.jit(lambda p: module.apply({"params": p}, x, mask, decode=True,
                                                mutable=["cache"]))(params)
  # Positions 0..L-2 are (as good as) cached: the step timed is position L-1.
  cache = jax.tree_util.tree_map_with_path(
      lambda path, leaf: jnp.asarray(seq_len - 1, leaf.dtype)
      if getattr(path[-1], "key", None) == "index" else leaf, variables["cache"])
  step = jax.jit(lambda p, c, x_t, m_t: module.apply({"params": p, "cache": c}, x_t, m_t,
                                                     decode=True, mutable=["cache"]))
  return step, (params, cache, x[:, -1:], mask[:, -1:])


def _build_train_step(spec, config, model, tokens, labels, key, short):
  import jax

  from textattn import optim, platform, step
  tx = optim.make_optimizer(config.optimizer, total_steps=max(spec["warmup"] + spec["repeats"],
                                                              1000))

  def init(rng):
    return step.init_train_state(model, tx, rng, short, config.optimizer)

  # As in training: the batch sharded over all devices (config.num_cpu_devices on a CPU), the
  # state replicated.
  mesh = platform.run_mesh()
  data_sharding, replicated = jax.NamedSharding(mesh, jax.P("data")), platform.replicated(mesh)
  if config.batch_size % jax.device_count():
    raise UsageError(f"config.batch_size={config.batch_size} must be a multiple of the device "
                     f"count ({jax.device_count()}).")
  state = jax.jit(init, out_shardings=replicated)(key)
  batch = jax.device_put({"inputs": tokens, "labels": labels}, data_sharding)
  return jax.jit(step.train_step, in_shardings=(replicated, data_sharding),
                 out_shardings=(replicated, replicated), donate_argnums=0,
                 compiler_options=platform.step_compiler_options(config)), (state, batch)


def mesh_shape(spec: dict) -> tuple[int, int] | None:
  """(data, sequence) of the point's --mesh ("DxS" in its spec), or None."""
  if not spec.get("mesh"):
    return None
  data, shards = spec["mesh"].split("x")
  return int(data), int(shards)


def point_mesh(spec: dict):
  """The point's (data, sequence) mesh from --mesh, or None."""
  if mesh_shape(spec) is None:
    return None
  from textattn import sharding
  return sharding.make_mesh(*mesh_shape(spec))


def request_mesh_devices(spec: dict) -> None:
  """On a CPU, D x S devices for a --mesh point (before any JAX operation), unless XLA_FLAGS
  sets the count already."""
  if spec.get("mesh") and "xla_force_host_platform_device_count" not in os.environ.get(
      "XLA_FLAGS", ""):
    import jax
    data, shards = mesh_shape(spec)
    jax.config.update("jax_num_cpu_devices", data * shards)


# The rings' layouts (textattn/attention/sequence.py), whose blocks per device a --mesh row counts.
RING_LAYOUTS = {"softmax": None, "causal": "zigzag"}


def mesh_fields(spec: dict, config, compiled) -> dict:
  """A --mesh point's communication and load balance: collective bytes of the timed program
  (comm_step_bytes); of one attention layer's forward + backward at the point's sizes, compiled
  apart (textattn/benchmark/layer_cost.py), and its stated formula (comm_layer_bytes,
  comm_formula_bytes; collectives.py); for a ring, the chunk-blocks each device of the
  sequence axis computes in the forward pass (the backward follows the same schedule), from the
  ring's schedule, which depends on S and the layout only (run at length 2S)."""
  from textattn import sharding
  from textattn.attention import ring
  from textattn.benchmark import collectives, layer_cost

  mesh = point_mesh(spec)
  shards = mesh_shape(spec)[1]
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


def _build(spec: dict, config, implementation: str | None = None):
  """(jitted function, its arguments) for the spec's mode. `implementation` overrides the
  attention's kernel (the reference check builds the same function on the reference one)."""
  import jax
  import jax.numpy as jnp
  import optax

  from textattn import data as data_lib
  from textattn import models

  config = config.copy_and_resolve_references()
  if implementation is not None:
    with config.unlocked():
      config.model.attention_impl = implementation
  seq_len, batch_size, mode = config.max_len, config.batch_size, spec["mode"]
  rng, padding_mask, tokens, labels = _random_inputs(spec, seq_len, batch_size)
  if not mode.startswith("attention") and data_lib.pads_before(config):
    tokens = data_lib.pad_before(tokens)  # the layout the model trains on
  key = jax.random.key(spec["seed"])
  short = min(seq_len, 8)  # parameter shapes do not depend on the length: init cheaply

  mesh = point_mesh(spec)
  if mode.startswith("attention"):
    return _build_attention(config, rng, padding_mask, key, short,
                            backward=mode == "attention+backward", mesh=mesh)
  if mode == "decode_step":
    return _build_decode_step(config, rng, key, short)
  model = models.build_model(config, spec["num_classes"], mesh=mesh)
  tokens, labels = jnp.asarray(tokens), jnp.asarray(labels)
  if mode == "train_step":
    return _build_train_step(spec, config, model, tokens, labels, key, short)

  params = jax.jit(model.init)(key, tokens[:1, :short])["params"]
  if mesh is not None:  # the batch split along (data, sequence), the parameters replicated
    from textattn import platform
    params = jax.device_put(params, platform.replicated(mesh))
    tokens = jax.device_put(tokens, platform.batch_sharding(mesh, tokens.shape))
    labels = jax.device_put(labels, platform.batch_sharding(mesh, labels.shape))
  if mode == "forward":
    return jax.jit(lambda p, t: model.apply({"params": p}, t, train=False)), (params, tokens)

  def loss_fn(params, tokens, labels):
    logits = model.apply({"params": params}, tokens, train=False)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))

  return jax.jit(jax.value_and_grad(loss_fn)), (params, tokens, labels)


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
  import jax

  from textattn import attention as attention_lib
  from textattn import models
  from textattn.benchmark import utilization

  m = config.model
  variant = attention_lib.get(spec["attention"])
  implementation = result.get("implementation") or spec["implementation"]
  heads, head_dim = m.num_heads, m.embed_dim // m.num_heads
  fields = {"kernel": dict(variant.kernels).get(implementation, implementation)}
  flop_count = utilization.attention_flops(variant.forward_flops, spec["mode"], spec["batch_size"],
                                           spec["seq_len"], heads, head_dim, m.num_layers)
  model_flops = None
  if spec["mode"] == "train_step":
    factor = variant.forward_flops(1, 1, 1, 1) / 4.0 if variant.forward_flops else 0.0
    # Embedding tables are looked up, not multiplied: PaLM's N counts the other parameters.
    parameters = models.count_parameters(
        {k: v for k, v in args[0].params.items() if k != "embedding"})
    model_flops = spec["batch_size"] * spec["seq_len"] * utilization.model_flops_per_token(
        parameters, m.num_layers, spec["seq_len"], m.embed_dim, factor)
  if device.platform == "cpu":
    peak_tflops, peak_tbps = utilization.measured_cpu_peak() * jax.local_device_count(), None
  else:
    peak_tflops, peak_tbps = utilization.device_peak(device.device_kind, m.dtype)
  fields.update(utilization.derived(result, attention_flop_count=flop_count,
                                    bytes_accessed=result.get("bytes_accessed"),
                                    model_flops=model_flops, peak_tflops=peak_tflops,
                                    peak_tbps=peak_tbps))
  return fields


def _max_abs_diff(a, b) -> float:
  import jax
  import numpy as np
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
  import ml_collections

  config = ml_collections.ConfigDict(json.loads(spec["config"]))
  request_mesh_devices(spec)
  if spec["mode"] == "train_step":
    from textattn import platform as platform_lib
    platform_lib.request_cpu_devices(config)  # before any JAX operation
  from textattn import attention as attention_lib
  attention_lib.load_plugins(spec.get("plugins", ()))  # before the point is built
  compiled, args, memory_limit, device = _compile(spec, config, result, save)
  if compiled is None:  # over the memory limit: not run
    return
  args = _time_calls(spec, compiled, args, device, result, save)
  if spec.get("profile_dir"):
    args = _profile_calls(spec, compiled, args)
  result.update(_utilization(spec, config, args, device, result))
  save()
  if (spec["check_against_reference"]
      and spec["implementation"] != attention_lib.get(spec["attention"]).reference
      and spec["mode"] not in ("train_step", "decode_step")):
    result["message"] = _check_against_reference(spec, config, compiled, args, memory_limit,
                                                  result)


def _compile(spec: dict, config, result: dict, save):
  """Builds and compiles the point; records its platform, compile time, memory and FLOPs.
  Returns (compiled, args, memory_limit, device); compiled is None when the footprint exceeds
  the memory limit (the point is then recorded as "oom")."""
  import jax
  import numpy as np


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
  function, args = _build(spec, config)
  if spec["implementation"] == "auto":  # what it resolved to, at this point's length
    from textattn import models
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
  import jax
  import numpy as np

  donated = spec["mode"] == "train_step"

  def timed_call(args):
    start = time.perf_counter()
    out = compiled(*args)
    jax.block_until_ready(out)
    # train_step donates the state: the next call takes the new one.
    args = (out[0],) + tuple(args[1:]) if donated else args
    return args, time.perf_counter() - start

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


PROFILED_STEPS = 3


def _profile_calls(spec: dict, compiled, args):
  """PROFILED_STEPS more calls under jax.profiler.trace, each a step named 'benchmark_step' (so
  the profile viewer splits them), after the timed ones (tracing slows the calls it sees).
  Returns the arguments of the next call."""
  import jax
  with jax.profiler.trace(spec["profile_dir"]):
    for step in range(PROFILED_STEPS):
      with jax.profiler.StepTraceAnnotation("benchmark_step", step_num=step):
        out = jax.block_until_ready(compiled(*args))
      if spec["mode"] == "train_step":  # the state is donated: the next call takes the new one
        args = (out[0],) + tuple(args[1:])
  return args


def _check_against_reference(spec, config, compiled, args, memory_limit, result) -> str:
  """Compares with the attention's reference implementation; returns the message to record
  (empty when compared)."""
  import jax

  from textattn import attention as attention_lib
  reference_implementation = attention_lib.get(spec["attention"]).reference
  reference, reference_args = _build(spec, config, implementation=reference_implementation)
  reference = reference.lower(*reference_args).compile()
  footprint = _memory_fields(reference).get("footprint_bytes", 0)
  if memory_limit and footprint > memory_limit:
    return (f"reference not compared: its footprint {footprint / 2**30:.2f} GiB exceeds the "
            f"memory limit")
  result["max_abs_diff"] = _max_abs_diff(compiled(*args), jax.block_until_ready(reference(*args)))
  return ""
