"""Issue 43's moonshot: forward + backward of one additive attention layer over 1,048,576 tokens,
the length split over 8 CPU devices, and the same on one device, compared.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \
      python experiments/seq_parallel/moonshot.py --length=1048576 > experiments/seq_parallel/moonshot.txt

The layer is textattn's "additive" module (query/key projections, the Fastformer core, output
projection and residual), batch 1, embed 16, 2 heads, float32; the loss is sum(output *
cotangent) with a fixed random cotangent, its gradient taken with respect to the parameters and
the input. The last 1000 tokens are padding. Reported: compile and run times (the second call,
after a warm-up; 8 fake devices share this machine's cores, so the time says nothing about 8
real devices), per-device memory from compiled.memory_analysis(), and the largest differences
from the one-device program (implementation "xla"), relative to the largest value compared.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from textattn import attention, sharding
from textattn.attention import sequence


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--length", type=int, default=1 << 20)
  parser.add_argument("--embed", type=int, default=16)
  parser.add_argument("--heads", type=int, default=2)
  parser.add_argument("--shards", type=int, default=8)
  args = parser.parse_args()
  length, embed = args.length, args.embed
  variant = attention.get("additive")
  kwargs = {"num_heads": args.heads, "implementation": "xla", "name": "attention"}
  params = variant.build(**kwargs).init(jax.random.key(0), jnp.zeros((1, 8, embed)),
                                        jnp.ones((1, 8), bool))
  x = jax.random.normal(jax.random.key(1), (1, length, embed), jnp.float32)
  cotangent = jax.random.normal(jax.random.key(2), (1, length, embed), jnp.float32)
  mask = (jnp.arange(length) < length - 1000)[None]
  print(f"additive attention, 1 layer, length {length:,}, batch 1, embed {embed}, "
        f"{args.heads} heads, float32, forward + backward; {jax.device_count()} CPU devices")

  results = {}
  for label, mesh in (("sharded", sharding.make_mesh(1, args.shards)),
                      ("one device", sharding.make_mesh(1, 1))):
    module = sequence.build(variant, mesh, **kwargs) if label == "sharded" else (
        variant.build(**kwargs))
    tokens = sharding.length_sharding(mesh, 3)
    placed = (jax.device_put(params, jax.NamedSharding(mesh, jax.P())),
              jax.device_put(x, tokens),
              jax.device_put(mask, sharding.length_sharding(mesh, 2)),
              jax.device_put(cotangent, tokens))

    def loss(params, x, mask, cotangent, module=module):
      out = module.apply(params, x, mask)
      return jnp.sum(out * cotangent), out

    step = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))
    start = time.perf_counter()
    compiled = step.lower(*placed).compile()
    compile_s = time.perf_counter() - start
    memory = compiled.memory_analysis()
    footprint = (memory.argument_size_in_bytes + memory.output_size_in_bytes
                 + memory.temp_size_in_bytes - memory.alias_size_in_bytes)
    jax.block_until_ready(compiled(*placed))  # warm-up
    start = time.perf_counter()
    grads, out = jax.block_until_ready(compiled(*placed))
    run_s = time.perf_counter() - start
    results[label] = jax.device_get((grads, out))  # (compared on the host)
    print(f"{label:>10}: compile {compile_s:.1f} s, forward + backward {run_s:.2f} s, "
          f"per-device memory {footprint / 2**20:.1f} MiB (arguments "
          f"{memory.argument_size_in_bytes / 2**20:.1f}, outputs "
          f"{memory.output_size_in_bytes / 2**20:.1f}, temp {memory.temp_size_in_bytes / 2**20:.1f})",
          flush=True)

  (grads, out), (grads_one, out_one) = results["sharded"], results["one device"]

  def relative(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))

  print(f"output: max |sharded - one device| / max |one device| = {relative(out, out_one):.2e}")
  print(f"input gradient: {relative(grads[1], grads_one[1]):.2e}")
  print("parameter gradients: " + ", ".join(
      f"{'/'.join(str(k.key) for k in path[1:])} {relative(a, b):.2e}"
      for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads[0]),
                              jax.tree.leaves(grads_one[0]))))


if __name__ == "__main__":
  main()
