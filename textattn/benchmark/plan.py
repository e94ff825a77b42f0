"""The sweep's plan (parent process; never touches a device): variant names, sizes, one spec per
point.

A variant name is `<attention>` (its reference implementation) or `<attention>_<implementation>`
for any attention in the registry (textattn.attention, plus what --plugin modules register) and
any implementation it accepts.
"""

from __future__ import annotations

import math
import os
from typing import Any

from textattn import attention as registry
from textattn.attention import sequence

# (The flags' choices live in options.py, which --help reads without loading the registry.)
from textattn.benchmark.options import (
  DECODE_DEFAULTS,
  INJECTABLE_FAILURES,
  LENGTHS,
  MESH_MODES,
  SYNTHETIC_DEFAULTS,
)
from textattn.data.tokenizer import vocab_size_for
from textattn.errors import UsageError


def parse_variant(name: str) -> tuple[str, str]:
  """'softmax_chunked' -> ('softmax', 'chunked'); 'additive' -> ('additive', 'xla').

  Registered attention names may contain underscores: the longest registered name that `name`
  starts with (followed by "_" and one of its implementations) wins."""
  if name in registry.names():
    return name, registry.get(name).reference
  for attention in sorted(registry.names(), key=len, reverse=True):
    implementation = name[len(attention) + 1:]
    if (name.startswith(attention + "_")
        and implementation in registry.get(attention).implementations):
      return attention, implementation
  # One sentence: the implementations of the attention the name starts with, if any; where the
  # attentions are listed, not all of them (with every implementation, they filled 617 chars).
  prefixes = [a for a in registry.names() if name.startswith(a + "_")]
  if prefixes:
    attention = max(prefixes, key=len)
    raise UsageError(
        f"--variants: {name!r} is not a known variant; give {attention}_<impl> with <impl> one "
        f"of {', '.join(registry.get(attention).implementations)}, or another attention from "
        f"textattn.attention's registry, as `python -m textattn.benchmark --help` lists them.")
  raise UsageError(
      f"--variants: {name!r} is not a known variant; give <attention> or "
      f"<attention>_<implementation> from textattn.attention's registry, as `python -m "
      f"textattn.benchmark --help` lists them (--plugin=MODULE registers more).")


def variant_name(attention: str, implementation: str) -> str:
  """The inverse of parse_variant: the bare name for the attention's reference implementation."""
  if implementation == registry.get(attention).reference:
    return attention
  return f"{attention}_{implementation}"


def check_limits(*, point_timeout_s: float, point_time_budget_s: float,
                 point_memory_limit_gb: float, num_classes: int) -> None:
  """ValueError (one sentence naming the flag, its value and what is allowed) for a limit
  that is not a finite number in its range (NaN and infinity included)."""
  if not (point_timeout_s > 0 and math.isfinite(point_timeout_s)):
    raise UsageError(f"--point_timeout_s={point_timeout_s:g} must be a positive number of "
                     f"seconds (the wall-clock limit of one point's subprocess).")
  if not (point_time_budget_s >= 0 and math.isfinite(point_time_budget_s)):
    raise UsageError(f"--point_time_budget_s={point_time_budget_s:g} must be a number of "
                     f"seconds >= 0 (0 = no budget: always --warmup + --repeats calls).")
  if not (point_memory_limit_gb >= 0 and math.isfinite(point_memory_limit_gb)):
    raise UsageError(f"--point_memory_limit_gb={point_memory_limit_gb:g} must be a number of "
                     f"GiB >= 0 (0 = no limit).")
  if num_classes < 2:
    raise UsageError(f"--num_classes={num_classes} must be an integer >= 2.")


def parse_int_list(text: str, flag: str) -> list[int]:
  try:
    values = [int(part) for part in text.split(",") if part.strip()]
  except ValueError:
    values = []
  if not values or min(values) < 1:
    raise UsageError(f"--{flag}={text!r} must be a comma list of positive integers.")
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
      raise UsageError(f"--inject_failure: {item!r} must be variant@seq_len=kind with kind one "
                       f"of {', '.join(INJECTABLE_FAILURES)}.")
    injections[key] = kind
  return injections


def parse_mesh(text: str) -> tuple[int, int] | None:
  """--mesh: "data:D,sequence:S" -> (D, S); "" -> None (no mesh: one device's modules)."""
  if not text:
    return None
  sizes = {}
  for part in text.split(","):
    name, _, value = part.strip().partition(":")
    if name in sizes or not value.isdigit() or int(value) < 1:
      sizes = None
      break
    sizes[name] = int(value)
  if sizes is None or sorted(sizes) != ["data", "sequence"]:
    raise UsageError(f"--mesh={text!r} must be data:D,sequence:S with D and S positive integers "
                     f"(e.g. data:1,sequence:4: the batch split over D devices, the length "
                     f"over S).")
  return sizes["data"], sizes["sequence"]


def check_mesh_mode(mesh: tuple[int, int] | None, mode: str) -> None:
  if mesh is not None and mode not in MESH_MODES:
    raise UsageError(f"--mesh applies to the modes {', '.join(MESH_MODES)}; --mode={mode} runs "
                     f"without one.")


