"""Sequence-length benchmark: step time, compile time, FLOPs and peak memory per variant x length.

    python -m textattn.benchmark --variants=softmax,softmax_chunked,additive \
        --seq_lens=256,1024,4096 --batch_size=4 --embed_dim=256 --num_heads=4 --num_layers=1 \
        --mode=forward+backward --out_dir=runs/seq_len

    # The real training step of a config (what the speed work measures): examples/s.
    python -m textattn.benchmark --mode=train_step --config=configs/imdb_keras_example.py

Every (variant, length) point runs in its own subprocess, so its peak memory is its own and an
out-of-memory, a crash or a hang costs that point only: it is recorded with status "oom",
"timeout" or "error" and a message, and the sweep goes on. Results go to `out_dir`:
results.csv, results.md, time_vs_length.png and memory_vs_length.png.

Variants are `<attention>[_<implementation>]`: softmax (reference einsum, "xla"),
softmax_dot_product (jax.nn.dot_product_attention), softmax_cudnn (the same with
implementation="cudnn"; GPU, bfloat16/float16 only), softmax_chunked (memory-efficient exact
softmax), softmax_fused (CPU layout), causal (and causal_<implementation>), additive (Fastformer,
the XLA function), additive_native (its C++ kernel) and additive_auto (native where it runs, as
"auto" in a config).

What is timed (--mode):
  attention         the attention module alone, projections included, on x ~ N(0, 1) [B, L, E];
  forward           the Classifier (train=False) on random tokens;
  forward+backward  jax.value_and_grad of the mean cross-entropy of that Classifier (train=False,
                    so no dropout) with respect to all parameters;
  train_step        textattn.train.train_step (forward with dropout, backward, optimizer update,
                    state donated) of the classifier --config describes.
Inputs are right-padded: example 0 has all L real tokens, the others a length drawn uniformly from
[L/2, L] (seeded). Token ids are uniform in [1, vocab_size); labels uniform in [0, num_classes).
Tokens/s counts all B * L positions, padding included (every kernel here costs the same either
way).

Where the model's size comes from: in train_step mode from --config (textattn.defaults.classification() if not
given): its model, batch_size, max_len (the length) and optimizer; any of --variants, --seq_lens,
--batch_size, --embed_dim, --num_heads, --num_layers, --dtype, --vocab_size given explicitly
overrides the config. In the other modes those flags set the benchmarked sizes (defaults below)
and the config supplies only the remaining model fields (ffn_dim, mlp_dim, pooling, norm, ...).

Measurements, per point:
  compile_s   wall time of jit(...).lower(...).compile() (tracing + XLA compilation), apart from
              the step times;
  median_ms, p90_ms, min_ms
              over --repeats calls after --warmup calls, each synchronised with
              jax.block_until_ready;
  flops       compiled.cost_analysis()["flops"]. XLA counts a while loop's body once, not once
              per trip, so kernels built on lax.map/scan (softmax_chunked) are under-counted;
  peak_bytes  on CPU: the compiled program's footprint from compiled.memory_analysis(),
              argument + output + temp - alias bytes (temp is XLA's buffer assignment of every
              intermediate, reuse included; alias is output memory shared with donated inputs).
              It excludes the Python/JAX runtime itself; rss_peak_bytes (the child process's
              ru_maxrss, runtime included) is recorded next to it as a cross-check.
              On GPU: device.memory_stats()["peak_bytes_in_use"] after the timed calls.
  first_call_ms  the first call after compilation (a warm-up call, when there is one).
A point whose memory_analysis footprint exceeds --point_memory_limit_gb (CPU only) is recorded as
"oom" without being run; before it runs, the child's address space is capped at its size after
compilation plus that limit (RLIMIT_AS), so a footprint the analysis underestimated fails as
"oom" too instead of swapping the machine.
--point_time_budget_s bounds the calls of slow points (a 100-s step is not run 12 times); every
row says how many warm-up and timed calls it made.
"""

from __future__ import annotations

import csv
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from absl import app, flags
from ml_collections import config_flags

MODES = ("attention", "forward", "forward+backward", "train_step")
DTYPES = ("float32", "bfloat16")
STATUSES = ("ok", "oom", "timeout", "error")
INJECTABLE_FAILURES = ("error", "oom", "timeout")
# Implementations a variant name may carry; "cudnn" is jax.nn.dot_product_attention with
# implementation="cudnn" (attention.cudnn_attention); "native" the C++ FFI kernel (CPU).
IMPLEMENTATIONS = ("auto", "xla", "dot_product", "chunked", "fused", "native", "cudnn")
ATTENTIONS = ("softmax", "causal", "additive")
# How long the random examples of a batch are: "half_to_full" = uniform in [L/2, L] with the
# first example full (padding, as real text has); "full" = every example L tokens (no padding:
# the work of a model that ignores the mask, such as the seed Keras model).
LENGTHS = ("half_to_full", "full")

