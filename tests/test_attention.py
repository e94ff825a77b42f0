"""Attention kernels and modules against float64 NumPy references, masks and causality."""

import functools
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from textattn import attention
from textattn.attention import additive, softmax, splash

REPO = pathlib.Path(__file__).resolve().parent.parent

SHAPES = [(2, 7, 1, 4), (3, 16, 2, 8), (1, 33, 4, 16)]  # batch, length, heads, head_dim
KERNELS = {
    "xla": softmax.softmax_attention,
    "dot_product": softmax.dot_product_attention,
    "chunked": functools.partial(softmax.chunked_softmax_attention, chunk_size=5),
    "fused": softmax.fused_softmax_attention,
    "native": softmax.native_softmax_attention,
}


def random_qkv(shape, seed=0, scale=1.0):
  rng = np.random.default_rng(seed)
  return [(scale * rng.standard_normal(shape)).astype(np.float32) for _ in range(3)]


def random_padding(batch, length, seed=0):
  """Left-aligned real tokens: row 0 unpadded, row 1 (if any) fully padded, others random."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, length + 1, size=batch)
  lengths[0] = length
  if batch > 1:
    lengths[1] = 0
  return np.arange(length)[None, :] < lengths[:, None]


def numpy_softmax_attention(q, k, v, mask, causal):
  """Float64 transcription: softmax over visible keys; a query with no visible key outputs 0."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  visible = np.broadcast_to(mask[:, None, None, :], logits.shape)
  if causal:
    length = q.shape[1]
    visible = visible & np.tril(np.ones((length, length), bool))[None, None]
  logits = np.where(visible, logits, -np.inf)
  has_key = visible.any(-1, keepdims=True)
  logits = np.where(has_key, logits, 0.0)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights = np.where(visible, weights, 0.0)
  weights = weights / np.maximum(weights.sum(-1, keepdims=True), 1e-300)
  return np.einsum("bhqk,bkhd->bqhd", weights, v)


@pytest.mark.parametrize("causal", [False, True], ids=["softmax", "causal"])
@pytest.mark.parametrize("impl", list(KERNELS))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_softmax_kernels_match_float64_reference(shape, impl, causal):
  q, k, v = random_qkv(shape, seed=sum(shape))
  mask = random_padding(shape[0], shape[1], seed=shape[1])
  want = numpy_softmax_attention(q, k, v, mask, causal)
  got = KERNELS[impl](q, k, v, jnp.asarray(mask), causal=causal)
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)


@pytest.mark.cpu_only
@pytest.mark.parametrize("causal", [False, True], ids=["softmax", "causal"])
@pytest.mark.parametrize("head_dim,length", [(8, 45), (16, 45), (32, 45), (64, 45), (12, 45),
                                             (32, 100), (64, 100)],
                         ids=["blocked8", "blocked16", "blocked32", "blocked64", "generic",
                              "blocked32-L100", "blocked64-L100"])
def test_native_kernel_matches_float64_reference_with_skipped_blocks(head_dim, length, causal):
  # The native kernel's register-blocked path (head_dim 8, 16, 32, 64: 8, 4, 2 and 1 rows a
  # block; 16, 8, 4 and 2 with AVX-512) and its generic path, at lengths that are multiples of
  # neither 8 nor the row block (100: enough unpadded keys for the widest Q K^T tiles, 6 or 8
  # blocks of 8), with right padding, left padding, a fully padded row and scattered padding;
  # the loss ignores padding positions (as pooling does), so the backward's skipping of
  # zero-gradient rows and all-padding key blocks runs.
  batch = 5
  q, k, v = random_qkv((batch, length, 2, head_dim), seed=7)
  mask = np.ones((batch, length), bool)
  mask[1, 20:], mask[2, :], mask[3, :13], mask[4, ::3] = False, False, False, False
  weights = np.random.default_rng(8).standard_normal(q.shape).astype(np.float32)
  weights *= mask[:, :, None, None]
  want = numpy_softmax_attention(q, k, v, mask, causal)
  kernel = functools.partial(softmax.native_softmax_attention, causal=causal)
  got = kernel(q, k, v, jnp.asarray(mask))
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)

  def loss(fn, q, k, v):
    return jnp.sum(fn(q, k, v, jnp.asarray(mask)) * weights)

  reference = functools.partial(softmax.softmax_attention, causal=causal)
  want_grads = jax.grad(functools.partial(loss, reference), argnums=(0, 1, 2))(q, k, v)
  got_grads = jax.jit(jax.grad(functools.partial(loss, kernel), argnums=(0, 1, 2)))(q, k, v)
  for g_ref, g_got in zip(want_grads, got_grads, strict=True):
    np.testing.assert_allclose(np.asarray(g_got), np.asarray(g_ref), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True], ids=["softmax", "causal"])
