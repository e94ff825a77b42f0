"""The longest sequence whose forward + backward fits a per-device memory budget, per attention
variant and number of sequence shards, read from compiled programs on fake CPU devices
(issue 43): compiled memory, nothing is run, and no GPU is involved.

    XLA_FLAGS="--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0" \
      JAX_PLATFORMS=cpu python experiments/seq_parallel/longest.py \
      --json=experiments/seq_parallel/longest.json > experiments/seq_parallel/longest.txt

The layer: one attention layer (projections + core + output projection) of each variant that
declares sequence sharding, forward + backward (gradient of sum(output * cotangent) with respect
to the parameters and the input), at the length benchmark's default sizes (python -m
textattn.benchmark: batch 4, embed 256, 4 heads of 64, float32), on a 1 x S mesh of the fake
devices, S = 1, 2, 4, 8. S = 1 is what a run without sequence sharding builds (the registry's
one-device module, its reference "xla" implementation); S > 1 the sequence-sharded module
(textattn/attention/sequence.py). Compiled by textattn/benchmark/layer_cost.py, as memory_comm.py.

"Fits": the per-device footprint of the compiled program, argument_size_in_bytes +
output_size_in_bytes + temp_size_in_bytes - alias_size_in_bytes of compiled.memory_analysis(),
is at most the budget (default 80 GiB = 85,899,345,920 bytes, an H100's memory; a real GPU also
holds the CUDA context and XLA's own reserve, and its compiler may assign buffers differently,
so this is an upper bound read on CPU, not a GPU measurement).

Search, per (variant, S), over lengths on a grid of multiples of G = 1024 x S (1024 tokens a
device; a multiple of 2S, as the causal zig-zag layout needs): doubling from G until a length
does not fit (a step may go further than double, to where a straight line through the last two
probes' memory meets the budget, rounded up to the grid), then bisection of that bracket
[fits, does not fit] until it is one grid step wide. A bisection probe is the grid point below
where the straight line between the bracket's two memories meets the budget (clamped inside the
bracket), or the midpoint when the previous probe did not halve the bracket. Reported: the last
length that fits (and its memory) and the first that does not, both compiled; this assumes
memory grows with length, which every probe is checked against (a violation is printed).
--backend_optimization_level=0 in XLA_FLAGS only shortens LLVM's code generation (the recurrent
scan takes ~80 s a compile without it): buffer assignment, and so memory_analysis, is the same
(longest_check.txt reruns softmax, causal and additive at S = 8 without the flag: every probe's
bytes equal longest.json's). --dtype=bfloat16: longest_bf16.txt (softmax, causal, additive).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time

import jax

from textattn import sharding
from textattn.attention import sequence
from textattn.benchmark import layer_cost

GIB = 2**30


def grid_up(length: float, grid: int) -> int:
  return max(grid, math.ceil(length / grid) * grid)


def grid_down(length: float, grid: int) -> int:
  return max(grid, math.floor(length / grid) * grid)


def crossing(a: tuple[int, int], b: tuple[int, int], budget: int) -> float:
  """Where the straight line through (length, memory) points a and b meets the budget."""
  (la, ma), (lb, mb) = a, b
  if mb == ma:
    return math.inf
  return la + (budget - ma) * (lb - la) / (mb - ma)


def longest(measure, grid: int, budget: int, max_length: int) -> dict:
  """Doubling then bisection (module docstring) of measure(length) -> bytes on multiples of
  `grid`. Returns the probes and the bracket: fits (longest length that fits, or 0) and
  too_long (shortest that does not, or None if max_length fits)."""
  probes: dict[int, int] = {}

  def probe(length):
    if length not in probes:
      probes[length] = measure(length)
    return probes[length]

  fits, too_long = 0, None
  length = grid
  while too_long is None:  # doubling
    if probe(length) > budget:
      too_long = length
      break
    fits = length
    if length >= max_length:
      break
    step = 2 * length
    if len(probes) >= 2:  # the straight line through the last two probes
      last = sorted(probes.items())[-2:]
      step = max(step, grid_up(crossing(*last, budget), grid))
    length = min(step, grid_down(max_length, grid))
  width = None
  while too_long is not None and too_long - fits > grid:  # bisection
    lo_memory = probes[fits] if fits else 0
    guess = crossing((fits, lo_memory), (too_long, probes[too_long]), budget)
    length = grid_down(guess, grid) if math.isfinite(guess) else fits + grid
    if width is not None and too_long - fits > width / 2:
      length = grid_down((fits + too_long) / 2, grid)  # the last probe did not halve it
    width = too_long - fits
    length = min(max(length, fits + grid), too_long - grid)
    if probe(length) > budget:
      too_long = length
    else:
      fits = length
  ordered = sorted(probes.items())
  monotone = all(a[1] <= b[1] for a, b in itertools.pairwise(ordered))
  return {"fits": fits, "too_long": too_long, "probes": ordered, "monotone": monotone}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--variants", default=",".join(sequence.SHARDED_BUILDS))
  parser.add_argument("--shards", default="1,2,4,8")
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--embed", type=int, default=256)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--dtype", default="float32", choices=sorted(layer_cost.DTYPES))
  parser.add_argument("--budget_gib", type=float, default=80.0)
  parser.add_argument("--max_length", type=int, default=2**27,
                      help="the search stops here (reported as '>= max')")
  parser.add_argument("--json", default="")
  args = parser.parse_args()
  budget = int(args.budget_gib * GIB)
  shard_counts = [int(s) for s in args.shards.split(",")]
  print(f"{jax.device_count()} {jax.devices()[0].platform} devices (fake: compiled memory, "
        f"nothing run); one layer forward + backward, batch {args.batch}, embed {args.embed}, "
        f"{args.heads} heads of {args.embed // args.heads}, {args.dtype}; budget "
        f"{args.budget_gib:g} GiB per device; grid 1024 x S tokens\n", flush=True)
  results = []
  for name in args.variants.split(","):
    for shards in shard_counts:
      mesh = sharding.make_mesh(1, shards)
      seconds = []

      def measure(length, name=name, mesh=mesh, seconds=seconds):
        start = time.perf_counter()
        row = layer_cost.layer_cost(name, mesh, args.batch, length, args.embed, args.heads,
                                    args.dtype, communication=False)
        seconds.append(time.perf_counter() - start)
        return row["footprint"]

      found = longest(measure, 1024 * shards, budget, args.max_length)
      found.update(variant=name, S=shards, compile_s=round(sum(seconds), 1),
                   batch=args.batch, embed=args.embed, heads=args.heads, dtype=args.dtype,
                   budget=budget)
      results.append(found)
      memory = dict(found["probes"])
      fits = (f"{found['fits']:,} ({memory[found['fits']] / GIB:.2f} GiB)" if found["fits"]
              else f"< {1024 * shards:,}")
      too_long = (f"{found['too_long']:,} ({memory[found['too_long']] / GIB:.2f} GiB)"
                  if found["too_long"] else f"> {args.max_length:,} (not searched)")
      print(f"{name} S={shards}: fits {fits}, does not fit {too_long}; "
            f"{len(found['probes'])} compiles, {found['compile_s']} s"
            + ("" if found["monotone"] else "; MEMORY NOT MONOTONE IN LENGTH"), flush=True)
  print(f"\nLongest total length (tokens) whose one-layer forward + backward fits "
        f"{args.budget_gib:g} GiB per device (compiled memory on CPU devices, not measured on a "
        f"GPU); x: the ratio to one device\n")
  print("| variant | " + " | ".join(f"S = {s}" for s in shard_counts) + " |")
  print("|---|" + "---|" * len(shard_counts))
  for name in args.variants.split(","):
    rows = {r["S"]: r for r in results if r["variant"] == name}
    base = rows[shard_counts[0]]["fits"]
    cells = []
    for shards in shard_counts:
      fits = rows[shards]["fits"]
      ratio = f" ({fits / base:.1f}x)" if base and shards != shard_counts[0] else ""
      cells.append(f"{fits:,}{ratio}" if fits else "< grid")
    print(f"| {name} | " + " | ".join(cells) + " |")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
