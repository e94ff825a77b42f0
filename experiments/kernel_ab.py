"""A/B of fused-kernel rearrangements (fwd + bwd of the attention core alone), interleaved in one
process so the variants share the machine's load. See experiments/RESULTS.md ("Also tried").

    python experiments/kernel_ab.py [batch]     # 16 = one device's share of the 2-device seed step
"""

import os
import sys, time, functools
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jax, jax.numpy as jnp, numpy as np
from textattn import attention as A

def fwd_v2(q, k, v, padding_mask, causal):
  scores = jnp.matmul(q, jnp.swapaxes(k, -1, -2), preferred_element_type=jnp.float32)
  scores = scores + A._mask_bias(padding_mask, causal, q.shape[2])
  unnormalised = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
  ones = jnp.ones(v.shape[:-1] + (1,), v.dtype)
  out_aug = jnp.matmul(unnormalised.astype(v.dtype), jnp.concatenate([v, ones], -1), preferred_element_type=jnp.float32)
  row_sum = out_aug[..., -1:]
  out = (out_aug[..., :-1] / row_sum).astype(v.dtype)
  return out, (q, k, v, unnormalised, row_sum, out)

def bwd_v2(causal, residuals, d_out):
  q, k, v, unnormalised, row_sum, out = residuals
  f32 = jnp.float32
  d_out = d_out.astype(f32) / row_sum
  # natural layouts: dV^T = dO^T P, dK^T = Q^T dS
  d_v = jnp.swapaxes(jnp.matmul(jnp.swapaxes(d_out, -1, -2), unnormalised), -1, -2)
  d_weights = jnp.matmul(d_out, jnp.swapaxes(v, -1, -2).astype(f32))
  d_scores = unnormalised * (d_weights - jnp.sum(d_out * out.astype(f32), -1, keepdims=True))
  d_q = jnp.matmul(d_scores, k.astype(f32))
  d_k = jnp.swapaxes(jnp.matmul(jnp.swapaxes(q.astype(f32), -1, -2), d_scores), -1, -2)
  return d_q.astype(q.dtype), d_k.astype(k.dtype), d_v.astype(v.dtype), None

def make(fwd, bwd):
  @functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
  def core(q, k, v, m, causal): return fwd(q, k, v, m, causal)[0]
  core.defvjp(fwd, bwd)
  return core

variants = {
 "cur": make(A._fused_forward, A._fused_backward),
 "augV": make(fwd_v2, A._fused_backward),
 "natbwd": make(A._fused_forward, bwd_v2),
 "both": make(fwd_v2, bwd_v2),
}
B = int(sys.argv[1]) if len(sys.argv) > 1 else 16
rng = np.random.default_rng(0)
q, k, v = [jnp.asarray(rng.standard_normal((B, 2, 200, 16)), jnp.float32) for _ in range(3)]
lengths = rng.integers(50, 201, B)
mask = jnp.asarray(np.arange(200)[None] < lengths[:, None])
fns = {}
for name, core in variants.items():
  f = jax.jit(jax.value_and_grad(lambda q, k, v, core=core: jnp.sum(core(q, k, v, mask, False) * v), argnums=(0, 1, 2)))
  r = f(q, k, v); jax.block_until_ready(r); fns[name] = (f, r)
ref = fns["cur"][1]
for name, (f, r) in fns.items():
  err = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(r), jax.tree.leaves(ref)))
  print(name, "maxdiff", err)
times = {n: [] for n in fns}
for _ in range(7):
  for name, (f, _) in fns.items():
    t = time.perf_counter()
    for _ in range(20): r = f(q, k, v)
    jax.block_until_ready(r); times[name].append((time.perf_counter() - t) / 20)
for n, ts in times.items(): print(f"{n:8s} {np.median(ts)*1e3:.2f} ms")