def check_mesh(mesh: tuple[int, int] | None, mode: str, settings: dict[str, Any]) -> None:
  """UsageError (one sentence) for a --mesh the benchmark cannot run: its mode, a variant
  without sequence sharding or not by its bare name, a batch D does not divide, or a length S
  does not divide (2S for a causal variant, as layers.pad_for_mesh pads: the causal ring's
  zig-zag layout halves each shard)."""
  if mesh is None:
    return
  data, shards = mesh
  check_mesh_mode(mesh, mode)
  if settings["batch_size"] % data:
    raise UsageError(f"--batch_size={settings['batch_size']} must be a multiple of the mesh's "
                     f"data={data}.")
  if shards == 1:
    return
  for variant in settings["variants"]:
    attention, _ = parse_variant(variant)
    if registry.get(attention).shard is None:
      raise UsageError(f"--variants: {variant!r} declares no sequence sharding, so it cannot run "
                       f"with --mesh sequence:{shards}; allowed: "
                       f"{', '.join(sequence.sharded_names())}.")
    if variant != attention:
      raise UsageError(f"--variants: with --mesh sequence:{shards} each attention runs its "
                       f"sequence-sharded core whatever the implementation, so name it "
                       f"{attention!r}, not {variant!r}.")
    unit = shards * (2 if registry.get(attention).causal else 1)
    for seq_len in settings["seq_lens"]:
      if seq_len % unit:
        raise UsageError(f"--seq_lens: {seq_len} cannot be split over sequence:{shards} for "
                         f"{variant!r}: give multiples of {unit}.")


def resolve_settings(config, mode: str, given: dict[str, Any],
                     mesh: tuple[int, int] | None = None) -> dict[str, Any]:
  """The benchmarked sizes: flags given explicitly win; otherwise the config's (train_step) or
  SYNTHETIC_DEFAULTS (the other modes; with a --mesh of sequence > 1 the variants default to
  those that declare sequence sharding)."""
  check_mesh_mode(mesh, mode)
  if mode == "train_step":
    from_config = {
        "variants": variant_name(config.model.attention, config.model.attention_impl),
        "seq_lens": str(config.max_len), "batch_size": config.batch_size,
        "embed_dim": config.model.embed_dim, "num_heads": config.model.num_heads,
        "num_layers": config.model.num_layers, "dtype": config.model.dtype,
        "vocab_size": vocab_size_for(config)}
  else:
    from_config = DECODE_DEFAULTS if mode == "decode_step" else SYNTHETIC_DEFAULTS
    if mesh is not None and mesh[1] > 1:
      from_config = {**from_config, "variants": ",".join(sequence.sharded_names())}
  settings = {name: given[name] if given.get(name) is not None else default
              for name, default in from_config.items()}
  settings["variants"] = [v.strip() for v in settings["variants"].split(",") if v.strip()]
  if not settings["variants"]:
    raise UsageError("--variants must name at least one variant.")
  for variant in settings["variants"]:
    attention, _ = parse_variant(variant)
    if mode == "decode_step" and not registry.get(attention).causal:
      raise UsageError(f"--mode=decode_step times causal decoding; {variant!r} is not causal "
                       f"(causal variants: "
                       f"{', '.join(n for n in registry.names() if registry.get(n).causal)}).")
  settings["seq_lens"] = parse_int_list(settings["seq_lens"], "seq_lens")
  for name in ("batch_size", "embed_dim", "num_heads", "num_layers", "vocab_size"):
    if settings[name] < 1:
      raise UsageError(f"--{name}={settings[name]} must be a positive integer.")
  if settings["embed_dim"] % settings["num_heads"]:
    raise UsageError(f"--num_heads={settings['num_heads']} must divide "
                     f"--embed_dim={settings['embed_dim']}.")
  check_mesh(mesh, mode, settings)
  return settings


def point_config(config, settings: dict[str, Any], variant: str, seq_len: int,
                 mesh: tuple[int, int] | None = None):
  """The config of one point: the base config with the benchmarked fields set (config.mesh's
  sequence from --mesh)."""
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
    config.mesh.sequence = mesh[1] if mesh else 1
  return config


def plan_points(config, settings: dict, mode: str, *, warmup: int = 2, repeats: int = 10,
                time_budget_s: float = 0.0, memory_limit_gb: float = 8.0,
                check_against_reference: bool = False, seed: int = 0, num_classes: int = 2,
                injections: dict | None = None, lengths: str = "half_to_full",
                plugins: tuple[str, ...] = (), profile_dir: str = "",
                mesh: tuple[int, int] | None = None) -> list[dict]:
  """One spec (everything its subprocess needs, JSON-able) per variant x length. `plugins`:
  modules the subprocess imports before building the point (--plugin); `profile_dir`: where
  the point writes its profiler trace (--profile_dir; "" = none); `mesh`: (data, sequence)
  devices the point runs on (--mesh; None = one device's modules), in the spec as "DxS"."""
  if lengths not in LENGTHS:
    raise UsageError(f"--lengths={lengths!r} is invalid; allowed: {', '.join(LENGTHS)}.")
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
          "plugins": list(plugins), "mesh": "x".join(map(str, mesh)) if mesh else "",
          "profile_dir": (os.path.join(os.path.abspath(profile_dir), f"{variant}_L{seq_len}")
                          if profile_dir else ""),
          "config": point_config(config, settings, variant, seq_len, mesh).to_json()})
  return specs
