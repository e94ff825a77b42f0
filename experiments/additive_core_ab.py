"""The additive attention core alone (the seed model's shape: [32, 200, 2, 16], lengths 50..200,
shared scoring), jitted, the XLA function against the native kernel: forward (loss =
sum(out * r)) and forward + backward (gradients w.r.t. q, k and both scoring kernels), 300 calls
each, twice in turn.

    python experiments/additive_core_ab.py
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

from textattn import attention


def milliseconds(f, *args, calls=300):
  jax.block_until_ready(f(*args))
  start = time.perf_counter()
  for _ in range(calls):
    out = f(*args)
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / calls * 1e3


def main():
  rng = np.random.default_rng(0)
  q, k, r = (jnp.asarray(rng.standard_normal((32, 200, 2, 16)), jnp.float32) for _ in range(3))
  mask = jnp.asarray(np.arange(200)[None] < rng.integers(50, 201, 32)[:, None])
  w_alpha = jnp.asarray(0.3 * rng.standard_normal((32, 2)), jnp.float32)
  w_beta = 0.5 * w_alpha
  for kernel in (attention.additive_attention, attention.native_additive_attention) * 2:
    loss = lambda q, k, a, b, kernel=kernel: jnp.sum(kernel(q, k, mask, a, b) * r)
    forward = jax.jit(loss)
    both = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
    print(f"{kernel.__name__}: forward {milliseconds(forward, q, k, w_alpha, w_beta):.2f} ms, "
          f"forward + backward {milliseconds(both, q, k, w_alpha, w_beta):.2f} ms")


if __name__ == "__main__":
  main()