# Sizes benchmarked in the attention / forward / forward+backward modes when no flag is given.
SYNTHETIC_DEFAULTS = {"variants": "softmax,additive", "seq_lens": "256,512,1024,2048,4096",
                      "batch_size": 4, "embed_dim": 256, "num_heads": 4, "num_layers": 1,
                      "dtype": "float32", "vocab_size": 1000}

COLUMNS = ("variant", "attention", "implementation", "seq_len", "batch_size", "mode", "dtype",
           "embed_dim", "num_heads", "num_layers", "status", "compile_s", "median_ms", "p90_ms",
           "min_ms", "first_call_ms", "tokens_per_s", "examples_per_s", "peak_bytes", "peak_source",
           "argument_bytes", "output_bytes", "temp_bytes", "alias_bytes", "rss_peak_bytes",
           "flops", "max_abs_diff", "warmup", "repeats", "lengths", "platform", "load_1m",
           "message")

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (configs/*.py). train_step mode: the model, batch, max_len and "
    "optimizer benchmarked (default: textattn.defaults.classification()). Other modes: only the model fields the "
    "flags below do not set.", lock_config=True)
_VARIANTS = flags.DEFINE_string(
    "variants", None, "Comma list of variants: softmax, softmax_dot_product, softmax_cudnn, "
    "softmax_chunked, softmax_fused, causal[_<impl>], additive. Default: the config's variant "
    f"(train_step) or {SYNTHETIC_DEFAULTS['variants']!r}.")
_SEQ_LENS = flags.DEFINE_string(
    "seq_lens", None, "Comma list of sequence lengths. Default: config.max_len (train_step) or "
    f"{SYNTHETIC_DEFAULTS['seq_lens']!r}.")
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", None, "Batch size. Default: config.batch_size (train_step) or "
    f"{SYNTHETIC_DEFAULTS['batch_size']}.")
_EMBED_DIM = flags.DEFINE_integer(
    "embed_dim", None, "Embedding size. Default: the config's (train_step) or "
    f"{SYNTHETIC_DEFAULTS['embed_dim']}.")
_NUM_HEADS = flags.DEFINE_integer(
    "num_heads", None, "Attention heads. Default: the config's (train_step) or "
    f"{SYNTHETIC_DEFAULTS['num_heads']}.")
_NUM_LAYERS = flags.DEFINE_integer(
    "num_layers", None, "Encoder blocks. Default: the config's (train_step) or "
    f"{SYNTHETIC_DEFAULTS['num_layers']}.")
_DTYPE = flags.DEFINE_enum(
    "dtype", None, DTYPES, "Compute dtype. Default: the config's (train_step) or "
    f"{SYNTHETIC_DEFAULTS['dtype']}.")
_VOCAB_SIZE = flags.DEFINE_integer(
    "vocab_size", None, "Vocabulary size of the classifier. Default: config.vocab_size "
    f"(train_step) or {SYNTHETIC_DEFAULTS['vocab_size']}.")
_NUM_CLASSES = flags.DEFINE_integer("num_classes", 2, "Output classes of the classifier.")
_MODE = flags.DEFINE_enum("mode", "forward+backward", MODES, "What is timed.")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed calls after compilation.")
_REPEATS = flags.DEFINE_integer("repeats", 10, "Timed calls; median and p90 are over these.")
_OUT_DIR = flags.DEFINE_string(
    "out_dir", "", "Where results.csv, results.md and the plots are written; default "
    "runs/benchmark/<UTC date-time>, new each run. A directory already holding results is "
    "refused unless --overwrite.")
_OVERWRITE = flags.DEFINE_bool(
    "overwrite", False, "Replace the results already in --out_dir (they are rewritten point by "
    "point, so an interrupted sweep leaves a partial table there).")
_POINT_TIME_BUDGET_S = flags.DEFINE_float(
    "point_time_budget_s", 0.0, "If > 0: no further warm-up or timed call starts once a point's "
    "calls have taken this many seconds; at least one call is timed (if the warm-up used the "
    "budget, its last call is the timed one). The row's warmup and repeats say what was done. "
    "0 = always --warmup + --repeats calls.")
_POINT_TIMEOUT_S = flags.DEFINE_float(
    "point_timeout_s", 600.0, "Wall-clock limit of one point's subprocess (import, compile, "
    "warm-up, repeats); past it the point is recorded as 'timeout'.")
_POINT_MEMORY_LIMIT_GB = flags.DEFINE_float(
    "point_memory_limit_gb", 8.0, "CPU only: a point whose compiled footprint exceeds this many "
    "GiB is recorded as 'oom' without running, and the point's address space is capped at its "
    "size at start plus this. 0 = no limit.")
_CHECK_AGAINST_REFERENCE = flags.DEFINE_bool(
    "check_against_reference", False, "For variants other than the reference implementation: "
    "also run the reference (implementation 'xla': the einsum kernel, or additive attention's "
    "XLA function) on the same "
    "parameters and inputs, where its footprint fits the memory limit, and record the largest "
    "absolute difference of the outputs (attention output, logits, or loss and every gradient) in "
    "max_abs_diff.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the parameters and the random inputs.")
_LENGTHS = flags.DEFINE_enum(
    "lengths", "half_to_full", LENGTHS, "Lengths of the random examples: half_to_full = uniform "
    "in [L/2, L], the first one full (padding, as real text has); full = all L tokens (no "
    "padding).")
_INJECT_FAILURE = flags.DEFINE_string(
    "inject_failure", "", "For testing this tool: comma list of variant@seq_len=kind, kind one of "
    f"{', '.join(INJECTABLE_FAILURES)}; that point fails that way on purpose.")
_POINT_SPEC = flags.DEFINE_string(
    "point_spec", None, "Internal: run the one point described in this JSON file (the sweep "
    "starts one such subprocess per point).")


# ---------------------------------------------------------------------------------------------
# Parsing and the sweep's plan (parent process; never touches a device).


ADDITIVE_IMPLEMENTATIONS = ("auto", "xla", "native")


def parse_variant(name: str) -> tuple[str, str]:
  """'softmax_chunked' -> ('softmax', 'chunked'); 'additive' -> ('additive', 'xla')."""
  if name in ATTENTIONS:
    return name, "xla"
  for attention, allowed in (("softmax", IMPLEMENTATIONS), ("causal", IMPLEMENTATIONS),
                             ("additive", ADDITIVE_IMPLEMENTATIONS)):
    implementation = name[len(attention) + 1:]
    if name.startswith(attention + "_") and implementation in allowed:
      return attention, implementation
  raise ValueError(
      f"--variants: {name!r} is not a known variant; allowed: softmax, causal, additive, "
      f"softmax_<impl> / causal_<impl> with <impl> one of {', '.join(IMPLEMENTATIONS)}, or "
      f"additive_<impl> with <impl> one of {', '.join(ADDITIVE_IMPLEMENTATIONS)}.")


def variant_name(attention: str, implementation: str) -> str:
  if attention == "additive" and implementation not in ADDITIVE_IMPLEMENTATIONS:
    implementation = "xla"  # additive attention: every other name is the XLA function
  if implementation == "xla":
    return attention
  return f"{attention}_{implementation}"


def parse_int_list(text: str, flag: str) -> list[int]:
  try:
    values = [int(part) for part in text.split(",") if part.strip()]
  except ValueError:
    values = []
  if not values or min(values) < 1:
    raise ValueError(f"--{flag}={text!r} must be a comma list of positive integers.")
  return values


def parse_injections(text: str) -> dict[tuple[str, int], str]:
  injections = {}
  for item in filter(None, (part.strip() for part in text.split(","))):
    try:
      point, kind = item.split("=")
      variant, seq_len = point.split("@")
      key = (variant, int(seq_len))
    except ValueError:
      kind = None
    if kind not in INJECTABLE_FAILURES:
      raise ValueError(f"--inject_failure: {item!r} must be variant@seq_len=kind with kind one "
                       f"of {', '.join(INJECTABLE_FAILURES)}.")
    injections[key] = kind
  return injections


def resolve_settings(config, mode: str, given: dict[str, Any]) -> dict[str, Any]:
  """The benchmarked sizes: flags given explicitly win; otherwise the config's (train_step) or
  SYNTHETIC_DEFAULTS (the other modes)."""
  if mode == "train_step":
    from_config = {
        "variants": variant_name(config.model.attention, config.model.attention_impl),
        "seq_lens": str(config.max_len), "batch_size": config.batch_size,
        "embed_dim": config.model.embed_dim, "num_heads": config.model.num_heads,
        "num_layers": config.model.num_layers, "dtype": config.model.dtype,
        "vocab_size": config.vocab_size}
  else:
    from_config = SYNTHETIC_DEFAULTS
  settings = {name: given[name] if given.get(name) is not None else default
              for name, default in from_config.items()}
  settings["variants"] = [v.strip() for v in settings["variants"].split(",") if v.strip()]
  if not settings["variants"]:
    raise ValueError("--variants must name at least one variant.")
  for variant in settings["variants"]:
    parse_variant(variant)
  settings["seq_lens"] = parse_int_list(settings["seq_lens"], "seq_lens")
  for name in ("batch_size", "embed_dim", "num_heads", "num_layers", "vocab_size"):
    if settings[name] < 1:
      raise ValueError(f"--{name}={settings[name]} must be a positive integer.")
  if settings["embed_dim"] % settings["num_heads"]:
    raise ValueError(f"--num_heads={settings['num_heads']} must divide "
                     f"--embed_dim={settings['embed_dim']}.")
  return settings


def point_config(config, settings: dict[str, Any], variant: str, seq_len: int):
  """The config of one point: the base config with the benchmarked fields set."""
  config = config.copy_and_resolve_references()
  with config.unlocked():
    attention, implementation = parse_variant(variant)
    config.model.attention = attention
    config.model.attention_impl = implementation
    config.model.embed_dim = settings["embed_dim"]
    config.model.num_heads = settings["num_heads"]
    config.model.num_layers = settings["num_layers"]
    config.model.dtype = settings["dtype"]
    config.vocab_size = settings["vocab_size"]
    config.batch_size = settings["batch_size"]
    config.max_len = seq_len
  return config


# ---------------------------------------------------------------------------------------------
# One point (child process).


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


def _build(spec: dict, config, implementation: str | None = None):
  """(jitted function, its arguments, donate) for the spec's mode. `implementation` overrides the
  softmax kernel (the reference check builds the same function on implementation 'xla')."""
  import jax
  import jax.numpy as jnp
  import optax

  from textattn import attention as attention_lib
  from textattn import models
  from textattn import data as data_lib

  config = config.copy_and_resolve_references()
  if implementation is not None:
    with config.unlocked():
      config.model.attention_impl = implementation
  seq_len, batch_size, mode = config.max_len, config.batch_size, spec["mode"]
  rng, padding_mask, tokens, labels = _random_inputs(spec, seq_len, batch_size)
  if mode != "attention" and data_lib.pads_before(config):
    tokens = data_lib.pad_before(tokens)  # the layout the model trains on
  key = jax.random.key(spec["seed"])
  short = min(seq_len, 8)  # parameter shapes do not depend on the length: init cheaply

  if mode == "attention":
    models.validate_model_config(config)
    m = config.model
    module = attention_lib.get(m.attention).build(
        num_heads=m.num_heads, implementation=m.attention_impl, dtype=models.DTYPES[m.dtype])
    dtype = models.DTYPES[m.dtype]
    x = jnp.asarray(rng.standard_normal((batch_size, seq_len, m.embed_dim)), dtype)
    mask = jnp.asarray(padding_mask)
    params = jax.jit(module.init)(key, x[:1, :short], mask[:1, :short])["params"]
    return jax.jit(lambda p, x, mask: module.apply({"params": p}, x, mask)), (params, x, mask)

  model = models.build_model(config, spec["num_classes"])
  tokens, labels = jnp.asarray(tokens), jnp.asarray(labels)

  if mode == "train_step":
    from textattn import optim, platform, step
    tx = optim.make_optimizer(config.optimizer, total_steps=max(spec["warmup"] + spec["repeats"],
                                                                1000))

    def init(rng):
      return step.init_train_state(model, tx, rng, short, config.optimizer)

    # As in training: the batch sharded over all devices (config.num_cpu_devices on a CPU), the
    # state replicated.
    data_sharding, replicated = platform.data_parallel_shardings()
    if batch_size % jax.device_count():
      raise ValueError(f"config.batch_size={batch_size} must be a multiple of the device count "
                       f"({jax.device_count()}).")
    state = jax.jit(init, out_shardings=replicated)(key)
    batch = jax.device_put({"inputs": tokens, "labels": labels}, data_sharding)
    return jax.jit(step.train_step, in_shardings=(replicated, data_sharding),
                   out_shardings=(replicated, replicated), donate_argnums=0,
                   compiler_options=platform.step_compiler_options(config)), (state, batch)

  params = jax.jit(model.init)(key, tokens[:1, :short])["params"]
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


def _flops(compiled) -> float | None:
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):  # older JAX: one dict per computation
    cost = cost[0] if cost else None
  if not cost or "flops" not in cost:
    return None
  return float(cost["flops"])


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
  import jax
  import ml_collections
  import numpy as np

  config = ml_collections.ConfigDict(json.loads(spec["config"]))
  if spec["mode"] == "train_step":
    from textattn import platform as platform_lib
    platform_lib.request_cpu_devices(config)  # before any JAX operation
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
  if spec["implementation"] == "auto":  # what it resolved to
    from textattn import attention as attention_lib
    m = config.model
    result["implementation"] = attention_lib.get(spec["attention"]).resolve(
        "auto", m.embed_dim // m.num_heads)
  jax.block_until_ready(args)
  result["setup_s"] = time.perf_counter() - start
  start = time.perf_counter()
  compiled = function.lower(*args).compile()
  result["compile_s"] = time.perf_counter() - start
  memory = _memory_fields(compiled)
  result.update({k: v for k, v in memory.items() if k != "footprint_bytes"})
  result["flops"] = _flops(compiled)
  if platform == "cpu":
    result["peak_bytes"] = memory.get("footprint_bytes")
    result["peak_source"] = "memory_analysis"
  result["message"] = "compiled"
  save()
  if memory_limit and memory.get("footprint_bytes", 0) > memory_limit:
    result["status"] = "oom"
    result["message"] = (f"compiled footprint {memory['footprint_bytes'] / 2**30:.2f} GiB "
                         f"(memory_analysis) exceeds --point_memory_limit_gb="
                         f"{spec['memory_limit_gb']:g}; not run")
    return
  if memory_limit:
    # A backstop for what the analysis misses: from here on the process may grow by the limit.
    # (The compiler's own memory is not the point's footprint, so the cap comes after it.)
    cap = _vm_size_bytes() + memory_limit
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
  if injected == "oom":
    if memory_limit:  # beyond the address-space cap: MemoryError at once, nothing touched
      np.empty(memory_limit + 2**30, np.uint8)
    raise MemoryError("injected failure (--inject_failure)")

  donated = spec["mode"] == "train_step"

  def call(args):
    out = compiled(*args)
    jax.block_until_ready(out)
    # train_step donates the state: the next call takes the new one.
    return (out[0],) + tuple(args[1:]) if donated else args

  budget_s = spec["time_budget_s"]
  calls_start = time.perf_counter()

  def timed_call(args):
    start = time.perf_counter()
    args = call(args)
    return args, time.perf_counter() - start

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
                tokens_per_s=spec["batch_size"] * spec["seq_len"] / median_s,
                examples_per_s=spec["batch_size"] / median_s,
                warmup=len(warmup_times), repeats=len(times))
  if platform != "cpu":
    stats = device.memory_stats() or {}
    if "peak_bytes_in_use" in stats:
      result["peak_bytes"] = int(stats["peak_bytes_in_use"])
      result["peak_source"] = "memory_stats"
  result["rss_peak_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  result["status"], result["message"] = "ok", note
  save()

  if (spec["check_against_reference"] and spec["implementation"] != "xla"
      and spec["mode"] != "train_step"):
    result["message"] = _check_against_reference(spec, config, compiled, args, memory_limit,
                                                  result)


def _check_against_reference(spec, config, compiled, args, memory_limit, result) -> str:
  """Compares with the reference kernel; returns the message to record (empty when compared)."""
  import jax
  reference, reference_args = _build(spec, config, implementation="xla")
  reference = reference.lower(*reference_args).compile()
  footprint = _memory_fields(reference).get("footprint_bytes", 0)
  if memory_limit and footprint > memory_limit:
    return (f"reference not compared: its footprint {footprint / 2**30:.2f} GiB exceeds the "
            f"memory limit")
  result["max_abs_diff"] = _max_abs_diff(compiled(*args), jax.block_until_ready(reference(*args)))
  return ""


# ---------------------------------------------------------------------------------------------
# The sweep (parent process).


def run_point_in_subprocess(spec: dict, timeout_s: float) -> dict:
  """Runs one point in a fresh interpreter; always returns a row-shaped dict with a status."""
  with tempfile.TemporaryDirectory(prefix="textattn_benchmark_") as tmp:
    spec_path, result_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "result.json")
    with open(spec_path, "w") as f:
      json.dump(spec, f)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [root, os.environ.get("PYTHONPATH")])))
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
    result = {}
    if os.path.exists(result_path):
      with open(result_path) as f:
        result = json.load(f)
  text = output.decode(errors="replace")
  if timed_out:
    result["status"] = "timeout"
    progress = result.get("message", "")
    result["message"] = (f"exceeded --point_timeout_s={timeout_s:g}"
                         + (f" ({progress})" if progress else ""))
  elif process.returncode != 0 and result.get("status") != "oom":
    # Died without recording its end: killed (the kernel's OOM killer sends SIGKILL) or crashed.
    lines = [line for line in text.splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    oom = process.returncode == -9 or any(
        marker in text for marker in ("RESOURCE_EXHAUSTED", "Out of memory", "bad_alloc",
                                      "MemoryError"))
    result["status"] = "oom" if oom else "error"
    result["message"] = f"child exited with {process.returncode}: {last}"[:500]
  elif result.get("status") not in STATUSES:
    result["status"] = "error"
    result["message"] = "child recorded no result"
  return result


def plan_points(config, settings: dict, mode: str, *, warmup: int = 2, repeats: int = 10,
                time_budget_s: float = 0.0, memory_limit_gb: float = 8.0,
                check_against_reference: bool = False, seed: int = 0, num_classes: int = 2,
                injections: dict | None = None, lengths: str = "half_to_full") -> list[dict]:
  """One spec (everything its subprocess needs, JSON-able) per variant x length."""
  if lengths not in LENGTHS:
    raise ValueError(f"lengths={lengths!r} is invalid; allowed: {', '.join(LENGTHS)}.")
  specs = []
  for variant in settings["variants"]:
    attention, implementation = parse_variant(variant)
    for seq_len in settings["seq_lens"]:
      specs.append({
          "variant": variant, "attention": attention, "implementation": implementation,
          "seq_len": seq_len, "batch_size": settings["batch_size"], "mode": mode,
          "dtype": settings["dtype"], "embed_dim": settings["embed_dim"],
          "num_heads": settings["num_heads"], "num_layers": settings["num_layers"],
          "vocab_size": settings["vocab_size"], "num_classes": num_classes, "seed": seed,
          "warmup": warmup, "repeats": repeats, "time_budget_s": time_budget_s,
          "lengths": lengths,
          "memory_limit_gb": memory_limit_gb, "check_against_reference": check_against_reference,
          "inject": (injections or {}).get((variant, seq_len)),
          "config": point_config(config, settings, variant, seq_len).to_json()})
  return specs


OUTPUTS = ("results.csv", "results.md", "time_vs_length.png", "memory_vs_length.png")


def run_sweep(specs: Sequence[dict], *, timeout_s: float, out_dir: str, command: str) -> list[dict]:
  """Runs every point in its own subprocess, one after another; writes and returns the rows."""
  os.makedirs(out_dir, exist_ok=True)
  rows = []
  print(_table_header(), flush=True)
  for spec in specs:
    load = os.getloadavg()[0]
    result = run_point_in_subprocess(spec, timeout_s)
    row = {column: "" for column in COLUMNS}
    # Requested warm-up/repeats first; a measured point's result says what it did.
    row.update({k: v for k, v in spec.items() if k in COLUMNS})
    row.update({k: v for k, v in result.items() if k in COLUMNS and v is not None})
    row["load_1m"] = round(load, 2)
    rows.append(row)
    print(_table_line(row), flush=True)
    write_csv(rows, os.path.join(out_dir, "results.csv"))  # kept up to date as points finish
  first = specs[0] if specs else {}
  sweep_settings = (f"requested warm-up {first.get('warmup')} + {first.get('repeats')} timed "
                    f"calls, time budget {first.get('time_budget_s', 0):g} s, timeout "
                    f"{timeout_s:g} s, memory limit {first.get('memory_limit_gb', 0):g} GiB (CPU) "
                    f"per point; 'calls' = warm-up + timed calls made")
  write_markdown(rows, os.path.join(out_dir, "results.md"), command, sweep_settings)
  write_plots(rows, out_dir)
  return rows


# ---------------------------------------------------------------------------------------------
# Output.


def _number(value) -> float | None:
  if value is None or value == "":
    return None
  try:
    value = float(value)
  except (TypeError, ValueError):
    return None
  return None if math.isnan(value) else value


def _format(value, kind: str) -> str:
  value = _number(value)
  if value is None:
    return "-"
  if kind == "ms":
    return f"{value:.3g}" if value < 100 else f"{value:,.0f}"
  if kind == "s":
    return f"{value:.2f}"
  if kind == "rate":
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
  if kind == "mib":
    value /= 2**20
    return f"{value:,.1f}" if value >= 10 else f"{value:.2g}"
  if kind == "gflop":
    return f"{value / 1e9:,.2f}"
  if kind == "diff":
    return f"{value:.1e}"
  return str(value)


_TABLE = (("variant", "variant", 20, None), ("seq_len", "L", 6, None),
          ("status", "status", 7, None), ("compile_s", "compile s", 9, "s"),
          ("median_ms", "median ms", 9, "ms"), ("p90_ms", "p90 ms", 8, "ms"),
          ("tokens_per_s", "tokens/s", 10, "rate"), ("examples_per_s", "examples/s", 10, "rate"),
          ("peak_bytes", "peak MiB", 9, "mib"), ("flops", "GFLOP", 9, "gflop"))


def _table_header() -> str:
  return "  ".join(f"{title:>{width}}" for _, title, width, _ in _TABLE)


def _table_line(row: dict) -> str:
  cells = [str(row[key]) if kind is None else _format(row[key], kind)
           for key, _, _, kind in _TABLE]
  line = "  ".join(f"{cell:>{width}}" for cell, (_, _, width, _) in zip(cells, _TABLE))
  if row["status"] != "ok" and row.get("message"):
    line += f"  {row['message'][:120]}"
  return line


def write_csv(rows: Sequence[dict], path: str) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=COLUMNS)
    writer.writeheader()
    for row in rows:
      writer.writerow({column: row.get(column, "") for column in COLUMNS})
  os.replace(tmp, path)


def read_csv(path: str) -> list[dict]:
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def _pivot(rows: Sequence[dict], key: str, kind: str) -> list[str]:
  variants = list(dict.fromkeys(row["variant"] for row in rows))
  lengths = sorted({int(row["seq_len"]) for row in rows})
  cell = {(row["variant"], int(row["seq_len"])): row for row in rows}
  lines = ["| L | " + " | ".join(variants) + " |", "|---:|" + "---:|" * len(variants)]
  for length in lengths:
    cells = []
    for variant in variants:
      row = cell.get((variant, length))
      if row is None:
        cells.append("")
      elif row["status"] != "ok":
        cells.append(row["status"])
      else:
        cells.append(_format(row[key], kind))
    lines.append(f"| {length} | " + " | ".join(cells) + " |")
  return lines


def write_markdown(rows: Sequence[dict], path: str, command: str, sweep_settings: str) -> None:
  first = rows[0] if rows else {}
  lines = [f"# Sequence-length benchmark: {first.get('mode', '')}", "",
           f"`{command}`", "",
           f"batch {first.get('batch_size')}, embed {first.get('embed_dim')}, "
           f"{first.get('num_heads')} heads, {first.get('num_layers')} layer(s), "
           f"{first.get('dtype')}; {sweep_settings}; platform {first.get('platform') or '?'}. "
           "peak = "
           + ("device memory_stats peak_bytes_in_use"
              if first.get("peak_source") == "memory_stats" else
              "memory_analysis argument + output + temp - alias bytes") + ".", "",
           "## Median step time (ms)", "", *_pivot(rows, "median_ms", "ms"), "",
           "## Peak memory (MiB)", "", *_pivot(rows, "peak_bytes", "mib"), "",
           "## All points", "",
           ("| variant | L | status | compile s | calls | median ms | p90 ms | first ms | tokens/s "
            "| examples/s | peak MiB | RSS MiB | GFLOP | max abs diff | load | message |"),
           "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
  for row in rows:
    message = str(row.get("message", "")).replace("|", "/")
    calls = f"{row['warmup']}+{row['repeats']}" if row["status"] == "ok" else "-"
    lines.append(
        f"| {row['variant']} | {row['seq_len']} | {row['status']} "
        f"| {_format(row['compile_s'], 's')} "
        f"| {calls} "
        f"| {_format(row['median_ms'], 'ms')} | {_format(row['p90_ms'], 'ms')} "
        f"| {_format(row['first_call_ms'], 'ms')} | {_format(row['tokens_per_s'], 'rate')} "
        f"| {_format(row['examples_per_s'], 'rate')} | {_format(row['peak_bytes'], 'mib')} "
        f"| {_format(row['rss_peak_bytes'], 'mib')} | {_format(row['flops'], 'gflop')} "
        f"| {_format(row['max_abs_diff'], 'diff')} | {row.get('load_1m', '')} | {message} |")
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")


def write_plots(rows: Sequence[dict], out_dir: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import matplotlib.ticker
  from matplotlib import transforms

  mode = rows[0]["mode"] if rows else ""
  lengths = sorted({int(row["seq_len"]) for row in rows})
  for key, scale, ylabel, name in (
      ("median_ms", 1.0, "median step time (ms)", "time_vs_length.png"),
      ("peak_bytes", 2.0**-20, "peak memory (MiB)", "memory_vs_length.png")):
    figure, axes = plt.subplots(figsize=(6.4, 4.8))
    on_x_axis = transforms.blended_transform_factory(axes.transData, axes.transAxes)
    measured = False
    for index, variant in enumerate(dict.fromkeys(row["variant"] for row in rows)):
      ok = sorted((int(row["seq_len"]), _number(row[key]) * scale) for row in rows
                  if row["variant"] == variant and row["status"] == "ok"
                  and _number(row[key]) is not None)
      color = axes.plot(*zip(*ok), marker="o", label=variant)[0].get_color() if ok else None
      measured = measured or bool(ok)
      failed = [row for row in rows if row["variant"] == variant and row["status"] != "ok"]
      if failed:  # crosses along the bottom edge, one height per variant
        color = axes.plot([int(row["seq_len"]) for row in failed],
                          [0.03 + 0.03 * index] * len(failed), linestyle="none", marker="x",
                          markersize=8, color=color, transform=on_x_axis, clip_on=False,
                          label=None if ok else f"{variant} (failed)")[0].get_color()
      footprints = [(int(row["seq_len"]), _number(row[key]) * scale) for row in failed
                    if key == "peak_bytes" and _number(row[key]) is not None]
      if footprints:  # what a point that did not run (to the end) would have needed
        axes.plot(*zip(*footprints), linestyle="none", marker="o", markerfacecolor="none",
                  color=color)
        measured = True
    axes.set_xscale("log", base=2)
    if measured:
      axes.set_yscale("log")
    else:
      axes.text(0.5, 0.5, "no point succeeded", transform=axes.transAxes, ha="center")
    if lengths:
      axes.set_xticks(lengths, [str(length) for length in lengths])
      axes.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    note = "x at the bottom: oom / timeout / error" + (
        "; hollow: compiled footprint of such a point" if key == "peak_bytes" else "")
    axes.set_xlabel("sequence length")
    axes.set_ylabel(ylabel)
    axes.set_title(f"{mode}: {ylabel}\n{note}", fontsize=10)
    axes.grid(True, which="both", alpha=0.3)
    if axes.lines:
      axes.legend()
    figure.tight_layout()
    figure.savefig(os.path.join(out_dir, name), dpi=110)
    plt.close(figure)


# ---------------------------------------------------------------------------------------------
# Entry point.


_POINT_RESULT = flags.DEFINE_string("point_result", None,
                                    "Internal: where the point subprocess writes its result.")


def _default_config():
  from textattn import defaults
  return defaults.classification()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
  if _POINT_SPEC.value:
    with open(_POINT_SPEC.value) as f:
      run_point(json.load(f), _POINT_RESULT.value)
    return

  config = _CONFIG.value if _CONFIG.value is not None else _default_config()
  mode = _MODE.value
  given = {"variants": _VARIANTS.value, "seq_lens": _SEQ_LENS.value,
           "batch_size": _BATCH_SIZE.value, "embed_dim": _EMBED_DIM.value,
           "num_heads": _NUM_HEADS.value, "num_layers": _NUM_LAYERS.value,
           "dtype": _DTYPE.value, "vocab_size": _VOCAB_SIZE.value}
  out_dir = _OUT_DIR.value or os.path.join(
      "runs", "benchmark", time.strftime("%Y%m%d-%H%M%S", time.gmtime()))
  try:
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
      raise ValueError(f"--out_dir={out_dir} exists and is not a directory; give a new "
                       f"or an existing directory.")
    existing = [name for name in OUTPUTS if os.path.exists(os.path.join(out_dir, name))]
    if existing and not _OVERWRITE.value:
      raise ValueError(f"--out_dir={out_dir} already holds results ({', '.join(existing)}); "
                       f"give a new --out_dir, or --overwrite to replace them.")
    if _WARMUP.value < 0 or _REPEATS.value < 1:
      raise ValueError(f"--warmup={_WARMUP.value} must be >= 0 and --repeats={_REPEATS.value} "
                       ">= 1.")
    settings = resolve_settings(config, mode, given)
    injections = parse_injections(_INJECT_FAILURE.value)
    specs = plan_points(
        config, settings, mode, warmup=_WARMUP.value, repeats=_REPEATS.value,
        time_budget_s=_POINT_TIME_BUDGET_S.value, memory_limit_gb=_POINT_MEMORY_LIMIT_GB.value,
        check_against_reference=_CHECK_AGAINST_REFERENCE.value, seed=_SEED.value,
        num_classes=_NUM_CLASSES.value, injections=injections, lengths=_LENGTHS.value)
    import ml_collections

    from textattn import models
    for spec in specs:  # the config errors a point would hit, once, before any point runs
      models.validate_model_config(ml_collections.ConfigDict(json.loads(spec["config"])))
  except ValueError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(1)

  command = "python -m textattn.benchmark " + " ".join(sys.argv[1:])
  rows = run_sweep(specs, timeout_s=_POINT_TIMEOUT_S.value, out_dir=out_dir, command=command)
  if mode == "train_step":
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
  print("Wrote " + ", ".join(os.path.join(out_dir, name) for name in OUTPUTS))


if __name__ == "__main__":
  app.run(main)
