"""Issue 56's next lever, measured alone: keras_adam's update of the seed model's 20,000 x 32
token table as train_step does it today (per-occurrence gradients and squares scattered into a
zero-filled [20000, 64] buffer, then Adam's three dense passes and the gradient-norm pass) against
a sparse update (the moments scaled by b1 / b2 and the occurrences scattered into them in place:
no zero fill, no dense gradient), and the gradient norm's cost (dense scatter + sum against a
sort-based compact one). Best of 100 alternated calls, microseconds.

    XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= python experiments/cpu_step/table_update_micro.py
"""
import time

import jax
import jax.numpy as jnp
import numpy as np

from textattn.tasks.classification.step import _sum_all

V, D, N = 20000, 32, 6400
b1, b2, eps, lr = 0.9, 0.999, 1e-7, 1e-3
rng = np.random.default_rng(0)
tok = jnp.asarray(rng.integers(0, V, N), jnp.int32); rows = jnp.asarray(rng.standard_normal((N, D)) * 1e-3, jnp.float32)
p = jnp.asarray(rng.standard_normal((V, D)), jnp.float32); mu = jnp.asarray(rng.standard_normal((V, D)) * 1e-4, jnp.float32); nu = jnp.abs(mu) * 1e-3
alpha = jnp.float32(0.3)
def dense(p, mu, nu, rows, tok):
  both = jax.ops.segment_sum(jnp.concatenate([rows, jnp.square(rows)], 1), tok, num_segments=V)
  g, s = jnp.split(both, 2, axis=1)
  mu = mu + (1 - b1) * (g - mu); nu = nu + (1 - b2) * (s - nu)
  p = p - lr * (alpha * mu / (jnp.sqrt(nu) + eps))
  return p, mu, nu, _sum_all(jnp.square(g)), _sum_all((~jnp.isfinite(p)).astype(jnp.int32))
def sparse(p, mu, nu, rows, tok):
  mu = (b1 * mu).at[tok].add((1 - b1) * rows)
  nu = (b2 * nu).at[tok].add((1 - b2) * jnp.square(rows))
  p = p - lr * (alpha * mu / (jnp.sqrt(nu) + eps))
  return p, mu, nu, jnp.float32(0), _sum_all((~jnp.isfinite(p)).astype(jnp.int32))
fs = {"dense": jax.jit(dense), "sparse": jax.jit(sparse)}
a, b = fs["dense"](p, mu, nu, rows, tok), fs["sparse"](p, mu, nu, rows, tok)
print("max |dp|", float(jnp.max(jnp.abs(a[0] - b[0]))), "max |dmu|", float(jnp.max(jnp.abs(a[1] - b[1]))))
best = {k: 1e9 for k in fs}
for _ in range(100):
  for k, f in fs.items():
    t = time.perf_counter(); jax.block_until_ready(f(p, mu, nu, rows, tok)); best[k] = min(best[k], time.perf_counter() - t)
print({k: round(v * 1e6) for k, v in best.items()})
def norm_sorted(rows, tok):
  order = jnp.argsort(tok)
  ts = tok[order]; rs = rows[order]
  seg = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum((ts[1:] != ts[:-1]).astype(jnp.int32))])
  gc = jax.ops.segment_sum(rs, seg, num_segments=N, indices_are_sorted=True)
  return jnp.sum(jnp.square(gc))
def norm_dense(rows, tok):
  g = jax.ops.segment_sum(rows, tok, num_segments=V)
  return _sum_all(jnp.square(g))
gs = {"norm_sorted": jax.jit(norm_sorted), "norm_dense": jax.jit(norm_dense)}
print({k: float(f(rows, tok)) for k, f in gs.items()})
best = {k: 1e9 for k in gs}
for _ in range(100):
  for k, f in gs.items():
    t = time.perf_counter(); jax.block_until_ready(f(rows, tok)); best[k] = min(best[k], time.perf_counter() - t)
print({k: round(v * 1e6) for k, v in best.items()})
