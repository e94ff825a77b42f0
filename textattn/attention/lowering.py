"""Cross-lowering: a function exported for a platform this machine does not have (CUDA, TPU), and
the accelerator kernels its module calls.

`jax.export` lowers for any platform on any machine: it runs the platform's Pallas lowering
(Triton for our GPU kernels, Mosaic for the TPU ones) but not its compiler, so a kernel that
cannot lower at all fails here in seconds, on a CPU, rather than on a lent GPU. What lowering
does not prove: that the GPU/TPU compiler accepts the lowered kernel, its numerics, its speed.

  python -m textattn.attention.lowering            # every GPU and TPU kernel, forward+backward
  python -m textattn.attention.lowering --configs --shape 4,16384,4,64 --dtypes bfloat16
                                                   # every autotune configuration at 16K
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import re
import sys
from collections import Counter
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from textattn.attention import (
    additive,
    additive_pallas,
    additive_tpu,
    causal_additive,
    causal_additive_pallas,
    common,
    pallas_gpu,
)

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


@dataclasses.dataclass(frozen=True)
class Kernel:
  """One accelerator kernel, as the lowering check, tests/test_lowering.py and the GPU script
  (experiments/gpu/kernels.py: numerics, bandwidth, autotune) see it. A new kernel family (the
  chunked gated and delta-rule kernels to come) is one entry in KERNELS.

  run(*inputs, config=None) -> output: the kernel (config None: its default for the platform);
  reference(*inputs) -> output: the XLA function of the same maths, which it must match and
  beat; inputs(dtype, batch, length, heads, head_dim) -> the arguments (random, padded);
  argnums: the differentiable ones; platform: "cuda" or "tpu"; call: its custom-call target,
  `calls` of them in a forward+backward; backend: pallas_gpu.TRITON / MOSAIC_GPU, or "mosaic"
  (TPU); configs: what an autotune tries, the default first; shared_memory(config, features,
  itemsize, heads) -> bytes per program (Triton kernels); core_bytes(batch, length, features,
  itemsize) -> bytes a forward+backward must move, by formula (a bandwidth figure's numerator).
  """
  run: Callable
  reference: Callable
  inputs: Callable
  argnums: tuple[int, ...]
  platform: str
  call: str
  calls: int
  backend: str
  configs: tuple = ()
  shared_memory: Callable | None = None
  core_bytes: Callable | None = None


def additive_inputs(dtype, batch: int = 2, length: int = 100, heads: int = 3, head_dim: int = 5):
  """q, k [batch, length, heads, head_dim], a mask, both scoring kernels (float32). Default: an
  awkward shape: odd head size, features (15) no power of two, ragged last tiles, and padding
  (the last example's last 37% of positions)."""
  keys = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(keys[0], (batch, length, heads, head_dim), dtype)
  k = jax.random.normal(keys[1], (batch, length, heads, head_dim), dtype)
  mask = jnp.ones((batch, length), bool).at[-1, length - (length * 37) // 100:].set(False)
  a = 0.1 * jax.random.normal(keys[2], (heads * head_dim, heads), jnp.float32)
  b = 0.1 * jax.random.normal(keys[3], (heads * head_dim, heads), jnp.float32)
  return q, k, mask, a, b


kernel_inputs = additive_inputs


def _fused(q, k, mask, a, b, config=None):
  tiling = None
  if config is not None:
    batch, length = q.shape[:2]
    tiling = additive_pallas.default_tiling(batch, length, common.backend() == "cpu",
                                            q.shape[2] * q.shape[3], config)
  return additive_pallas.pallas_additive_attention(q, k, mask, a, b, tiling=tiling)


def _chunked(q, k, mask, a, b, config=None):
  return causal_additive_pallas.pallas_recurrent_causal_additive(q, k, mask, a, b, config=config)


def _tpu_fused(q, k, mask, a, b, config=None):
  del config
  return additive_tpu.tpu_additive_attention(q, k, mask, a, b)


def _additive_bytes(batch, length, features, itemsize):
  return additive_pallas.core_bytes(batch, length, features, itemsize)


def _causal_shared_memory(config, features, itemsize, heads):
  return max(causal_additive_pallas.shared_memory_bytes(config, features, itemsize,
                                                        heads).values())


def _fused_shared_memory(config, features, itemsize, heads):
  del heads
  return additive_pallas.shared_memory_bytes(config, features, itemsize)


_ADDITIVE = dict(inputs=additive_inputs, argnums=(0, 1, 3, 4))
KERNELS = {
    "additive_pallas": Kernel(
        _fused, additive.additive_attention, platform="cuda", call=TRITON_CALL, calls=3 + 3,
        backend=pallas_gpu.BACKENDS["additive_pallas"], configs=additive_pallas.CONFIGS,
        shared_memory=_fused_shared_memory, core_bytes=_additive_bytes, **_ADDITIVE),
    "causal_additive_recurrent_pallas": Kernel(
        _chunked, causal_additive.recurrent_causal_additive, platform="cuda", call=TRITON_CALL,
        calls=1 + 1, backend=pallas_gpu.BACKENDS["causal_additive_recurrent_pallas"],
        configs=causal_additive_pallas.CONFIGS, shared_memory=_causal_shared_memory,
        **_ADDITIVE),
    "additive_pallas_tpu": Kernel(
        _tpu_fused, additive.additive_attention, platform="tpu", call=TPU_CALL, calls=3 + 3,
        backend="mosaic", core_bytes=_additive_bytes, **_ADDITIVE),
}


def forward_backward(kernel: Callable, argnums: tuple[int, ...] = (0, 1, 3, 4)) -> Callable:
  """Loss and gradients of a kernel, as a training step would take them."""
  def loss(*args):
    return jnp.sum(kernel(*args).astype(jnp.float32) ** 2)
  return jax.value_and_grad(loss, argnums=argnums)


def check_kernel(name: str, dtype, config=None, shape: Sequence[int] | None = None) -> Counter:
  """Exports kernel `name` forward+backward for its platform (its default configuration, or
  `config`; at `shape` = (batch, length, heads, head_dim), as abstract arrays, or at the awkward
  default shape); its kernel calls, or ValueError when the module holds none of the expected
  call (a silent fallback to XLA) or another kind."""
  kernel = KERNELS[name]
  args = (kernel.inputs(dtype) if shape is None
          else jax.eval_shape(lambda: kernel.inputs(dtype, *shape)))
  run = functools.partial(kernel.run, config=config)
  calls = kernel_calls(export(forward_backward(run, kernel.argnums), args, kernel.platform))
  if set(calls) != {kernel.call} or calls[kernel.call] != kernel.calls:
    raise ValueError(f"{name} ({jnp.dtype(dtype).name}) exported for {kernel.platform} holds "
                     f"kernel calls {dict(calls)}, not {kernel.calls} x {kernel.call}.")
  return calls


def main(argv: Sequence[str] = ()) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--configs", action="store_true",
                      help="every autotune configuration of each GPU kernel, not its default")
  parser.add_argument("--shape", default=None,
                      help="batch,length,heads,head_dim to lower at (default: a small awkward one)")
  parser.add_argument("--dtypes", default="float32,bfloat16")
  args = parser.parse_args(list(argv))
  shape = tuple(int(n) for n in args.shape.split(",")) if args.shape else None
  print(f"jax {jax.__version__}: exporting each kernel's forward+backward (lowering only)"
        + (f" at {shape}" if shape else ""))
  failed = 0
  for name, kernel in KERNELS.items():
    configs = kernel.configs if args.configs and kernel.configs else (None,)
    for config in configs:
      for dtype in args.dtypes.split(","):
        label = f"{name:34s} {dtype:9s}" + (f" {config.label()}" if config else " default")
        try:
          calls = check_kernel(name, jnp.dtype(dtype), config, shape)
          print(f"ok     {label} [{kernel.backend}] {dict(calls)}")
        except Exception as error:  # noqa: BLE001 -- every failure is reported, then exit 1
          failed += 1
          print(f"FAILED {label} {type(error).__name__}: {str(error).splitlines()[0][:300]}")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