@pytest.mark.parametrize("impl", [i for i in KERNELS if i != "xla"])
def test_softmax_kernels_match_reference_kernel_and_gradients(impl, causal):
  shape = (3, 16, 2, 8)
  q, k, v = random_qkv(shape, seed=3)
  mask = jnp.asarray(random_padding(shape[0], shape[1], seed=4))

  def loss(kernel, q, k, v):
    return jnp.sum(jnp.sin(kernel(q, k, v, mask, causal=causal)))

  grad = lambda kernel: jax.jit(jax.grad(functools.partial(loss, kernel), argnums=(0, 1, 2)))
  ref = grad(softmax.softmax_attention)(q, k, v)
  got = grad(KERNELS[impl])(q, k, v)
  for g_ref, g_got in zip(ref, got):
    np.testing.assert_allclose(np.asarray(g_got), np.asarray(g_ref), atol=1e-5, rtol=1e-5)


def test_reference_matches_jax_dot_product_attention_on_rows_with_keys():
  # jax.nn.dot_product_attention itself (no zeroing of key-less rows) on rows that have keys.
  shape = (2, 12, 2, 8)
  q, k, v = random_qkv(shape, seed=5)
  mask = np.ones(shape[:2], bool)
  mask[1, 9:] = False
  for causal in (False, True):
    want = jax.nn.dot_product_attention(q, k, v, mask=jnp.asarray(mask)[:, None, None, :],
                                        is_causal=causal)
    got = softmax.softmax_attention(q, k, v, jnp.asarray(mask), causal=causal)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


def numpy_additive(x, mask, params, heads):
  """Float64 transcription of Fastformer's equations with the module's own parameters."""
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
  x = np.asarray(x, np.float64)
  batch, length, embed = x.shape
  d = embed // heads
  q = np.einsum("ble,ehd->blhd", x, p["query"]["kernel"]) + p["query"]["bias"]
  k = np.einsum("ble,ehd->blhd", x, p["key"]["kernel"]) + p["key"]["bias"]

  def score(t, w):
    if w.shape == (heads * d, heads):
      return t.reshape(batch, length, heads * d) @ w / np.sqrt(d)
    return np.einsum("blhd,hd->blh", t, w) / np.sqrt(d)

  def softmax_tokens(s):
    s = np.where(mask[:, :, None], s, -np.inf)
    s = np.where(mask.any(1)[:, None, None], s, 0.0)
    e = np.where(mask[:, :, None], np.exp(s - s.max(1, keepdims=True)), 0.0)
    return e / np.maximum(e.sum(1, keepdims=True), 1e-300)

  alpha = softmax_tokens(score(q, p["alpha_kernel"]))
  g_q = np.einsum("blh,blhd->bhd", alpha, q)
  mixed = k * g_q[:, None]
  beta = softmax_tokens(score(mixed, p["beta_kernel"]))
  g_k = np.einsum("blh,blhd->bhd", beta, mixed)
  u = q * g_k[:, None]
  out = np.einsum("blhd,hde->ble", u, p["out"]["kernel"]) + p["out"]["bias"]
  return out + q.reshape(batch, length, embed)


@pytest.mark.parametrize("impl", ["xla", "native"])
@pytest.mark.parametrize("scoring", ("shared",))
def test_additive_matches_float64_transcription(scoring, impl):
  batch, length, embed, heads = 3, 11, 32, 4  # head_dim 8: the native kernel's smallest
  rng = np.random.default_rng(7)
  x = rng.standard_normal((batch, length, embed)).astype(np.float32)
  mask = np.arange(length)[None] < np.array([length, 5, 1])[:, None]
  module = attention.get("additive").build(num_heads=heads, implementation=impl)
  params = module.init(jax.random.key(0), x, jnp.asarray(mask))["params"]
  want = numpy_additive(x, mask, params, heads)
  got = module.apply({"params": params}, x, jnp.asarray(mask))
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)


def float64_additive_value(x, mask, params, heads, query_residual):
  """The Fastformer paper's form (numpy_additive with u = g_k * v) in jax.numpy, every step
  float64 (call under jax.enable_x64): differentiable, the reference's gradients."""
  x = x.astype(jnp.float64)
  p = jax.tree.map(lambda a: a.astype(jnp.float64), params)
  batch, length, embed = x.shape
  d = embed // heads
  q, k, v = (jnp.einsum("ble,ehd->blhd", x, p[n]["kernel"]) + p[n]["bias"]
             for n in ("query", "key", "value"))

  def softmax_tokens(t, w):
    s = jnp.where(mask[:, :, None], t.reshape(batch, length, heads * d) @ w / np.sqrt(d),
                  -jnp.inf)
    s = jnp.where(mask.any(1)[:, None, None], s, 0.0)
    e = jnp.where(mask[:, :, None], jnp.exp(s - s.max(1, keepdims=True)), 0.0)
    return e / jnp.maximum(e.sum(1, keepdims=True), 1e-300)

  g_q = jnp.einsum("blh,blhd->bhd", softmax_tokens(q, p["alpha_kernel"]), q)
  mixed = k * g_q[:, None]
  g_k = jnp.einsum("blh,blhd->bhd", softmax_tokens(mixed, p["beta_kernel"]), mixed)
  out = jnp.einsum("blhd,hde->ble", v * g_k[:, None], p["out"]["kernel"]) + p["out"]["bias"]
  return out + q.reshape(batch, length, embed) if query_residual else out


