"""The GPU kernels' shared-memory estimate (textattn/attention/pallas_gpu.py): the one refusal
measured, every autotune configuration against Hopper's limit, and that a configuration over
the limit is never chosen (a kernel's default, which "auto" uses) nor compiled when asked for."""

import jax
import jax.numpy as jnp
import pytest

from textattn.attention import (
    additive_pallas,
    causal_additive_pallas,
    common,
    lowering,
    pallas_gpu,
)
from textattn.attention.pallas_gpu import TritonConfig

HOPPER = 232_448  # "available: 232448" on the H200 (RESULTS section 28); an H100's too
# The benchmark shape of the GPU script: 4 heads of 64.
FEATURES, HEADS = 256, 4


def test_the_estimate_reproduces_the_refusal_measured_on_the_h200():
  # RESULTS section 28: the chunked causal kernel at chunk 64, Triton's default 3 stages and 4
  # warps, float32, [4, 16384, 4, 64]: "Shared memory size limit exceeded: requested 344576,
  # available: 232448". The estimate is fitted to this one point (pallas_gpu's docstring): two
  # pipelined stages of q, k [64, 256] float32 and the mask [64] int32, plus one dot's float32
  # operands [64, 64] and [64, 256].
  refused = causal_additive_pallas.shared_memory_bytes(TritonConfig(64, 4, 3), FEATURES, 4, HEADS)
  assert refused["forward"] == 344_576
  assert refused["backward"] > refused["forward"]  # (more loads in its loop)
  assert not pallas_gpu.fits(refused["forward"], HOPPER)
  assert pallas_gpu.shared_memory_limit("NVIDIA H200") == HOPPER
  assert pallas_gpu.shared_memory_limit("NVIDIA H100 80GB HBM3") == HOPPER
  assert pallas_gpu.shared_memory_limit("NVIDIA A100-SXM4-80GB") < HOPPER
  assert pallas_gpu.shared_memory_limit(None) == HOPPER


@pytest.mark.parametrize("itemsize", [4, 2], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(n for n, k in lowering.KERNELS.items() if k.configs))
def test_every_autotune_configuration_fits_hoppers_shared_memory(name, itemsize):
  kernel = lowering.KERNELS[name]
  assert 1 <= len(kernel.configs) <= 4  # (the GPU script times each at 16K)
  assert len(set(kernel.configs)) == len(kernel.configs)
  for config in kernel.configs:
    needed = kernel.shared_memory(config, FEATURES, itemsize, HEADS)
    assert 0 < needed <= HOPPER, (config, needed)


def test_stages_and_rows_grow_the_estimate():
  base = causal_additive_pallas.shared_memory_bytes(TritonConfig(32, 4, 1), FEATURES, 2, HEADS)
  staged = causal_additive_pallas.shared_memory_bytes(TritonConfig(32, 4, 2), FEATURES, 2, HEADS)
  wider = causal_additive_pallas.shared_memory_bytes(TritonConfig(32, 4, 2), FEATURES, 4, HEADS)
  assert base["forward"] < staged["forward"] < wider["forward"]
  # One stage prefetches nothing: only the dot's operands (32 x 32 + 32 x 256 floats).
  assert base["forward"] == (32 * 32 + 32 * 256) * 4
  # The fused kernel has no dot: its loads are not staged, whatever the stages.
  assert additive_pallas.shared_memory_bytes(TritonConfig(32, 8, 3), FEATURES) == (
      additive_pallas.shared_memory_bytes(TritonConfig(32, 8, 1), FEATURES))


def test_a_configuration_over_the_limit_is_never_the_default(monkeypatch):
  over = TritonConfig(64, 4, 3)  # the refused one
  monkeypatch.setattr(causal_additive_pallas, "CONFIGS", (over, TritonConfig(32, 4, 1)))
  assert causal_additive_pallas.default_config(FEATURES, 4, HEADS) == TritonConfig(32, 4, 1)
  # bfloat16 halves the staged q, k: the forward fits, the backward (float32 residuals) not.
  in_bfloat16 = causal_additive_pallas.shared_memory_bytes(over, FEATURES, 2, HEADS)
  assert in_bfloat16["forward"] <= HOPPER < in_bfloat16["backward"]
  assert causal_additive_pallas.default_config(FEATURES, 2, HEADS) == TritonConfig(32, 4, 1)
  with pytest.raises(ValueError, match="no configuration fits"):
    pallas_gpu.choose((over,), lambda c: 10**6, limit=HOPPER)
  # A smaller device (an A100's 163 KiB) skips what Hopper takes.
  a100 = pallas_gpu.shared_memory_limit("A100")
  big = TritonConfig(32, 4, 2)
  needed = max(causal_additive_pallas.shared_memory_bytes(big, FEATURES, 4, HEADS).values())
  assert a100 < needed <= HOPPER
  assert pallas_gpu.choose((big, TritonConfig(16, 4, 1)), lambda c: max(
      causal_additive_pallas.shared_memory_bytes(c, FEATURES, 4, HEADS).values()),
      limit=a100) == TritonConfig(16, 4, 1)


def test_a_configuration_over_the_limit_is_refused_before_compiling():
  kernel = lowering.KERNELS["causal_additive_recurrent_pallas"]
  args = kernel.inputs(jnp.float32, 1, 64, HEADS, 64)
  with common.traced_for("cuda"), pytest.raises(ValueError, match="shared memory"):
    kernel.run(*args, config=TritonConfig(64, 4, 3))
  if jax.default_backend() == "cpu":  # interpret mode: no shared memory to exceed, it runs
    assert kernel.run(*args, config=TritonConfig(64, 4, 3)).shape == args[0].shape
