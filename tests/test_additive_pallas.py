"""The Pallas Fastformer kernels (textattn/attention/additive_pallas.py), in interpret mode on a
CPU, against a float64 reference: values and gradients, padding, lengths that are not a multiple
of the tile, feature counts that are not a power of two, bfloat16; and how "auto" chooses them
(only on an allow-listed platform)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from textattn import attention
from textattn.attention import additive, additive_pallas, pallas_allowlist, softmax

# Tiles of 8 rows, 2 tiles a program: 37 positions are 5 tiles (the last one ragged) in 3
# programs per example, the last one half past the end. Interpret mode on a CPU; on a GPU
# (experiments/gpu/accelerators.sh runs this file there) compiled through Triton.
SMALL_TILES = additive_pallas.Tiling(block=8, blocks_per_split=2,
                                     interpret=jax.default_backend() == "cpu")


def float64_additive(q, k, mask, w_alpha, w_beta):
  """Fastformer's core from its definition, in float64 (call under jax.enable_x64)."""
  batch, length, _, head_dim = q.shape

  def pooled(x, w):
    scores = x.reshape(batch, length, -1) @ w / np.sqrt(head_dim)  # [b, l, h]
    scores = jnp.where(mask[..., None], scores, -jnp.inf)
    top = jnp.max(scores, axis=1, keepdims=True)
    e = jnp.where(mask[..., None], jnp.exp(scores - jnp.where(jnp.isfinite(top), top, 0)), 0)
    total = jnp.sum(e, axis=1, keepdims=True)
    weights = jnp.where(total > 0, e / jnp.where(total > 0, total, 1), 0)
    return jnp.einsum("blh,blhd->bhd", weights, x)

  p = k * pooled(q, w_alpha)[:, None]
  return q * pooled(p, w_beta)[:, None]


def inputs(heads, head_dim, dtype=np.float32, length=37, seed=0):
  """q, k, scoring kernels (rounded to `dtype`), and a mask: example 0 full, 1 with scattered
  and leading padding, 2 all padding."""
  rng = np.random.default_rng(seed)
  q, k = (rng.normal(size=(3, length, heads, head_dim)) for _ in range(2))
  w_alpha, w_beta = (rng.normal(size=(heads * head_dim, heads)) for _ in range(2))
  q, k, w_alpha, w_beta = (np.asarray(jnp.asarray(x, dtype), np.float64)
                           for x in (q, k, w_alpha, w_beta))
  mask = np.ones((3, length), bool)
  mask[1, :3], mask[1, 10::4], mask[2] = False, False, False
  return q, k, mask, w_alpha, w_beta


def values_and_grads(kernel, args, cotangent):
  q, k, mask, w_alpha, w_beta = args
  loss = lambda q, k, a, b: jnp.sum(kernel(q, k, mask, a, b).astype(cotangent.dtype) * cotangent)
  grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(q, k, w_alpha, w_beta)
  return [jax.jit(kernel)(*args)] + list(grads)


def reference(args, cotangent):
  with jax.enable_x64(True):
    args64 = [jnp.asarray(a, bool if a.dtype == bool else jnp.float64) for a in args]
    return [np.asarray(x) for x in
            values_and_grads(float64_additive, args64, jnp.asarray(cotangent, jnp.float64))]


def assert_relatively_close(got, want, tolerance, name):
  """max |got - want| <= tolerance * max |want| (the tensor's scale)."""
  got = np.asarray(jnp.asarray(got, jnp.float32), np.float64)
  assert np.all(np.isfinite(got)), name
  error, scale = np.max(np.abs(got - want)), np.max(np.abs(want))
  assert error <= tolerance * scale, f"{name}: max error {error:.3g} vs scale {scale:.3g}"


NAMES = ("u", "dq", "dk", "d_alpha_kernel", "d_beta_kernel")


@pytest.mark.parametrize("heads,head_dim,tiling,length", [
    (2, 8, SMALL_TILES, 37),  # F = 16; several tiles and programs, the last tile ragged
    (3, 8, SMALL_TILES, 37),  # F = 24, padded to 32 inside the kernel
    (2, 8, SMALL_TILES, 48),  # a length that is a multiple of the tile (and of the split)
    (2, 8, None, 37),  # the default tiling: 32-row tiles, one per program, the second ragged
], ids=["16_features_small_tiles", "24_features_small_tiles", "length_a_multiple_of_the_tile",
        "default_tiling"])
