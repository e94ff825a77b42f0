"""Bytes communicated by a compiled program, read from its HLO text, and the stated formulas for
one sequence-sharded attention layer (issue 43).

Per device, one layer, forward + backward: the operand bytes of every collective the compiled
HLO runs (all-reduce and collective-permute: the result's size; all-gather: the result / S;
reduce-scatter: the result x S), one in a while loop's body (the ring's steps) once per iteration
(`collective_bytes`). The formulas, with B the batch per device (the batch / data shards),
H heads, D head_dim, n = length / S per shard, f = 4 bytes (float32), P parameters, KV = B n H D f
(one shard's keys or values), MK = B n (its padding mask, 1 byte a token) and ID = 4 B n (its
key ids, int32: 0 for padding, else the segment's run + 1, 1 without segments):
  additive:      2 rounds x (pmax B H + psum B H (D + 1)) f forward, 2 x psum B H D f backward
                 (the cotangents of the global query and key) = (4 B H D + 4 B H) f
  recurrent:     2 rounds x all_gather of the shard totals B H (D + 2) f forward; backward the
                 transposes, reduce-scatters of S x that = 2 (1 + S) B H (D + 2) f; plus the
                 shards' last run numbers (int32, gathered once for both rounds) 4 B
  softmax ring:  forward (S - 1)(2 KV + ID); backward (S - 1)(2 KV + ID) for the blocks and
                 S x 2 KV for their gradients (the last pass brings them home)
  causal ring:   the softmax ring's, plus the zig-zag reorder of q, k, v, mask and out and, in
                 the backward pass, of their gradients: 8 KV + MK
  every variant: + P f (the parameter gradients' all-reduce, the one data parallelism does too)
                 + f (the loss, a sum over shards), on a 1 x S mesh. On a D x S mesh with D > 1,
                 XLA reduces the loss once per axis (2 f) and the parameter gradients once over
                 both axes (P f) where the projections contract over the merged batch x length
                 axis (textattn/flax_layers.py on a CPU); with flax's own layers (elsewhere) it
                 reduces the projections' gradients once per axis too, data then sequence:
                 2 (P - Pc) f + Pc f + 2 f, where Pc are the parameters the shard_map core takes
                 itself (additive and recurrent: the two scoring kernels, 2 H D H; the rings:
                 none), whose gradients shard_map sums over both axes at once
The formulas are for float32 activations (the ring sends keys and values in the compute dtype);
`formula` returns None for another dtype.
"""

from __future__ import annotations

import re

import numpy as np

COLLECTIVE = re.compile(r"=\s*(\(.*?\)|\S+)\s+(all-reduce|all-gather|collective-permute|"
                        r"reduce-scatter|all-to-all)(-start)?\(")
SHAPE = re.compile(r"(pred|s8|u8|s32|u32|f16|bf16|f32|f64|s64)\[([\d,]*)\]")
BYTES = {"pred": 1, "s8": 1, "u8": 1, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
         "f64": 8, "s64": 8}
# The variants whose communication has a formula here (sequence.SHARDED_BUILDS' names).
FORMULA_VARIANTS = ("softmax", "causal", "additive", "causal_additive_recurrent")


def shape_bytes(text: str) -> int:
  """Bytes of every array shape (e.g. "f32[4,16]", tuples included) named in `text`."""
  return sum(BYTES[dtype] * int(np.prod([int(d) for d in dims.split(",") if d]))
             for dtype, dims in SHAPE.findall(text))


