"""Issue 56 micro-benchmark: a bias-style row sum ([6400, 32] -> [32], fused producer) as XLA:CPU reduce (reduce-window tree) against a ones-vector matmul. Best of 300 alternated calls, us.
    XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= python experiments/cpu_step/rowsum_micro.py
"""
import time

import jax
import jax.numpy as jnp
import numpy as np

rng = np.random.default_rng(0)
a, b = (jnp.asarray(rng.standard_normal((32, 200, 32)), jnp.float32) for _ in range(2))
def red(a, b): return jnp.sum(a * b, axis=(0, 1))
def dot(a, b):
  g = (a * b).reshape(-1, 32)
  return jnp.matmul(jnp.ones((g.shape[0],), jnp.float32), g, preferred_element_type=jnp.float32)
fs = {k: jax.jit(f) for k, f in (("reduce", red), ("dot", dot))}
print({k: float(jnp.max(jnp.abs(f(a, b) - fs["reduce"](a, b)))) for k, f in fs.items()})
best = {k: 1e9 for k in fs}
for _ in range(300):
  for k, f in fs.items():
    t = time.perf_counter(); jax.block_until_ready(f(a, b)); best[k] = min(best[k], time.perf_counter() - t)
print({k: round(v * 1e6) for k, v in best.items()})
print(fs["reduce"].lower(a, b).compile().as_text().count("reduce-window"))
