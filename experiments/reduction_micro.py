"""How fast XLA:CPU sums: the forms of one reduction, each jitted alone, best of 3 x N calls.

    python experiments/reduction_micro.py

(1) a [32, 200, 32] activation summed over its first two axes (a bias gradient of the seed
model): plain reduce (XLA:CPU turns it into a reduce-window tree), the same with YNNPACK
reductions, a dot with a ones vector; (2) the 20,000 x 32 embedding table reduced to a scalar
(train_step's metrics): sum of squares and count of non-finite entries, plainly and as sums of
32 consecutive elements at a time (train._sum_all).
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

from textattn import train

NO_YNN = {"xla_cpu_experimental_ynn_fusion_type": ""}
YNN_REDUCE = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_REDUCE"}


def best_microseconds(f, *args, calls=500):
  jax.block_until_ready(f(*args))
  best = float("inf")
  for _ in range(3):
    start = time.perf_counter()
    for _ in range(calls):
      out = f(*args)
    jax.block_until_ready(out)
    best = min(best, (time.perf_counter() - start) / calls * 1e6)
  return best


def main():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((32, 200, 32)), jnp.float32)
  ones = jnp.ones((6400,), jnp.float32)
  for name, options in (("no YNNPACK", NO_YNN), ("YNNPACK reductions", YNN_REDUCE)):
    reduce = jax.jit(lambda x: x.sum((0, 1)), compiler_options=options)
    print(f"[32,200,32] -> [32], {name}: reduce {best_microseconds(reduce, x):.1f} us")
  dot = jax.jit(lambda x, o: o @ x.reshape(6400, 32), compiler_options=NO_YNN)
  print(f"[32,200,32] -> [32], no YNNPACK: dot with ones {best_microseconds(dot, x, ones):.1f} us")
  table = jnp.asarray(rng.standard_normal((20000, 32)), jnp.float32)
  forms = {
      "sum of squares, jnp.sum": lambda t: jnp.sum(t * t),
      "sum of squares, _sum_all": lambda t: train._sum_all(t * t),
      "non-finite count, jnp.sum": lambda t: jnp.sum(~jnp.isfinite(t)),
      "non-finite count, _sum_all": lambda t: train._sum_all((~jnp.isfinite(t)).astype(jnp.int32)),
  }
  for name, f in forms.items():
    print(f"[20000,32] -> scalar, {name}: "
          f"{best_microseconds(jax.jit(f, compiler_options=NO_YNN), table):.1f} us")


if __name__ == "__main__":
  main()
