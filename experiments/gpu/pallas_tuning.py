"""The GPU Pallas kernels under other Triton parameters and chunk sizes (issue 53's GPU run).

The 2026-11-27 H200 run (RESULTS §28) found the chunked causal Pallas kernel refused at
[4, 16384, 4, 64] float32 ("Shared memory size limit exceeded: requested 344576, available:
232448") and the fused additive Pallas kernel 3.1x slower than XLA in bfloat16. This times each
kernel's forward+backward (jit of value_and_grad, median of 10 after 2 warm-ups) for a few
(chunk or tile, num_warps, num_stages) settings, with the relative error of the output and the
gradients against the XLA form in float32, one line each; a setting that fails prints its error.

  bash experiments/gpu/pallas_tuning.sh     # device tool, carry .whl (about 4 minutes)
  REHEARSE=1 bash experiments/gpu/pallas_tuning.sh  # a CPU: interpret mode, toy sizes, one
                                                    # setting a kernel, float32 only
                                                    # (tests/test_gpu_scripts.py)

Chunk 64 with one stage comes last: on the H200 it neither finished nor failed in 220 s.
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import triton as plgpu

from textattn.attention import additive, additive_pallas, causal_additive, causal_additive_pallas

REHEARSE = "--rehearse" in sys.argv
B, L, H, D = (2, 48, 2, 8) if REHEARSE else (4, 16384, 4, 64)


def timed(fn, args, repeats=10):
  compiled = jax.jit(fn).lower(*args).compile()
  for _ in range(2):
    jax.block_until_ready(compiled(*args))
  times = []
  for _ in range(2 if REHEARSE else repeats):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - start)
  return float(np.median(times)) * 1e3, compiled(*args)


def grads(kernel):
  def loss(q, k, mask, a, b):
    return jnp.sum(kernel(q, k, mask, a, b).astype(jnp.float32) * jnp.cos(
        jnp.arange(q.shape[1], dtype=jnp.float32))[None, :, None, None])
  return jax.value_and_grad(loss, argnums=(0, 1, 3, 4))


def rel_err(got, want):
  leaves = zip(jax.tree.leaves(got), jax.tree.leaves(want))
  return max(float(jnp.linalg.norm((g.astype(jnp.float32) - w.astype(jnp.float32)).ravel())
                   / (jnp.linalg.norm(w.astype(jnp.float32).ravel()) + 1e-30)) for g, w in leaves)


def inputs(dtype):
  keys = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(keys[0], (B, L, H, D)).astype(dtype)
  k = jax.random.normal(keys[1], (B, L, H, D)).astype(dtype)
  mask = jnp.ones((B, L), bool).at[-1, L * 3 // 4:].set(False)
  a = 0.1 * jax.random.normal(keys[2], (H * D, H), jnp.float32)
  b = 0.1 * jax.random.normal(keys[3], (H * D, H), jnp.float32)
  return q, k, mask, a, b


def row(name, fn, args, want):
  try:
    ms, got = timed(grads(fn), args)
    print(f"{name:60s} {ms:9.3f} ms   rel err {rel_err(got, want):.1e}", flush=True)
  except Exception as error:  # noqa: BLE001 -- each setting's failure is a result
    print(f"{name:60s} FAILED {type(error).__name__}: {str(error).splitlines()[0][:160]}",
          flush=True)


def main():
  print(f"jax {jax.__version__} {jax.devices()[0].device_kind}; [{B}, {L}, {H}, {D}]", flush=True)
  interpret = jax.default_backend() == "cpu"
  # 1. Chunked causal: the XLA scan is the reference and the time to beat.
  args = inputs(jnp.float32)
  ms, want = timed(grads(causal_additive.recurrent_causal_additive), args)
  print(f"{'causal scan (XLA), float32':60s} {ms:9.3f} ms", flush=True)
  settings = [(32, 4, 3), (32, 4, 1), (16, 4, 3), (32, 8, 1), (64, 4, 1)]
  for chunk, warps, stages in settings[:1] if REHEARSE else settings:
    causal_additive_pallas.TRITON = plgpu.CompilerParams(num_warps=warps, num_stages=stages)
    row(f"causal pallas chunk {chunk} warps {warps} stages {stages}, float32",
        lambda q, k, m, a, b, c=chunk: causal_additive_pallas.pallas_recurrent_causal_additive(
            q, k, m, a, b, chunk_size=c, interpret=interpret), args, want)
  # 2. Fused additive, bfloat16 and float32, against the XLA function.
  for dtype in (jnp.float32,) if REHEARSE else (jnp.bfloat16, jnp.float32):
    args = inputs(dtype)
    ms, want = timed(grads(additive.additive_attention), inputs(jnp.float32))
    ms, got = timed(grads(additive.additive_attention), args)
    name = jnp.dtype(dtype).name
    print(f"{'additive XLA, ' + name:60s} {ms:9.3f} ms   rel err {rel_err(got, want):.1e}",
          flush=True)
    settings = [(64, 4, 3), (64, 4, 1), (64, 8, 3), (128, 8, 3)]
    for block, warps, stages in settings[:1] if REHEARSE else settings:
      additive_pallas.TRITON = plgpu.CompilerParams(num_warps=warps, num_stages=stages)
      tiling = additive_pallas.default_tiling(B, L, interpret)._replace(block=block)
      row(f"additive pallas block {block} warps {warps} stages {stages}, {name}",
          lambda q, k, m, a, b, t=tiling: additive_pallas.pallas_additive_attention(
              q, k, m, a, b, tiling=t), args, want)


if __name__ == "__main__":
  main()
