"""Per-device memory and communication of one sequence-sharded attention layer, read from the
compiled programs (issue 43), on fake CPU devices: nothing is run, only compiled.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \
      python experiments/seq_parallel/memory_comm.py --length=16384 > experiments/seq_parallel/memory_comm.txt

One layer (projections + attention core + output projection) of every variant that declares
sequence sharding, forward and backward (gradient of sum(output * cotangent) with respect to
the parameters and the input), batch 1, embed 64, 4 heads (head_dim 16), float32, at a fixed
total length, on a mesh of 1 x S devices for S = 1, 2, 4, 8. S = 1 is the same sharded module on
one device (for softmax: the ring with a single block, i.e. exact attention whose custom VJP
recomputes the scores; the registry's one-device "xla" kernel needs more).

Memory (per device, from compiled.memory_analysis()): footprint = arguments + outputs + temp -
aliased. The parameters (replicated on every device) enter twice, as an argument and as their
gradient (an output): `params` is their bytes, and activation = footprint - 2 x params.

Communication (per device, one layer, forward + backward): the operand bytes of every
collective in the compiled HLO (all-reduce and collective-permute: the result's size; all-gather:
the result / S; reduce-scatter: the result x S), against these formulas, with B batch, H heads,
D head_dim, n = length / S, f = 4 bytes (float32), P parameters, KV = B n H D f (one shard's
keys or values) and MK = B n (its padding mask, 1 byte a token):
  additive:      2 rounds x (pmax B H + psum B H (D + 1)) f forward, 2 x psum B H D f backward
                 (the cotangents of the global query and key) = (4 B H D + 4 B H) f
  recurrent:     2 rounds x all_gather of the shard totals B H (D + 2) f forward; backward the
                 transposes, reduce-scatters of S x that = 2 (1 + S) B H (D + 2) f
  softmax ring:  forward (S - 1)(2 KV + MK); backward (S - 1)(2 KV + MK) for the blocks and
                 S x 2 KV for their gradients (the last pass brings them home)
  causal ring:   the softmax ring's, plus the zig-zag reorder of q, k, v, mask and out and, in
                 the backward pass, of their gradients: 8 KV + MK
  every variant: + P f (the parameter gradients' all-reduce over the sequence axis, the one
                 data parallelism does too) + f (the loss, a sum over shards)
"""

from __future__ import annotations

import argparse
import json
import re

import jax
import jax.numpy as jnp
import numpy as np

from textattn import attention, sharding
from textattn.attention import sequence

COLLECTIVE = re.compile(r"=\s*(\(.*?\)|\S+)\s+(all-reduce|all-gather|collective-permute|"
                        r"reduce-scatter|all-to-all)(-start)?\(")
SHAPE = re.compile(r"(pred|s8|u8|s32|u32|f16|bf16|f32|f64|s64)\[([\d,]*)\]")
BYTES = {"pred": 1, "s8": 1, "u8": 1, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
         "f64": 8, "s64": 8}


def shape_bytes(text: str) -> int:
  return sum(BYTES[dtype] * int(np.prod([int(d) for d in dims.split(",") if d]))
             for dtype, dims in SHAPE.findall(text))


def collective_bytes(hlo: str, shards: int) -> dict[str, int]:
  """Operand bytes per collective kind in a compiled module's text."""
  totals: dict[str, int] = {}
  for line in hlo.splitlines():
    match = COLLECTIVE.search(line)
    if match is None:
      continue
    result, kind = match.group(1), match.group(2)
    size = shape_bytes(result)
    if kind == "all-gather":
      size //= shards
    elif kind == "reduce-scatter":
      size *= shards
    totals[kind] = totals.get(kind, 0) + size
  return totals