@pytest.mark.parametrize("query_residual", [True, False])
def test_additive_value_matches_float64_values_and_gradients(query_residual):
  batch, length, embed, heads = 3, 11, 32, 4
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.standard_normal((batch, length, embed)), jnp.float32)
  mask = jnp.asarray(np.arange(length)[None] < np.array([length, 5, 0])[:, None])
  module = attention.get("additive_value").build(num_heads=heads, implementation="xla",
                                                 query_residual=query_residual)
  params = module.init(jax.random.key(0), x, mask)["params"]
  # large scoring kernels, so that the softmaxes over tokens are far from uniform
  params = {**params, "alpha_kernel": 3 * params["alpha_kernel"] + 1,
            "beta_kernel": 3 * params["beta_kernel"] - 1}
  cotangent = rng.standard_normal((batch, length, embed))

  def loss(fn, p, x):
    return jnp.sum(fn(p, x).astype(jnp.float64 if x.dtype == jnp.float64 else jnp.float32)
                   * cotangent.astype(x.dtype))
  got = jax.value_and_grad(functools.partial(loss, lambda p, x: module.apply({"params": p}, x,
                                                                             mask)),
                           argnums=(0, 1))
  (_, (got_p, got_x)), y = got(params, x), module.apply({"params": params}, x, mask)
  with jax.enable_x64(True):
    reference = functools.partial(float64_additive_value, mask=mask, heads=heads,
                                  query_residual=query_residual)
    p64, x64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), (params, x))
    want = reference(x64, params=p64)
    _, (want_p, want_x) = jax.value_and_grad(
        functools.partial(loss, lambda p, x: reference(x, params=p)), argnums=(0, 1))(p64, x64)
    want, want_p, want_x = jax.tree.map(np.asarray, (want, want_p, want_x))
  np.testing.assert_allclose(np.asarray(y), want, atol=1e-5, rtol=1e-5)
  if not query_residual:  # the example with no real token: W_o 0 + b
    np.testing.assert_allclose(want[2], np.broadcast_to(params["out"]["bias"], want[2].shape))
  np.testing.assert_allclose(np.asarray(got_x), want_x, atol=2e-4, rtol=2e-4)
  assert jax.tree.structure(got_p) == jax.tree.structure(want_p)
  for g, w in zip(jax.tree.leaves(got_p), jax.tree.leaves(want_p)):
    np.testing.assert_allclose(np.asarray(g), w, atol=2e-4, rtol=2e-4)
  assert np.abs(want_p["value"]["kernel"]).max() > 0  # the value projection is used


def additive_inputs(batch, length, heads, head_dim, scoring, seed=0):
  """q, k, a padding mask (row 0 full, row 1 all padding, the rest random lengths) and the two
  scoring kernels in the `scoring` form."""
  rng = np.random.default_rng(seed)
  q, k = (rng.standard_normal((batch, length, heads, head_dim)).astype(np.float32)
          for _ in range(2))
  lengths = rng.integers(1, length + 1, batch)
  lengths[0], lengths[1] = length, 0
  mask = np.arange(length)[None] < lengths[:, None]
  shape = (heads * head_dim, heads) if scoring == "shared" else (heads, head_dim)
  w_alpha, w_beta = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
  return q, k, mask, w_alpha, w_beta


def numpy_additive_core(q, k, mask, w_alpha, w_beta):
  """additive_attention's maths in float64 NumPy (both scoring forms)."""
  q, k, w_alpha, w_beta = (np.asarray(a, np.float64) for a in (q, k, w_alpha, w_beta))
  batch, length, heads, head_dim = q.shape

  def scores(x, w):
    if w.shape == (heads * head_dim, heads):
      return x.reshape(batch, length, -1) @ w / np.sqrt(head_dim)
    return np.einsum("blhd,hd->blh", x, w) / np.sqrt(head_dim)

  def masked_softmax(s):
    s = np.where(mask[..., None], s, -np.inf)
    top = np.max(s, axis=1, keepdims=True)
    e = np.where(mask[..., None], np.exp(s - np.where(np.isfinite(top), top, 0)), 0)
    total = e.sum(axis=1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)

  alpha = masked_softmax(scores(q, w_alpha))
  p = k * np.einsum("blh,blhd->bhd", alpha, q)[:, None]
  beta = masked_softmax(scores(p, w_beta))
  return q * np.einsum("blh,blhd->bhd", beta, p)[:, None]