def test_pallas_kernel_matches_float64_values_and_gradients(heads, head_dim, tiling, length):
  args = inputs(heads, head_dim, length=length)
  cotangent = np.random.default_rng(1).normal(size=args[0].shape)
  want = reference(args, cotangent)
  kernel = lambda *a: additive_pallas.pallas_additive_attention(*a, tiling=tiling)
  f32 = [jnp.asarray(a) if a.dtype == bool else jnp.asarray(a, jnp.float32) for a in args]
  got = values_and_grads(kernel, f32, jnp.asarray(cotangent, jnp.float32))
  for name, g, w in zip(NAMES, got, want):
    assert_relatively_close(g, w, 1e-5, name)
  # The reference is the function the XLA kernel computes.
  assert_relatively_close(additive.additive_attention(*f32), want[0], 1e-5, "xla")
  assert np.all(np.asarray(got[0])[2] == 0)  # the all-padding example: exactly 0
  assert np.all(np.asarray(got[2])[:, ~args[2][1]][1] == 0)  # padding keys get no gradient


def test_pallas_kernel_in_bfloat16_is_within_bfloat16_rounding_of_float64():
  # bfloat16 q, k (8-bit mantissa); scores and sums are float32 inside, u and dq/dk are rounded
  # to bfloat16 once at the end. Stated bound: 2e-2 of each tensor's scale (bfloat16's relative
  # step is 2^-8 = 3.9e-3; measured here: at most 6.6e-3, in d_alpha_kernel).
  args = inputs(2, 8, dtype=jnp.bfloat16)
  cotangent = np.random.default_rng(2).normal(size=args[0].shape)
  want = reference(args, cotangent)
  kernel = lambda *a: additive_pallas.pallas_additive_attention(*a, tiling=SMALL_TILES)
  bf16 = [jnp.asarray(a) if a.dtype == bool else jnp.asarray(a, jnp.bfloat16) for a in args]
  got = values_and_grads(kernel, bf16, jnp.asarray(cotangent, jnp.float32))
  assert got[0].dtype == jnp.bfloat16 and got[1].dtype == jnp.bfloat16
  for name, g, w in zip(NAMES, got, want):
    assert_relatively_close(g, w, 2e-2, name)


def test_the_pallas_implementation_is_registered_and_the_module_uses_it():
  variant = attention.get("additive")
  assert "pallas" in variant.implementations and dict(variant.kernels)["pallas"] == "pallas"
  x = jax.random.normal(jax.random.key(0), (2, 37, 16))
  mask = jnp.arange(37)[None] < jnp.array([[37], [20]])
  modules = {impl: variant.build(num_heads=2, implementation=impl, dtype=jnp.float32)
             for impl in ("xla", "pallas")}
  params = modules["xla"].init(jax.random.key(1), x, mask)
  outputs = {impl: jax.jit(m.apply)(params, x, mask) for impl, m in modules.items()}
  assert_relatively_close(outputs["pallas"], np.asarray(outputs["xla"], np.float64), 1e-5, "out")


def test_auto_uses_pallas_only_on_an_allow_listed_platform(monkeypatch, caplog):
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  softmax.warn_fallback.cache_clear()
  with caplog.at_level("WARNING"):
    assert attention.get("additive").resolve("auto", 64, "bfloat16") == "xla"
    assert attention.get("additive").resolve("auto", 64, "float32") == "xla"
  warnings = [r.getMessage() for r in caplog.records if "attention_impl='auto'" in r.getMessage()]
  assert len(warnings) == 1 and "pallas_allowlist.py" in warnings[0], warnings
  device_kind, version = pallas_allowlist.platform()
  assert attention.get("causal_additive_recurrent").resolve("auto", 64, "bfloat16") == "xla"
  entry = {"device_kind": device_kind, "jax": version,
           "variants": ("additive", "causal_additive_recurrent")}
  monkeypatch.setattr(pallas_allowlist, "ALLOWED", (entry,))
  assert attention.get("additive").resolve("auto", 64, "bfloat16") == "pallas"
  assert attention.get("causal_additive_recurrent").resolve("auto", 64, "bfloat16") == "pallas"
  assert attention.get("causal_additive").resolve("auto", 64, "bfloat16") == "xla"  # none
  monkeypatch.setattr(pallas_allowlist, "ALLOWED", (dict(entry, jax="0.0.0"),))
  assert attention.get("additive").resolve("auto", 64, "bfloat16") == "xla"
  softmax.warn_fallback.cache_clear()


def test_the_committed_allow_list_is_empty_until_a_gpu_run_adds_to_it():
  # No accelerator has run the Pallas kernels yet; an entry comes with its RESULTS section.
  assert pallas_allowlist.ALLOWED == ()
  assert pallas_allowlist.refusal("additive") is not None  # (on a CPU: interpret mode only)


def test_pallas_is_refused_in_one_sentence_on_a_tpu(monkeypatch):
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
  with pytest.raises(ValueError, match="attention_impl='pallas' with additive attention runs on"):
    attention.get("additive").validate("pallas", 16, 2)
