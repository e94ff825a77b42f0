"""Cross-lowering: a function exported for a platform this machine does not have (CUDA, TPU), and
the accelerator kernels its module calls.

`jax.export` lowers for any platform on any machine: it runs the platform's Pallas lowering
(Triton for our GPU kernels, Mosaic for the TPU ones) but not its compiler, so a kernel that
cannot lower at all fails here in seconds, on a CPU, rather than on a lent GPU. What lowering
does not prove: that the GPU/TPU compiler accepts the lowered kernel, its numerics, its speed.

  python -m textattn.attention.lowering            # every GPU and TPU kernel, forward+backward
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from textattn.attention import additive_pallas, additive_tpu, causal_additive_pallas, common

# The custom-call targets a Pallas kernel lowers to, by lowering.
TRITON_CALL = "__gpu$xla.gpu.triton"
MOSAIC_GPU_CALLS = ("mosaic_gpu", "mosaic_gpu_v2")
TPU_CALL = "tpu_custom_call"
# Calls that an exported module may hold only with its safety check lifted (jax.export refuses
# custom calls it does not know to be stable); cuDNN's flash attention lowers only where cuDNN is.
_ALLOWED = (TRITON_CALL, *MOSAIC_GPU_CALLS, TPU_CALL)


def export(fn: Callable, args: Sequence, platform: str) -> jax.export.Exported:
  """`jax.jit(fn)` exported for `platform` ("cuda", "tpu", "cpu") at `args`' shapes (arrays or
  jax.ShapeDtypeStruct), traced as on that platform (`common.traced_for`: "auto" kernel choices,
  interpret mode and platform checks read it)."""
  checks = [jax.export.DisabledSafetyCheck.custom_call(name) for name in _ALLOWED]
  with common.traced_for(platform):
    return jax.export.export(jax.jit(fn), platforms=[platform], disabled_checks=checks)(*args)


def custom_calls(exported: jax.export.Exported) -> Counter:
  """How often each custom-call target occurs in the exported module."""
  text = exported.mlir_module()
  return Counter(re.findall(r'(?:stablehlo\.custom_call|call_target_name\s*=)\s*@?"?([\w$.]+)',
                            text))


def kernel_calls(exported: jax.export.Exported) -> Counter:
  """The accelerator-kernel calls (Triton, Mosaic GPU, Mosaic TPU) among the custom calls."""
  return Counter({k: v for k, v in custom_calls(exported).items() if k in _ALLOWED})


# The GPU and TPU kernels, each a function of (q, k, mask, alpha_kernel, beta_kernel), forward
# and backward, and how many kernel calls a forward+backward holds.
def _gpu_fused(q, k, mask, a, b):
  # 32-row tiles over a length that is no multiple of them: a ragged last tile.
  return additive_pallas.pallas_additive_attention(
      q, k, mask, a, b, tiling=additive_pallas.Tiling(32, 2, interpret=False))


def _gpu_chunked(q, k, mask, a, b):
  return causal_additive_pallas.pallas_recurrent_causal_additive(q, k, mask, a, b, chunk_size=32)


def _tpu_fused(q, k, mask, a, b):
  return additive_tpu.tpu_additive_attention(q, k, mask, a, b,
                                             tiling=additive_tpu.Tiling(32, False))


# name: (function, platform, kernel call, calls in forward+backward)
KERNELS = {
    "additive_pallas": (_gpu_fused, "cuda", TRITON_CALL, 3 + 3),
    "causal_additive_recurrent_pallas": (_gpu_chunked, "cuda", TRITON_CALL, 1 + 1),
    "additive_pallas_tpu": (_tpu_fused, "tpu", TPU_CALL, 3 + 3),
}


def kernel_inputs(dtype, batch: int = 2, length: int = 100, heads: int = 3, head_dim: int = 5):
  """An awkward shape: odd head size, features (15) no power of two, a ragged last tile, and
  padding (the second example's last 37 positions)."""
  keys = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(keys[0], (batch, length, heads, head_dim), dtype)
  k = jax.random.normal(keys[1], (batch, length, heads, head_dim), dtype)
  mask = jnp.ones((batch, length), bool).at[-1, length - 37:].set(False)
  a = jax.random.normal(keys[2], (heads * head_dim, heads), jnp.float32)
  b = jax.random.normal(keys[3], (heads * head_dim, heads), jnp.float32)
  return q, k, mask, a, b


def forward_backward(kernel: Callable) -> Callable:
  """Loss and gradients of a kernel, as a training step would take them."""
  def loss(q, k, mask, a, b):
    return jnp.sum(kernel(q, k, mask, a, b).astype(jnp.float32) ** 2)
  return jax.value_and_grad(loss, argnums=(0, 1, 3, 4))


def check_kernel(name: str, dtype) -> Counter:
  """Exports kernel `name` forward+backward for its platform; its kernel calls, or ValueError
  when the module holds none of the expected call (a silent fallback to XLA) or another kind."""
  fn, platform, call, expected = KERNELS[name]
  calls = kernel_calls(export(forward_backward(fn), kernel_inputs(dtype), platform))
  if set(calls) != {call} or (expected is not None and calls[call] != expected):
    raise ValueError(f"{name} ({jnp.dtype(dtype).name}) exported for {platform} holds kernel "
                     f"calls {dict(calls)}, not {expected or 'some'} x {call}.")
  return calls


def main(argv: Sequence[str] = ()) -> int:
  del argv
  print(f"jax {jax.__version__}: exporting each kernel's forward+backward (lowering only)")
  failed = 0
  for name in KERNELS:
    for dtype in (jnp.float32, jnp.bfloat16):
      try:
        calls = check_kernel(name, dtype)
        print(f"ok     {name:34s} {jnp.dtype(dtype).name:9s} {dict(calls)}")
      except Exception as error:  # noqa: BLE001 -- every failure is reported, then exit 1
        failed += 1
        print(f"FAILED {name:34s} {jnp.dtype(dtype).name:9s} {type(error).__name__}: "
              f"{str(error).splitlines()[0][:300]}")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
