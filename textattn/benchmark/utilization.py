"""How good a benchmark number is: achieved TFLOP/s and memory bandwidth against the device's
peak, and the model FLOPs utilisation (MFU) of a train step.

Formulas (stated, not measured):
  attention FLOPs, one layer's forward:   4 * B * H * L^2 * d   (QK^T and PV, 2 FLOPs a MAC),
    halved when causal (only the lower triangle is needed); forward+backward = 3.5x forward
    (the backward is 2.5x the forward: FlashAttention-2's accounting). From the variant's
    registry entry (`Variant.forward_flops`); linear-time variants have none and are judged by
    bandwidth instead.
  bytes moved: XLA's cost_analysis()["bytes accessed"] of the compiled function (which does not
    see inside a Pallas call); and, for a variant that states it (`Variant.core_bytes`, e.g.
    additive attention's 4 passes of [B, L, F] forward and 7 backward), the bytes its attention
    core must move by formula, over the point's time: the same numerator for every kernel of
    the variant. In the attention modes the time includes the layer's projections, so the
    core's own rate is higher (experiments/gpu/kernels.py times the core alone).
  model FLOPs per token of a train step (PaLM, Chowdhery et al. 2022, appendix B):
    6 * N + 12 * layers * L * width (N = parameters outside the embedding tables, which are
    looked up rather than multiplied); the attention term is halved when causal and left out
    for linear-time attention.
Peaks: the table below (vendor datasheets, dense, no sparsity) for accelerators; on a CPU the
rate of a float32 matmul measured in the benchmark's own process (`measured_cpu_peak`).
"""

from __future__ import annotations

import time

# device_kind substring -> (bfloat16 dense TFLOP/s, float32 TFLOP/s, memory TB/s). Float32 is
# the non-tensor-core rate: JAX's default TF32 products can exceed it.
PEAKS = {
    "H200": (989.0, 67.0, 4.8),
    "H100": (989.0, 67.0, 3.35),  # SXM5 80 GB
    "A100": (312.0, 19.5, 2.04),  # SXM4 80 GB
    "L4": (121.0, 30.3, 0.3),
    "TPU v5 lite": (197.0, 197.0, 0.82),
    "TPU v4": (275.0, 275.0, 1.2),
}


def attention_flops(forward_flops, mode: str, batch: int, length: int, heads: int,
                    head_dim: int) -> float | None:
  """Attention FLOPs of one call in `mode` by the stated formula, or None when the variant has
  no quadratic term (forward_flops is None) or the mode is not an attention-only measure (a
  model step's time holds embeddings, feed-forwards and the loss too: its model_tflops and
  mfu_pct say how good it is)."""
  if forward_flops is None or mode not in ("attention", "attention+backward"):
    return None
  return forward_flops(batch, length, heads, head_dim) * (3.5 if mode.endswith("backward") else 1)


def model_flops_per_token(parameters: int, layers: int, length: int, width: int,
                          attention_factor: float) -> float:
  """6 N + 12 * layers * L * width * attention_factor (the variant's attention FLOPs over
  softmax's at that length: 1 softmax, 0.5 causal, keys / L windowed, 0 linear)."""
  return 6.0 * parameters + 12.0 * layers * length * width * attention_factor


def core_bytes(variant_core_bytes, mode: str, batch: int, length: int, heads: int,
               head_dim: int, itemsize: int) -> float | None:
  """Bytes the attention core moves in one call of `mode` by the variant's formula, or None (no
  formula, or not an attention-only mode)."""
  if variant_core_bytes is None or mode not in ("attention", "attention+backward"):
    return None
  return float(variant_core_bytes(batch, length, heads, head_dim, itemsize,
                                  mode.endswith("backward")))


def device_peak(device_kind: str, dtype: str) -> tuple[float | None, float | None]:
  """(peak TFLOP/s for the dtype, peak memory TB/s) of a known accelerator, else (None, None)."""
  for name, (bf16, fp32, bandwidth) in PEAKS.items():
    if name.lower() in device_kind.lower():
      return (bf16 if dtype in ("bfloat16", "float16") else fp32), bandwidth
  return None, None


def measured_cpu_peak(size: int = 1024, repeats: int = 5) -> float:
  """TFLOP/s of a float32 [size x size] matmul on this process's CPU device (best of repeats):
  what "peak" means on a CPU here."""
  import jax
  import jax.numpy as jnp
  a = jnp.ones((size, size), jnp.float32)
  matmul = jax.jit(lambda x: x @ x)
  jax.block_until_ready(matmul(a))
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(matmul(a))
    best = min(best, time.perf_counter() - start)
  return 2.0 * size ** 3 / best / 1e12


def derived(result: dict, *, attention_flop_count: float | None, bytes_accessed: float | None,
            model_flops: float | None, peak_tflops: float | None,
            peak_tbps: float | None, formula_bytes: float | None = None) -> dict:
  """The utilisation columns of a timed point (median step time in result["median_ms"])."""
  seconds = result["median_ms"] / 1e3
  out = {"peak_tflops": peak_tflops, "peak_tbps": peak_tbps}
  if attention_flop_count:
    out["attention_tflops"] = attention_flop_count / seconds / 1e12
    if peak_tflops:
      out["pct_of_peak"] = 100.0 * out["attention_tflops"] / peak_tflops
  if bytes_accessed:
    out["bytes_accessed"] = bytes_accessed
    out["achieved_tbps"] = bytes_accessed / seconds / 1e12
    if peak_tbps:
      out["pct_of_bandwidth"] = 100.0 * out["achieved_tbps"] / peak_tbps
  if formula_bytes:
    out["core_bytes"] = formula_bytes
    out["core_tbps"] = formula_bytes / seconds / 1e12
    if peak_tbps:
      out["pct_core_bandwidth"] = 100.0 * out["core_tbps"] / peak_tbps
  if model_flops:
    out["model_tflops"] = model_flops / seconds / 1e12
    if peak_tflops:
      out["mfu_pct"] = 100.0 * out["model_tflops"] / peak_tflops
  return out
