"""The Pallas TPU (Mosaic) Fastformer kernels (textattn/attention/additive_tpu.py), in TPU interpret
mode on a CPU (uninitialised memory reads as NaN there, so rows past the length must be unused)
against the float64 reference of tests/test_additive_pallas.py: values and gradients, padding
inside and at the end, a length that is not a multiple of the tile, bfloat16; that they lower
for the TPU platform (Mosaic's block-shape rules, every op lowerable); and how "auto" and the
config checks treat them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.test_additive_pallas import (
  NAMES,
  assert_relatively_close,
  inputs,
  reference,
  values_and_grads,
)
from textattn import attention
from textattn.attention import additive, additive_tpu, pallas_allowlist, softmax
from textattn.errors import UsageError

INTERPRET = jax.default_backend() != "tpu"


def tpu_kernel(block):
  tiling = additive_tpu.Tiling(block=block, interpret=INTERPRET)
  return lambda *a: additive_tpu.tpu_additive_attention(*a, tiling=tiling)


def padded_at_the_end(args):
  """The inputs with example 0's last 6 positions made padding (example 1 has padding inside and
  in front, example 2 is all padding)."""
  q, k, mask, w_alpha, w_beta = args
  mask = mask.copy()
  mask[0, -6:] = False
  return q, k, mask, w_alpha, w_beta


@pytest.mark.parametrize("length", [37, 48], ids=["ragged_last_tile", "whole_tiles"])
def test_tpu_kernel_matches_float64_values_and_gradients(length):
  # 3 heads of 8: F = 24 (not a multiple of 128 lanes); 37 rows in 3 tiles of 16, the last one
  # 11 rows past the end; or 48 rows, 3 whole tiles.
  args = padded_at_the_end(inputs(3, 8, length=length))
  cotangent = np.random.default_rng(1).normal(size=args[0].shape)
  want = reference(args, cotangent)
  f32 = [jnp.asarray(a) if a.dtype == bool else jnp.asarray(a, jnp.float32) for a in args]
  got = values_and_grads(tpu_kernel(16), f32, jnp.asarray(cotangent, jnp.float32))
  for name, g, w in zip(NAMES, got, want):
    assert_relatively_close(g, w, 1e-5, name)
  assert np.all(np.asarray(got[0])[2] == 0)  # the all-padding example: exactly 0
  mask = args[2]
  assert np.all(np.asarray(got[2])[~mask] == 0)  # padding keys get no gradient


def test_tpu_kernel_in_bfloat16_is_within_bfloat16_rounding_of_float64():
  # bfloat16 q, k, scoring kernels; scores and sums are float32 inside, u, dq, dk are rounded to
  # bfloat16 once at the end. Stated bound: 2e-2 of each tensor's scale (bfloat16's relative step
  # is 2^-8 = 3.9e-3; measured here: at most 6.9e-3, in d_alpha_kernel; float32: 4.5e-7).
  args = padded_at_the_end(inputs(2, 8, dtype=jnp.bfloat16))
  cotangent = np.random.default_rng(2).normal(size=args[0].shape)
  want = reference(args, cotangent)
  bf16 = [jnp.asarray(a) if a.dtype == bool else jnp.asarray(a, jnp.bfloat16) for a in args]
  got = values_and_grads(tpu_kernel(16), bf16, jnp.asarray(cotangent, jnp.float32))
  assert got[0].dtype == jnp.bfloat16 and got[1].dtype == jnp.bfloat16
  for name, g, w in zip(NAMES, got, want):
    assert_relatively_close(g, w, 2e-2, name)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tpu_kernel_forward_and_backward_lower_for_the_tpu_platform(dtype):
  # jax.export runs Pallas' Mosaic lowering without a TPU: it refuses blocks whose last two dims
  # are not (8, 128)-divisible or whole, and ops Mosaic has no lowering for. (It does not run the
  # Mosaic compiler inside libtpu: a TPU run is still needed, pallas_allowlist.py.)
  dtype = jnp.dtype(dtype)

  def loss(q, k, w_alpha, w_beta):
    tiling = additive_tpu.Tiling(block=16, interpret=False)
    u = additive_tpu.tpu_additive_attention(q.astype(dtype), k.astype(dtype), mask,
                                            w_alpha.astype(dtype), w_beta.astype(dtype),
                                            tiling=tiling)
    return jnp.sum(u.astype(jnp.float32))

  q = jnp.ones((2, 37, 3, 64))  # F = 192: one and a half lane tiles
  mask = jnp.ones((2, 37), bool)
  w = jnp.ones((192, 3))
  exported = jax.export.export(jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3))),
                               platforms=["tpu"])(q, q, w, w)
  assert exported.mlir_module().count("tpu_custom_call") == 6  # 3 forward, 3 backward kernels


def test_the_tpu_implementation_is_registered_labelled_pallas_and_the_module_uses_it():
  variant = attention.get("additive")
  assert "pallas_tpu" in variant.implementations
  assert dict(variant.kernels)["pallas_tpu"] == "pallas"
  x = jax.random.normal(jax.random.key(0), (2, 37, 16))
  mask = jnp.arange(37)[None] < jnp.array([[37], [20]])
  modules = {impl: variant.build(num_heads=2, implementation=impl, dtype=jnp.float32)
             for impl in ("xla", "pallas_tpu")}
  params = modules["xla"].init(jax.random.key(1), x, mask)
  outputs = {impl: jax.jit(m.apply)(params, x, mask) for impl, m in modules.items()}
  assert_relatively_close(outputs["pallas_tpu"], np.asarray(outputs["xla"], np.float64), 1e-5,
                          "out")


def test_auto_uses_the_tpu_kernel_only_on_an_allow_listed_tpu(monkeypatch, caplog):
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
  softmax.warn_fallback.cache_clear()
  with caplog.at_level("WARNING"):
    assert attention.get("additive").resolve("auto", 64, "bfloat16") == "xla"
  warnings = [r.getMessage() for r in caplog.records if "attention_impl='auto'" in r.getMessage()]
  assert len(warnings) == 1 and "pallas_allowlist.py" in warnings[0], warnings
  device_kind, version = pallas_allowlist.platform()
  entry = {"device_kind": device_kind, "jax": version, "variants": ("additive",)}
  monkeypatch.setattr(pallas_allowlist, "ALLOWED", (entry,))
  assert attention.get("additive").resolve("auto", 64, "bfloat16") == "pallas_tpu"
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")  # the same entry: the GPU kernel
  assert attention.get("additive").resolve("auto", 64, "bfloat16") == "pallas"
  monkeypatch.setattr(pallas_allowlist, "ALLOWED", (dict(entry, device_kind="TPU v0"),))
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
  assert attention.get("additive").resolve("auto", 64, "bfloat16") == "xla"
  softmax.warn_fallback.cache_clear()


@pytest.mark.parametrize("backend,implementation,allowed", [
    ("tpu", "pallas_tpu", True), ("cpu", "pallas_tpu", True), ("gpu", "pallas_tpu", False),
    ("tpu", "pallas", False)])
def test_each_pallas_kernel_is_refused_off_its_backend_in_one_sentence(monkeypatch, backend,
                                                                       implementation, allowed):
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  check = lambda: attention.get("additive").validate(implementation, 16, 2)
  if allowed:
    check()
    return
  with pytest.raises(UsageError, match=rf"attention_impl='{implementation}' .* {backend} backend"):
    check()


def test_tiles_must_be_whole_sublanes():
  q = jnp.ones((1, 8, 1, 8))
  with pytest.raises(ValueError, match="multiple of 8"):
    additive_tpu.tpu_additive_attention(q, q, jnp.ones((1, 8), bool), jnp.ones((8, 1)),
                                        jnp.ones((8, 1)), tiling=additive_tpu.Tiling(block=12))


def test_default_tiles_are_whole_bfloat16_sublanes_and_fit_the_length():
  assert additive_tpu.default_tiling(37, 16, 4, True) == additive_tpu.Tiling(48, True)
  assert additive_tpu.default_tiling(16384, 256, 2, False) == additive_tpu.Tiling(512, False)
  assert additive_tpu.default_tiling(16384, 4096, 4, False).block == 16
  assert additive.KERNELS["pallas_tpu"] is additive_tpu.tpu_additive_attention