@pytest.mark.parametrize("scoring", ("shared",))
@pytest.mark.parametrize("heads,head_dim,length", [(2, 16, 37), (4, 8, 9), (1, 64, 5),
                                                   (2, 24, 13), (3, 32, 8), (2, 48, 6)])
def test_native_additive_kernel_matches_float64_and_the_xla_function(heads, head_dim, length,
                                                                     scoring):
  # head_dim 8, 16, 32, 64 take the kernel's unrolled paths, 24 and 48 the general ones; on an
  # AVX-512 CPU 16, 32, 48 and 64 take the 16-float chunks (8 and 24 the 8-float ones; the
  # 8-float build of them all: test_the_8_float_key_path_is_exact_on_an_avx512_cpu_too).
  q, k, mask, w_alpha, w_beta = additive_inputs(4, length, heads, head_dim, scoring)
  args = [jnp.asarray(a) for a in (q, k, mask, w_alpha, w_beta)]
  got = jax.jit(additive.native_additive_attention)(*args)
  np.testing.assert_allclose(np.asarray(got), numpy_additive_core(q, k, mask, w_alpha, w_beta),
                             atol=2e-5, rtol=2e-5)
  assert np.all(np.asarray(got)[1] == 0)  # the all-padding example
  cotangent = jnp.asarray(np.random.default_rng(1).standard_normal(q.shape), jnp.float32)

  def grads(kernel):
    loss = lambda q, k, a, b: jnp.sum(kernel(q, k, args[2], a, b) * cotangent)
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(args[0], args[1], args[3], args[4])

  for name, g, want in zip(("q", "k", "w_alpha", "w_beta"),
                           grads(additive.native_additive_attention),
                           grads(additive.additive_attention)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(want), atol=2e-4, rtol=2e-4,
                               err_msg=name)


def test_a_native_build_that_fails_names_the_compilers_error(tmp_path, monkeypatch):
  # The sources compile in one command: a first source's error is followed by the second's
  # warnings (from jaxlib's FFI headers in the real build; here three #warning lines, which
  # compile in no time). The message must carry the error (it once showed only the last lines).
  from textattn.attention import native
  if native.find_compiler() is None:
    pytest.skip("no C++ compiler")
  broken, warns = tmp_path / "broken.cc", tmp_path / "warns.cc"
  broken.write_text("constexpr int kTiles = UNDEFINED_TILES;\n")
  warns.write_text("".join(f'#warning "later warning {i}"\n' for i in range(3)))
  monkeypatch.setattr(native, "SOURCES", (broken, warns))
  monkeypatch.setenv("TEXTATTN_NATIVE_CACHE", str(tmp_path / "cache"))
  with pytest.raises(native.NativeUnavailable, match="UNDEFINED_TILES"):
    native.build()
  assert not list((tmp_path / "cache").glob("*.so"))  # no library left behind


def test_native_additive_kernel_propagates_nan_and_checks_shapes():
  q, k, mask, w_alpha, w_beta = (jnp.asarray(a) for a in additive_inputs(3, 6, 2, 8, "shared"))
  bad = w_alpha.at[0, 0].set(jnp.nan)
  for kernel in (additive.additive_attention, additive.native_additive_attention):
    out = np.asarray(jax.jit(kernel)(q, k, mask, bad, w_beta))
    assert np.all(np.isnan(out[0])), kernel.__name__  # a NaN score is not "no real token"
    assert np.all(out[1] == 0), kernel.__name__  # the all-padding example stays 0
  with pytest.raises(ValueError, match="must have the same"):
    additive.native_additive_attention(q, k[:, :5], mask, w_alpha, w_beta)


