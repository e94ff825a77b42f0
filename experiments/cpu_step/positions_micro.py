"""Issue 56 micro-benchmark: the positions gradient (four gradients summed, then reduced over the batch axis of [32, 200, 32]) as XLA:CPU reduce against a ones-vector matmul. Best of 300 alternated calls, us.
    XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= python experiments/cpu_step/positions_micro.py
"""
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

rng = np.random.default_rng(0)
a, b, c, d = (jnp.asarray(rng.standard_normal((32, 200, 32)), jnp.float32) for _ in range(4))
def red(a, b, c, d): return jnp.sum(a + b + c + d, axis=0)
def dot(a, b, c, d):
  g = a + b + c + d
  ones = lax.optimization_barrier(jnp.ones((32,), jnp.float32))
  return (ones @ g.reshape(32, -1)).reshape(200, 32)
def dot_nb(a, b, c, d):
  g = a + b + c + d
  return (jnp.ones((32,), jnp.float32) @ g.reshape(32, -1)).reshape(200, 32)
fs = {k: jax.jit(f) for k, f in (("reduce", red), ("dot", dot), ("dot_nobarrier", dot_nb))}
print({k: float(jnp.max(jnp.abs(f(a, b, c, d) - fs["reduce"](a, b, c, d)))) for k, f in fs.items()})
best = {k: 1e9 for k in fs}
for _ in range(300):
  for k, f in fs.items():
    t = time.perf_counter(); jax.block_until_ready(f(a, b, c, d)); best[k] = min(best[k], time.perf_counter() - t)
print({k: round(v * 1e6) for k, v in best.items()})
