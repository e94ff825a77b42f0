"""The GPU Pallas kernels' settings: which Pallas backend each uses and why, the Triton
configuration of a kernel (rows per tile, warps, pipeline stages), a shared-memory estimate per
configuration, and which configurations a device can take.

Backend. Pallas on a GPU lowers through Triton (`jax.experimental.pallas.triton`) or Mosaic GPU
(`jax.experimental.pallas.mosaic_gpu`, JAX's default for CUDA when a kernel names neither). Both
of textattn's GPU kernels (the fused additive kernel, additive_pallas.py; the chunked causal
additive kernel, causal_additive_pallas.py) use Triton, named by their `plgpu.CompilerParams`:
  - their tiles are [rows, features] row blocks with masked loads past the length and past the
    features (F = heads * head_dim padded to a power of two inside the kernel), which Triton
    takes at any shape; Mosaic GPU copies tiles by TMA / async copies that need 16-byte aligned
    strides and whole tiles (it refused the fused kernel at 15 features, tests/test_lowering.py);
  - they are written with the generic Pallas ops (jnp maths, `fori_loop`, `plgpu.load/store`),
    which Pallas' interpret mode runs on a CPU: the same code is tested in CI (Mosaic GPU
    kernels are warpgroup programs that only a Hopper GPU runs);
  - Triton runs on every CUDA GPU from Ampere on; Mosaic GPU needs Hopper (sm_90a) or later.
  `BACKENDS` records it per kernel (the GPU script prints it); a kernel of the later chunked
  gated / delta-rule families may well be Mosaic GPU (Hopper's wgmma and TMA pay off for
  chunked matrix products), and names itself here.

Shared memory (`estimate`), a model of what the Triton compiler allocates per program (our
reading of its software pipeliner and layout conversions, not its code):
  - (num_stages - 1) buffers of every load inside a loop that feeds a `dot` (the pipeliner
    prefetches those; loads that feed no dot stay in registers unless the loop asks for stages
    itself, which Pallas' `fori_loop` does not), live for the whole loop;
  - the two operands of a `dot` ([M, K] and [K, N], float32 here, converted through shared
    memory), live around one dot at a time;
  - scratch for cross-warp reductions and layout conversions (small next to the above; taken as
    the reduced tile's [warps, features] float32).
  The estimate is the first line plus the largest of the others. It reproduces the one refusal
  measured, exactly: the chunked causal forward at chunk 64, 3 stages, float32, 256 features
  (RESULTS section 28: "requested 344576, available: 232448") is 2 x (64 x 256 x 4 x 2 + 64 x 4)
  + (64 x 64 + 64 x 256) x 4 = 344,576 bytes. One measured point fits a model, it does not
  prove it: the GPU script (experiments/gpu/kernels.py) compiles every configuration and prints
  the estimate beside the outcome. `fits` keeps a configuration over the device's limit from
  being chosen (`choose`), so "auto" and a kernel's default never ask the compiler for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import jax

# Dynamic shared memory one program (CTA) may use, by device kind (substring of
# jax.devices()[0].device_kind): 227 KiB on Hopper (what the H200 reported as "available"),
# 163 KiB on an A100, 99 KiB on Ada.
SHARED_MEMORY_LIMITS = {"H100": 232_448, "H200": 232_448, "GH200": 232_448, "A100": 166_912,
                        "L4": 101_376, "L40": 101_376}
# Where the device is not known (or no GPU is at hand: lowering on a CPU), Hopper's.
DEFAULT_SHARED_MEMORY_LIMIT = 232_448
F32_BYTES = 4

# Pallas GPU backend of each GPU kernel (module docstring says why).
TRITON, MOSAIC_GPU = "triton", "mosaic_gpu"
BACKENDS = {"additive_pallas": TRITON, "causal_additive_recurrent_pallas": TRITON}


class TritonConfig(NamedTuple):
  """One configuration of a Triton-lowered Pallas kernel: `rows` per tile (the fused kernel's
  block, the chunked kernel's chunk), warps per program, software-pipeline stages."""
  rows: int
  num_warps: int = 4
  num_stages: int = 1

  def label(self) -> str:
    return f"rows {self.rows}, {self.num_warps} warps, {self.num_stages} stages"


def estimate(config: TritonConfig, pipelined_load_bytes: Iterable[int],
             dot_operands: Iterable[tuple[int, int, int]] = (), reduced_features: int = 0,
             operand_bytes: int = F32_BYTES) -> int:
  """Shared-memory bytes of one program (module docstring): `pipelined_load_bytes` are the
  bytes of each load inside the loop that feeds a dot (one stage's tile), `dot_operands` the
  (M, K, N) of each dot, `reduced_features` the width of the widest tile reduced across rows."""
  pipelined = max(config.num_stages - 1, 0) * sum(pipelined_load_bytes)
  dots = [(m * k + k * n) * operand_bytes for m, k, n in dot_operands]
  scratch = config.num_warps * reduced_features * F32_BYTES
  return pipelined + max([scratch, *dots])


def shared_memory_limit(device_kind: str | None) -> int:
  """The per-program shared-memory limit of a device kind (Hopper's when unknown)."""
  for name in sorted(SHARED_MEMORY_LIMITS, key=len, reverse=True):
    if device_kind and name.lower() in device_kind.lower():
      return SHARED_MEMORY_LIMITS[name]
  return DEFAULT_SHARED_MEMORY_LIMIT


def device_kind() -> str | None:
  """This process's first GPU's kind, or None (no GPU: lowering or interpret mode)."""
  devices = jax.devices()
  return devices[0].device_kind if devices and devices[0].platform == "gpu" else None


def fits(bytes_needed: int, limit: int | None = None) -> bool:
  return bytes_needed <= (shared_memory_limit(device_kind()) if limit is None else limit)


def choose(candidates: Sequence[TritonConfig], bytes_of: Callable[[TritonConfig], int],
           limit: int | None = None) -> TritonConfig:
  """The first candidate whose estimate fits the device (`limit`: this GPU's, or Hopper's);
  ValueError when none does (a kernel's candidates are listed so that one always fits)."""
  for config in candidates:
    if fits(bytes_of(config), limit):
      return config
  raise ValueError(f"no configuration fits {limit or 'this device'}'s shared memory: "
                   + "; ".join(f"{c.label()}: {bytes_of(c):,} bytes" for c in candidates))


def check_fits(kernel: str, config: TritonConfig, bytes_needed: int,
               limit: int | None = None) -> None:
  """ValueError, in one sentence, for a configuration whose estimate is over the limit (asked
  for by hand: a tiling argument), before the compiler is asked."""
  limit = shared_memory_limit(device_kind()) if limit is None else limit
  if bytes_needed > limit:
    raise ValueError(f"{kernel}: {config.label()} needs about {bytes_needed:,} bytes of shared "
                     f"memory per program (textattn/attention/pallas_gpu.py), over this GPU's "
                     f"{limit:,}; use fewer rows or stages.")