# The HLO text's computations ("%name (params) -> result {" or "ENTRY %name ..." at the start of a
# line, up to a line "}") and the computations an instruction calls.
COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(")
CALLED = re.compile(r"\b(body|condition|calls|to_apply|true_computation|false_computation)="
                    r"%?([\w.\-]+)")
BRANCHES = re.compile(r"\bbranch_computations=\{([^}]*)\}")
TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def _computations(hlo: str) -> tuple[dict[str, list[str]], str]:
  """{computation name: its instruction lines} and the entry computation's name."""
  computations: dict[str, list[str]] = {}
  entry, current = "", None
  for line in hlo.splitlines():
    if line and not line[0].isspace() and line.rstrip().endswith("{"):
      match = COMPUTATION.match(line)
      if match:
        current = match.group(1)
        computations[current] = []
        entry = current if line.startswith("ENTRY") else entry
        continue
    if line.strip() == "}":
      current = None
    elif current is not None:
      computations[current].append(line)
  return computations, entry


def collective_bytes(hlo: str, shards: int) -> dict[str, int]:
  """Operand bytes per collective kind in a compiled module's text (`compiled.as_text()`);
  `shards`: the size of the gathered / scattered axis.

  Counted as the program runs them: from the entry computation down through the computations it
  calls, a while loop's body (and condition) times its trip count (XLA's known_trip_count; the
  ring's steps run in a loop), any other call (fusions, reductions) once. A collective in a
  loop without a known trip count, or inside a conditional's branch (which runs depends on the
  data), has no static byte count: ValueError."""
  computations, entry = _computations(hlo)
  if not entry:  # not a whole module: count the lines as they stand
    computations, entry = {"": hlo.splitlines()}, ""
  memo: dict[str, dict[str, int]] = {}

  def add(totals, more, times=1):
    for kind, size in more.items():
      totals[kind] = totals.get(kind, 0) + times * size

  def count(name: str) -> dict[str, int]:
    if name in memo:
      return memo[name]
    totals: dict[str, int] = {}
    for line in computations.get(name, ()):
      match = COLLECTIVE.search(line)
      if match is not None:
        result, kind = match.group(1), match.group(2)
        size = shape_bytes(result)
        if kind == "all-gather":
          size //= shards
        elif kind == "reduce-scatter":
          size *= shards
        add(totals, {kind: size})
      trip = TRIP_COUNT.search(line)
      for role, callee in CALLED.findall(line):
        inner = count(callee)
        if role in ("body", "condition") and inner:
          if trip is None:
            raise ValueError(f"collectives in while loop {callee!r} with no known trip count")
          add(totals, inner, int(trip.group(1)))
        elif role in ("true_computation", "false_computation") and inner:
          raise ValueError(f"collectives in conditional branch {callee!r}")
        else:
          add(totals, inner)
      for branches in BRANCHES.findall(line):
        for callee in branches.split(","):
          if count(callee.strip().lstrip("%")):
            raise ValueError(f"collectives in conditional branch {callee.strip()!r}")
    memo[name] = totals
    return totals

  return count(entry)


def formula(name: str, batch: int, length: int, heads: int, head_dim: int, shards: int,
            param_count: int, dtype: str = "float32", data: int = 1,
            merged_projections: bool = True) -> int | None:
  """The stated bytes per device of one layer's forward + backward (module docstring) on a
  data x shards mesh; `batch` is the batch one device holds. 0 on one device (no collective
  moves anything); None where no formula is stated (another variant or dtype, or S = 1 with
  D > 1: data parallelism alone). merged_projections: flax_layers.contracts_merged_axes()."""
  if name not in FORMULA_VARIANTS or dtype != "float32" or (shards == 1 and data > 1):
    return None
  if shards == 1:
    return 0
  f = 4
  n = length // shards
  kv, mk = batch * n * heads * head_dim * f, batch * n
  ids = 4 * mk
  bh = batch * heads
  core = {
      "additive": (4 * bh * head_dim + 4 * bh) * f,
      "causal_additive_recurrent": 2 * (1 + shards) * bh * (head_dim + 2) * f + 4 * batch,
      "softmax": 2 * (shards - 1) * (2 * kv + ids) + shards * 2 * kv,
      "causal": 2 * (shards - 1) * (2 * kv + ids) + shards * 2 * kv + 8 * kv + mk,
  }[name]
  core_params = 2 * heads * head_dim * heads if "additive" in name else 0
  axes = 2 if data > 1 else 1
  projection_axes = 1 if merged_projections else axes
  return core + (projection_axes * (param_count - core_params) + core_params) * f + axes * f