@pytest.mark.parametrize("kernel", ["softmax", "additive"])
def test_native_kernels_do_not_depend_on_their_threads(monkeypatch, kernel):
  # Work is split over XLA's thread pool, where tasks go to whichever worker claims them first. The additive kernel's scoring gradients are summed
  # over examples in a fixed order, so every thread count and both ways must agree bit for bit.
  if kernel == "additive":
    q, k, mask, w_alpha, w_beta = (jnp.asarray(a) for a in
                                   additive_inputs(7, 20, 2, 16, "shared", seed=3))
    loss = lambda q, k, a, b: jnp.sum(jnp.sin(
        additive.native_additive_attention(q, k, mask, a, b)))
    args = (q, k, w_alpha, w_beta)
  else:
    rng = np.random.default_rng(3)
    q, k, v = (jnp.asarray(rng.normal(size=(7, 20, 2, 16)), jnp.float32) for _ in range(3))
    mask = jnp.asarray(np.arange(20)[None] < rng.integers(0, 21, (7, 1)))
    loss = lambda q, k, v: jnp.sum(jnp.sin(softmax.native_softmax_attention(q, k, v, mask)))
    args = (q, k, v)
  results = []
  for threads in (1, 2, 3):
    monkeypatch.setattr(softmax, "usable_cores", lambda threads=threads: threads)
    monkeypatch.setattr(additive, "usable_cores", lambda threads=threads: threads)
    results.append(jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(args)))))(*args))
  for other in results[1:]:
    for a, b in zip(jax.tree_util.tree_leaves(results[0]), jax.tree_util.tree_leaves(other)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# cuDNN needs an NVIDIA GPU and bf16; splash runs here in TPU interpret mode, too slowly for
# these module tests (test_splash_attention_matches_float64_reference checks it); everything else
# runs (and is tested) on the CPU. "auto" is one of the others
# (test_auto_picks_the_native_kernel_on_this_cpu).
CPU_IMPLEMENTATIONS = [i for i in softmax.IMPLEMENTATIONS if i not in ("cudnn", "splash", "auto")]
MODULES = [("softmax", impl, "shared") for impl in CPU_IMPLEMENTATIONS] + [
    ("causal", impl, "shared") for impl in CPU_IMPLEMENTATIONS] + [
    ("additive", impl, s) for impl in ("xla", "native") for s in ("shared",)]


def heads_for(name, impl):
  # These tests' embed is 8: the native additive kernel needs head_dim % 8 == 0.
  return 1 if (name, impl) == ("additive", "native") else 2


def make_module(name, impl, scoring):
  del scoring  # (additive attention has one scoring form, the authors' shared one)
  return attention.get(name).build(num_heads=heads_for(name, impl), implementation=impl)


@pytest.mark.parametrize("name,impl,scoring", MODULES)
def test_no_nan_for_fully_padded_rows_or_huge_inputs(name, impl, scoring):
  rng = np.random.default_rng(0)
  x = rng.standard_normal((3, 10, 8)).astype(np.float32)
  mask = jnp.asarray(np.arange(10)[None] < np.array([0, 4, 10])[:, None])  # row 0: all padding
  module = make_module(name, impl, scoring)
  params = module.init(jax.random.key(1), x, mask)
  out_and_grads = jax.jit(jax.value_and_grad(lambda p, x: jnp.sum(module.apply(p, x, mask))))
  for scale in (1.0, 1e4):
    out = jax.jit(module.apply)(params, x * scale, mask)
    _, grads = out_and_grads(params, x * scale)
    assert np.all(np.isfinite(np.asarray(out))), (name, impl, scale)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree_util.tree_leaves(grads))


