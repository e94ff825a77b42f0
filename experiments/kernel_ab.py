"""A/B of fused-kernel rearrangements (fwd + bwd of the attention core alone), interleaved in one
process so the variants share the machine's load. See experiments/RESULTS.md ("Also tried").

    python experiments/kernel_ab.py [batch]     # 16 = one device's share of the 2-device seed step

Variants: "cur" (textattn's fused kernel), "augV" (row sums from P·[V, 1] instead of a separate
reduction), "natbwd" (dV = (dOᵀ·P)ᵀ and dK = (Qᵀ·dS)ᵀ, the L×L operand in natural layout), "both".
"""

import functools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np

from textattn import attention


def forward_augmented_v(q, k, v, padding_mask, causal):
  scores = jnp.matmul(q, jnp.swapaxes(k, -1, -2), preferred_element_type=jnp.float32)
  scores = scores + attention._mask_bias(padding_mask, causal, q.shape[2])
  unnormalised = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
  ones = jnp.ones(v.shape[:-1] + (1,), v.dtype)
  out_and_sum = jnp.matmul(unnormalised.astype(v.dtype), jnp.concatenate([v, ones], -1),
                           preferred_element_type=jnp.float32)
  row_sum = out_and_sum[..., -1:]
  out = (out_and_sum[..., :-1] / row_sum).astype(v.dtype)
  return out, (q, k, v, unnormalised, row_sum, out)


def backward_natural_layout(causal, residuals, d_out):
  del causal
  q, k, v, unnormalised, row_sum, out = residuals
  f32 = jnp.float32
  d_out = d_out.astype(f32) / row_sum
  d_v = jnp.swapaxes(jnp.matmul(jnp.swapaxes(d_out, -1, -2), unnormalised), -1, -2)
  d_weights = jnp.matmul(d_out, jnp.swapaxes(v, -1, -2).astype(f32))
  d_scores = unnormalised * (d_weights - jnp.sum(d_out * out.astype(f32), -1, keepdims=True))
  d_q = jnp.matmul(d_scores, k.astype(f32))
  d_k = jnp.swapaxes(jnp.matmul(jnp.swapaxes(q.astype(f32), -1, -2), d_scores), -1, -2)
  return d_q.astype(q.dtype), d_k.astype(k.dtype), d_v.astype(v.dtype), None


def make_core(forward, backward):
  @functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
  def core(q, k, v, padding_mask, causal):
    return forward(q, k, v, padding_mask, causal)[0]

  core.defvjp(forward, backward)
  return core


def main():
  batch = int(sys.argv[1]) if len(sys.argv) > 1 else 16
  variants = {
      "cur": make_core(attention._fused_forward, attention._fused_backward),
      "augV": make_core(forward_augmented_v, attention._fused_backward),
      "natbwd": make_core(attention._fused_forward, backward_natural_layout),
      "both": make_core(forward_augmented_v, backward_natural_layout),
  }
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.standard_normal((batch, 2, 200, 16)), jnp.float32)
             for _ in range(3))
  mask = jnp.asarray(np.arange(200)[None] < rng.integers(50, 201, batch)[:, None])
  functions, results = {}, {}
  for name, core in variants.items():
    loss = lambda q, k, v, core=core: jnp.sum(core(q, k, v, mask, False) * v)
    functions[name] = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    results[name] = jax.block_until_ready(functions[name](q, k, v))
  for name, result in results.items():
    diff = max(float(jnp.max(jnp.abs(a - b)))
               for a, b in zip(jax.tree.leaves(result), jax.tree.leaves(results["cur"])))
    print(f"{name:8s} max |difference| from cur: {diff:.2e}")
  times = {name: [] for name in functions}
  for _ in range(7):
    for name, function in functions.items():
      start = time.perf_counter()
      for _ in range(20):
        result = function(q, k, v)
      jax.block_until_ready(result)
      times[name].append((time.perf_counter() - start) / 20)
  for name, values in times.items():
    print(f"{name:8s} {np.median(values) * 1e3:.2f} ms (median of 7 rounds of 20 calls)")


if __name__ == "__main__":
  main()