def formula(name: str, batch: int, length: int, heads: int, head_dim: int, shards: int,
            param_count: int) -> int:
  f = 4
  n = length // shards
  kv, mk = batch * n * heads * head_dim * f, batch * n
  bh = batch * heads
  core = {
      "additive": (4 * bh * head_dim + 4 * bh) * f,
      "causal_additive_recurrent": 2 * (1 + shards) * bh * (head_dim + 2) * f,
      "softmax": 2 * (shards - 1) * (2 * kv + mk) + shards * 2 * kv,
      "causal": 2 * (shards - 1) * (2 * kv + mk) + shards * 2 * kv + 8 * kv + mk,
  }[name]
  if shards == 1:
    return 0  # one device: no collective at all
  return core + param_count * f + f


def measure(name: str, shards: int, batch: int, length: int, embed: int, heads: int) -> dict:
  mesh = sharding.make_mesh(1, shards)
  module = attention.get(name).shard(mesh=mesh, num_heads=heads, name="attention")
  tokens = sharding.length_sharding(mesh, 3)
  x = jax.ShapeDtypeStruct((batch, length, embed), jnp.float32, sharding=tokens)
  mask = jax.ShapeDtypeStruct((batch, length), jnp.bool_,
                              sharding=sharding.length_sharding(mesh, 2))
  small = (jnp.zeros((batch, 2 * shards, embed)), jnp.ones((batch, 2 * shards), bool))
  param_shapes = jax.eval_shape(module.init, jax.random.key(0), *small)
  replicated = jax.NamedSharding(mesh, jax.P())
  params = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=replicated),
                        param_shapes)
  param_count = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))

  def loss(params, x, mask, cotangent):
    return jnp.sum(module.apply(params, x, mask) * cotangent)

  compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(params, x, mask,
                                                                     x).compile()
  memory = compiled.memory_analysis()
  footprint = (memory.argument_size_in_bytes + memory.output_size_in_bytes
               + memory.temp_size_in_bytes - memory.alias_size_in_bytes)
  param_bytes = 4 * param_count
  comm = collective_bytes(compiled.as_text(), shards)
  head_dim = embed // heads
  return {"variant": name, "S": shards, "length": length, "footprint": int(footprint),
          "params": param_bytes, "activation": int(footprint - 2 * param_bytes),
          "temp": int(memory.temp_size_in_bytes), "comm": comm,
          "comm_total": sum(comm.values()),
          "comm_formula": formula(name, batch, length, heads, head_dim, shards, param_count)}


def mib(x: float) -> str:
  return f"{x / 2**20:.2f}"


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--length", type=int, default=16384)
  parser.add_argument("--embed", type=int, default=64)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--variants", default=",".join(sequence.SHARDED_BUILDS))
  parser.add_argument("--json", default="")
  args = parser.parse_args()
  rows = []
  print(f"{jax.device_count()} {jax.devices()[0].platform} devices; length {args.length}, "
        f"batch {args.batch}, embed {args.embed}, heads {args.heads}; forward + backward of "
        f"one layer; MiB per device; comm = collective operand bytes per device per layer\n")
  print("| variant | S | footprint | params | activation | M(1)/M(S) | 0.8 S | comm (HLO) | "
        "comm (formula) | HLO/formula |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  for name in args.variants.split(","):
    base = None
    for shards in (1, 2, 4, 8):
      row = measure(name, shards, args.batch, args.length, args.embed, args.heads)
      rows.append(row)
      base = base or row["activation"]
      ratio = base / row["activation"]
      # (One device: the collectives in its program move nothing; no formula.)
      check = (f"{row['comm_total'] / row['comm_formula']:.3f}" if row["comm_formula"]
               else "-")
      expected = f"{row['comm_formula']:,}" if row["comm_formula"] else "-"
      print(f"| {name} | {shards} | {mib(row['footprint'])} | {mib(row['params'])} | "
            f"{mib(row['activation'])} | {ratio:.2f} | {0.8 * shards:.1f} | "
            f"{row['comm_total']:,} | {expected} | {check} |", flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