@pytest.mark.parametrize("name,impl,scoring", MODULES)
def test_padded_positions_do_not_change_real_outputs(name, impl, scoring):
  rng = np.random.default_rng(1)
  x = rng.standard_normal((2, 9, 8)).astype(np.float32)
  mask = np.arange(9)[None] < np.array([9, 5])[:, None]
  module = make_module(name, impl, scoring)
  params = module.init(jax.random.key(2), x, jnp.asarray(mask))
  changed = np.where(mask[..., None], x, 100 * rng.standard_normal(x.shape)).astype(np.float32)
  a = module.apply(params, x, jnp.asarray(mask))
  b = module.apply(params, changed, jnp.asarray(mask))
  np.testing.assert_allclose(np.asarray(a)[mask], np.asarray(b)[mask], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", CPU_IMPLEMENTATIONS)
def test_causal_output_ignores_and_has_zero_gradient_wrt_the_future(impl):
  rng = np.random.default_rng(2)
  length = 8
  x = rng.standard_normal((2, length, 8)).astype(np.float32)
  mask = jnp.asarray(np.arange(length)[None] < np.array([8, 6])[:, None])
  module = make_module("causal", impl, "shared")
  params = module.init(jax.random.key(3), x, mask)
  apply = jax.jit(lambda inp: module.apply(params, inp, mask))
  out = np.asarray(apply(x))
  jacobian = jax.jit(jax.jacrev(apply))(x)  # [b,l,e, b,l,e]
  for t in range(length):
    future_changed = x.copy()
    future_changed[:, t + 1:] = rng.standard_normal(future_changed[:, t + 1:].shape)
    changed_out = np.asarray(apply(future_changed))
    np.testing.assert_array_equal(changed_out[:, :t + 1], out[:, :t + 1])
    future_grad = np.asarray(jacobian)[:, t, :, :, t + 1:, :]
    assert np.all(future_grad == 0.0), f"output {t} has gradient from the future ({impl})"


def test_causal_is_really_different_from_softmax():
  # Guards against the causal flag being silently dropped.
  rng = np.random.default_rng(3)
  x = rng.standard_normal((1, 6, 8)).astype(np.float32)
  mask = jnp.ones((1, 6), bool)
  soft, causal = make_module("softmax", "xla", "shared"), make_module("causal", "xla", "shared")
  params = soft.init(jax.random.key(0), x, mask)
  assert not np.allclose(soft.apply(params, x, mask), causal.apply(params, x, mask))


def _ffi_operand_dtypes(jaxpr):
  """dtypes of the operands of every ffi_call in a jaxpr, nested jaxprs included."""
  dtypes = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "ffi_call":
      dtypes += [v.aval.dtype for v in eqn.invars]
    for param in eqn.params.values():
      sub = getattr(param, "jaxpr", param)
      if hasattr(sub, "eqns"):
        dtypes += _ffi_operand_dtypes(sub)
  return dtypes


@pytest.mark.parametrize("name,impl,scoring", MODULES)
def test_softmax_runs_in_float32_under_bfloat16(name, impl, scoring):
  x = np.random.default_rng(4).standard_normal((2, 8, 8)).astype(np.float32)
  mask = jnp.ones((2, 8), bool)
  module = attention.get(name).build(num_heads=heads_for(name, impl), implementation=impl,
                                     dtype=jnp.bfloat16)
  params = module.init(jax.random.key(0), x, mask)
  jaxpr = jax.make_jaxpr(lambda p: module.apply(p, x.astype(jnp.bfloat16), mask))(params)
  if impl == "native":  # the softmax is inside the C++ kernel: its operands must be float32
    dtypes = _ffi_operand_dtypes(jaxpr.jaxpr)
    assert dtypes, "no native kernel call found in the attention's jaxpr"
    assert all(d in (jnp.float32, jnp.int32) for d in dtypes), dtypes
  else:
    exps = [line for line in str(jaxpr).splitlines()
            if " exp " in f" {line} " or "= exp" in line]
    assert exps, "no exp found in the attention's jaxpr"
    assert all("f32" in line and "bf16" not in line.split("=")[0] for line in exps), exps
  f32 = make_module(name, impl, scoring)
  np.testing.assert_allclose(
      np.asarray(module.apply(params, x.astype(jnp.bfloat16), mask), np.float32),
      np.asarray(f32.apply(params, x, mask)), atol=0.1, rtol=0.05)


def test_chunked_never_materialises_the_full_score_matrix():
  length, chunk = 512, 64
  q = jnp.zeros((1, length, 1, 8))
  mask = jnp.ones((1, length), bool)
  fn = functools.partial(softmax.chunked_softmax_attention, chunk_size=chunk)
  grad_fn = jax.grad(lambda q: jnp.sum(fn(q, q, q, mask)))
  hlo = jax.jit(grad_fn).lower(q).compile().as_text()
  assert f"{length},{length}]" not in hlo
  ref_hlo = jax.jit(jax.grad(lambda q: jnp.sum(softmax.softmax_attention(q, q, q, mask)))
                    ).lower(q).compile().as_text()
  assert f"{length},{length}]" in ref_hlo  # the check above can see an L x L buffer


@pytest.mark.parametrize("name,kwargs,words", [
    ("nonexistent", {}, ["config.model.attention='nonexistent'", "not a known attention", "softmax"]),
    ("softmax", {"implementation": "flash"}, ["config.model.attention_impl='flash'", "fused"]),
    ("additive", {"implementation": "fused"}, ["config.model.attention_impl='fused'", "native"]),
    ("softmax", {"num_heads": 3}, ["config.model.num_heads=3", "embed_dim=32"]),
    ("additive", {"implementation": "native", "num_heads": 8},
     ["config.model.attention_impl='native'", "embed_dim / num_heads = 4", "multiple of 8"]),
])
def test_bad_attention_config_names_field_value_and_choices(name, kwargs, words):
  args = {"implementation": "xla", "embed_dim": 32, "num_heads": 2}
  args.update(kwargs)
  with pytest.raises(ValueError) as error:
    attention.get(name).validate(**args)
  for word in words:
    assert word in str(error.value)


@pytest.mark.cpu_only
def test_auto_picks_the_native_kernel_on_this_cpu():
  # Where a C++ compiler exists, a broken build would make "auto" fall back silently to the
  # slower XLA kernel: this fails and says why instead.
  from textattn.attention import native
  if native.find_compiler() is None:
    pytest.skip("no C++ compiler here: 'auto' uses the fused XLA kernel")
  assert native.unavailable_reason() is None
  assert attention.get("softmax").resolve("auto", 16) == "native"
  assert attention.get("causal").resolve("fused", 16) == "fused"
  assert attention.get("additive").resolve("auto", 16) == "native"
  assert attention.get("additive").resolve("auto", 12) == "xla"  # head_dim % 8
  assert attention.get("additive").resolve("xla", 16) == "xla"


@pytest.mark.parametrize("impl", [i for i in KERNELS if i != "native"])
def test_kernels_at_the_backends_default_matmul_precision(impl):
  # The suite runs float32 products in full precision (conftest); on GPUs JAX's default is TF32
  # (~1e-3 relative error per product), which is what training uses there. Here the kernels run
  # at the default precision against the float64 reference with a tolerance that fits TF32.
  shape = (2, 16, 2, 16)
  q, k, v = random_qkv(shape, seed=11)
  mask = random_padding(shape[0], shape[1], seed=12)
  want = numpy_softmax_attention(q, k, v, mask, False)
  with jax.default_matmul_precision("default"):
    got = jax.jit(functools.partial(KERNELS[impl], causal=False))(q, k, v, jnp.asarray(mask))
  np.testing.assert_allclose(np.asarray(got), want, atol=2e-2, rtol=2e-2)


@pytest.mark.cpu_only  # the fallback it names ("fused") is the CPU's; an H200 run failed it
def test_auto_falls_back_with_one_warning_naming_the_reason(monkeypatch, caplog):
  monkeypatch.setattr(jax, "device_count", lambda: 2)  # the native kernel needs one device
  softmax.warn_fallback.cache_clear()
  with caplog.at_level("WARNING"):
    assert attention.get("softmax").resolve("auto", 16) == "fused"
    assert attention.get("softmax").resolve("auto", 16) == "fused"
  warnings = [r.getMessage() for r in caplog.records if "attention_impl='auto'" in r.getMessage()]
  assert len(warnings) == 1 and "2 devices" in warnings[0], warnings
  softmax.warn_fallback.cache_clear()


@pytest.mark.parametrize("backend,dtype,want", [
    ("gpu", "bfloat16", "cudnn"), ("gpu", "float16", "cudnn"), ("gpu", "float32", "dot_product"),
    ("tpu", "bfloat16", "splash"), ("tpu", "float32", "splash"), ("cpu", "bfloat16", None)])
def test_auto_picks_flash_attention_on_a_gpu_in_bfloat16_and_splash_on_a_tpu(monkeypatch, backend,
                                                                              dtype, want):
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  for name in ("softmax", "causal"):
    got = attention.get(name).resolve("auto", 64, dtype)
    assert got == want if want else got in ("native", "fused")  # (the CPU's own choice)
  if backend != "cpu":
    assert attention.get("additive").resolve("auto", 64, dtype) == "xla"
  softmax.warn_fallback.cache_clear()


@pytest.mark.parametrize("backend,allowed", [("tpu", True), ("cpu", True), ("gpu", False)])
def test_splash_is_refused_on_a_gpu_in_one_sentence(monkeypatch, backend, allowed):
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  args = {"implementation": "splash", "embed_dim": 32, "num_heads": 2}
  if allowed:
    attention.get("causal").validate(**args)
    return
  with pytest.raises(ValueError, match=r"attention_impl='splash' runs on a TPU .* gpu backend"):
    attention.get("causal").validate(**args)


@pytest.mark.parametrize("causal", [False, True], ids=["softmax", "causal"])
def test_splash_attention_matches_float64_reference(causal):
  # JAX's Pallas TPU splash kernel, in TPU interpret mode on a CPU: 37 positions (padded to 128
  # inside), row 1 all padding (output exactly 0), row 2 right-padded; values against the
  # float64 transcription, gradients against the reference kernel's.
  shape = (3, 37, 2, 8)
  q, k, v = random_qkv(shape, seed=31)
  mask = jnp.asarray(random_padding(shape[0], shape[1], seed=32))
  cotangent = jax.random.normal(jax.random.key(33), shape)

  def values_and_grads(kernel):
    out, pullback = jax.vjp(lambda q, k, v: kernel(q, k, v, mask, causal=causal), q, k, v)
    return (out,) + pullback(cotangent)

  got = jax.jit(functools.partial(values_and_grads, splash.splash_attention))()
  want = jax.jit(functools.partial(values_and_grads, softmax.softmax_attention))()
  np.testing.assert_allclose(np.asarray(got[0]),
                             numpy_softmax_attention(q, k, v, np.asarray(mask), causal),
                             atol=1e-5, rtol=1e-5)
  assert np.all(np.asarray(got[0])[1] == 0)
  for name, g, w in zip(("dq", "dk", "dv"), got[1:], want[1:]):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5, rtol=1e-5, err_msg=name)


