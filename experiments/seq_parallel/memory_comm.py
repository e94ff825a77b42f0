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
collective in the compiled HLO, against the formulas stated in textattn/benchmark/collectives.py
(the layer is compiled by textattn/benchmark/layer_cost.py, shared with longest.py and the
benchmark's --mesh).
"""

from __future__ import annotations

import argparse
import json

import jax

from textattn import sharding
from textattn.attention import sequence
from textattn.benchmark import layer_cost


def measure(name: str, shards: int, batch: int, length: int, embed: int, heads: int) -> dict:
  """One row: the sharded module on 1 x S devices (at S = 1 too), float32."""
  return layer_cost.layer_cost(name, sharding.make_mesh(1, shards), batch, length, embed, heads,
                               always_sharded=True)


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