@pytest.mark.skipif(jax.default_backend() != "gpu",
                    reason="cuDNN flash attention needs an NVIDIA GPU (this run: "
                           f"{jax.default_backend()})")
@pytest.mark.parametrize("causal", [False, True], ids=["softmax", "causal"])
def test_cudnn_flash_attention_matches_float64_reference(causal):
  # bfloat16 inputs (what cuDNN's flash kernel takes), padding as key lengths; rows without a
  # visible key (the all-padding row 1) must be zero. Tolerance: bfloat16's 8-bit mantissa.
  shape = (3, 128, 2, 64)
  q, k, v = random_qkv(shape, seed=21)
  mask = random_padding(shape[0], shape[1], seed=22)
  q, k, v = (np.asarray(jnp.asarray(a, jnp.bfloat16), np.float32) for a in (q, k, v))
  want = numpy_softmax_attention(q, k, v, mask, causal)
  got = jax.jit(functools.partial(softmax.cudnn_attention, causal=causal))(
      *(jnp.asarray(a, jnp.bfloat16) for a in (q, k, v)), jnp.asarray(mask))
  np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=3e-2, rtol=3e-2)
  assert np.all(np.asarray(got, np.float32)[1] == 0)


_KEY_LANES_CHECK = """
import functools, jax, jax.numpy as jnp, numpy as np
from tests.test_attention import numpy_softmax_attention, random_qkv
from textattn.attention import native, softmax
assert native.key_lanes() == 8, native.key_lanes()
for head_dim, length, causal in ((16, 45, False), (32, 100, True)):
  q, k, v = random_qkv((3, length, 2, head_dim), seed=7)
  mask = np.ones((3, length), bool)
  mask[1, 20:], mask[2, ::3] = False, False
  kernel = functools.partial(softmax.native_softmax_attention, causal=causal)
  np.testing.assert_allclose(np.asarray(kernel(q, k, v, jnp.asarray(mask))),
                             numpy_softmax_attention(q, k, v, mask, causal), atol=1e-5, rtol=1e-5)
  w = np.random.default_rng(8).standard_normal(q.shape).astype(np.float32) * mask[:, :, None, None]
  loss = lambda fn, *qkv: jnp.sum(fn(*qkv, jnp.asarray(mask)) * w)
  reference = functools.partial(softmax.softmax_attention, causal=causal)
  for a, b in zip(jax.grad(functools.partial(loss, kernel), argnums=(0, 1, 2))(q, k, v),
                  jax.grad(functools.partial(loss, reference), argnums=(0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)
from tests.test_attention import additive_inputs, numpy_additive_core
from textattn.attention import additive
for heads, head_dim, length in ((2, 16, 37), (1, 64, 5), (2, 48, 6)):
  q, k, mask, w_alpha, w_beta = additive_inputs(4, length, heads, head_dim, "shared")
  args = [jnp.asarray(a) for a in (q, k, mask, w_alpha, w_beta)]
  np.testing.assert_allclose(np.asarray(additive.native_additive_attention(*args)),
                             numpy_additive_core(q, k, mask, w_alpha, w_beta), atol=2e-5, rtol=2e-5)
  w = jnp.asarray(np.random.default_rng(1).standard_normal(q.shape), jnp.float32)
  def grads(kernel):
    loss = lambda q, k, a, b: jnp.sum(kernel(q, k, args[2], a, b) * w)
    return jax.grad(loss, argnums=(0, 1, 2, 3))(args[0], args[1], args[3], args[4])
  for a, b in zip(grads(additive.native_additive_attention), grads(additive.additive_attention)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-4, rtol=2e-4)
print("ok")
"""


@pytest.mark.cpu_only
def test_the_8_float_key_path_is_exact_on_an_avx512_cpu_too(tmp_path):
  """$TEXTATTN_NATIVE_KEY_LANES=8 builds the vectors an AVX2-only CPU gets (the softmax kernel's
  keys, the additive kernel's feature chunks), on any CPU; that build's values and gradients
  match the references as the default build's do (the tests above: 16-float vectors on an
  AVX-512 CPU). The default's width follows the CPU's AVX-512F flag."""
  from textattn.attention import native
  flags = native.cpu_signature().split()
  assert native.key_lanes() == (16 if "avx512f" in flags else 8)
  env = dict(os.environ, TEXTATTN_NATIVE_KEY_LANES="8", TEXTATTN_NATIVE_CACHE=str(tmp_path))
  result = subprocess.run([sys.executable, "-c", _KEY_LANES_CHECK], env=env, cwd=REPO,
                          capture_output=True, text=True, check=False)
  assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
