"""Learned feature maps of linear attention (hedgehog, t2r): float64 references for values and
gradients (queries, keys, values and the maps' own parameters) in every kernel, and their
parameters' place in the model."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.test_attention_families import (
  CHUNK,
  B,
  D,
  H,
  L,
  assert_relatively_close,
  causal_band,
  float64_kernel_attention,
  padding_and_segments,
  values_and_grads,
  visibility,
)
from textattn import attention
from textattn.attention import common, feature_maps, linear

FEATURES = 3  # != head_dim: the maps' rectangular case


def reference_phi(name, x, params, is_query, xp):
  """The map by its formula (float64 under jax.enable_x64)."""
  if name == "hedgehog":
    side = "query" if is_query else "key"
    z = xp.einsum("blhd,hdf->blhf", x, params[f"{side}_kernel"]) + params[f"{side}_bias"]
    softmax = lambda u: xp.exp(u - u.max(-1, keepdims=True)) / xp.exp(
        u - u.max(-1, keepdims=True)).sum(-1, keepdims=True)
    return xp.concatenate([softmax(z), softmax(-z)], axis=-1)
  z = xp.einsum("blhd,hdf->blhf", x, params["map_kernel"]) + params["map_bias"]
  return xp.maximum(z, 0.0)


def inputs(name, seed=0):
  rng = np.random.default_rng(seed)
  q, k, v, cotangent = (rng.normal(size=(B, L, H, D)).astype(np.float32) for _ in range(4))
  module = {"hedgehog": feature_maps.HedgehogFeatures,
            "t2r": feature_maps.T2RFeatures}[name](H, D, FEATURES)
  params = jax.tree.map(np.asarray, module.init(jax.random.key(seed), jnp.asarray(q),
                                                is_query=True)["params"])
  if name == "hedgehog":  # both sides, away from the identity init
    params = module.init(jax.random.key(seed), jnp.asarray(q), is_query=False)["params"]
    params = dict(params, **module.init(jax.random.key(seed), jnp.asarray(q),
                                        is_query=True)["params"])
  params = {key: np.asarray(value) + rng.normal(size=value.shape).astype(np.float32) * 0.5
            for key, value in params.items()}
  return module, q, k, v, cotangent, params


KERNELS = {"xla": linear.causal_linear_attention,
           "chunked": functools.partial(linear.chunked_causal_linear_attention,
                                        chunk_size=CHUNK),
           "recurrent": linear.recurrent_causal_linear_attention}


@pytest.mark.parametrize("kernel", [*KERNELS, "bidirectional"])
@pytest.mark.parametrize("name", ["hedgehog", "t2r"])
def test_learned_maps_match_float64_values_and_gradients(name, kernel):
  module, q, k, v, cotangent, params = inputs(name)
  mask, segments = padding_and_segments()
  causal = kernel != "bidirectional"
  segments = segments if causal else None
  visible = visibility(mask, segments, causal_band if causal else lambda t, i: True)
  real, runs = common.segment_runs(jnp.asarray(mask), None if segments is None
                                   else jnp.asarray(segments))

  def attend(q, k, v, params):
    phi = lambda x, is_query: module.apply({"params": params}, x, is_query=is_query)
    fq, fk = phi(q, True), phi(k, False)
    if not causal:
      return linear.linear_attention(fq, fk, v, real)
    return KERNELS[kernel](fq, fk, v, real, runs)

  got = jax.jit(lambda *a: values_and_grads(attend, a, cotangent))(q, k, v, params)

  def attend64(q, k, v, params):
    fq = reference_phi(name, q, params, True, jnp)
    fk = reference_phi(name, k, params, False, jnp)
    return float64_kernel_attention(fq, fk, v, jnp.asarray(visible))

  with jax.enable_x64(True):
    args = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), (q, k, v, params))
    want = jax.jit(lambda *a: values_and_grads(  # (one compiled program, not op by op)
        attend64, a, jnp.asarray(cotangent, jnp.float64)))(*args)
  for what, g, w in zip(("out", "d_q", "d_k", "d_v", "d_params"), got, want):
    for path_g, path_w in zip(jax.tree.leaves(g), jax.tree.leaves(w)):
      assert_relatively_close(path_g, path_w, 2e-5, f"{name} {kernel} {what}")


def test_hedgehog_starts_at_the_identity_and_the_maps_parameters_train():
  """In a causal_linear layer the map's parameters sit under "feature_map" (queries and keys
  apart for hedgehog, initialised W = I, b = 0) and receive gradients."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(2, 9, 8)), jnp.float32)
  mask = jnp.ones((2, 9), bool)
  for name, leaves in (("hedgehog", {"query_kernel", "query_bias", "key_kernel", "key_bias"}),
                       ("t2r", {"map_kernel", "map_bias"})):
    layer = attention.get("causal_linear").build(num_heads=2, feature_map=name,
                                                 implementation="chunked", chunk_size=4)
    params = jax.jit(layer.init)(jax.random.key(0), x, mask)["params"]
    assert set(params["feature_map"]) == leaves, params["feature_map"].keys()
    if name == "hedgehog":
      np.testing.assert_array_equal(params["feature_map"]["query_kernel"][1], np.eye(4))
    grads = jax.jit(jax.grad(
        lambda p, layer=layer: jnp.sum(layer.apply({"params": p}, x, mask) ** 2)))(params)
    assert all(np.abs(np.asarray(g)).max() > 0 for g in jax.tree.leaves(grads["feature_map"]))


# ---------------------------------------------------------------------------------------------
# LoLCATs' window + linear hybrid (textattn/attention/hybrid.py).

def reference_hybrid(q, k, v, fq, fk, mask, g, window, causal, xp=jnp):
  """The hybrid's formula in float64, position by position in its masks."""
  t, i = np.arange(L)[:, None], np.arange(L)[None, :]
  visible = mask[:, None, None, :] & ((i <= t) if causal else np.ones((L, L), bool))[None, None]
  band = ((t - i >= 0) & (t - i < window)) if causal else (np.abs(t - i) <= window)
  inside, outside = visible & band[None, None], visible & ~band[None, None]
  s = xp.einsum("bthd,bihd->bhti", q, k) / np.sqrt(D)
  top = xp.max(xp.where(inside, s, -np.inf), axis=-1, keepdims=True)
  top = xp.where(xp.isfinite(top), top, 0.0)
  near = xp.where(inside, g[None, :, None, None] * xp.exp(xp.where(inside, s - top, 0.0)), 0.0)
  far = (1 - g[None, :, None, None]) * xp.einsum("bthf,bihf->bhti", fq, fk) * outside
  w = near + far
  total = w.sum(-1)
  out = xp.einsum("bhti,bihd->bthd", w, v)
  return xp.where((total > 0).transpose(0, 2, 1)[..., None],
                  out / xp.where(total > 0, total, 1.0).transpose(0, 2, 1)[..., None], 0.0)


@pytest.mark.parametrize("kernel", ["xla", "chunked"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_window_linear_hybrid_matches_float64_values_and_gradients(causal, kernel):
  """Both kernels; window 3 over L = 11 positions: the blocked kernel has 4 blocks (the last
  padded), so keys reach a query through the window, its neighbour blocks' far keys and the
  cumulated sums of the blocks beyond."""
  from textattn.attention import hybrid
  rng = np.random.default_rng(3)
  q, k, v, cotangent = (rng.normal(size=(B, L, H, D)).astype(np.float32) for _ in range(4))
  fq, fk = (np.abs(rng.normal(size=(B, L, H, 5))).astype(np.float32) for _ in range(2))
  g = np.array([0.3, 0.8], np.float32)
  mask, _ = padding_and_segments()
  fn = functools.partial(hybrid.KERNELS[kernel], real=jnp.asarray(mask), window=3,
                         causal=causal)
  got = jax.jit(lambda *a: values_and_grads(lambda q, k, v, fq, fk, g: fn(q, k, v, fq, fk, mix=g),
                                            a, cotangent))(q, k, v, fq, fk, g)
  with jax.enable_x64(True):
    args = tuple(jnp.asarray(a, jnp.float64) for a in (q, k, v, fq, fk, g))
    want = jax.jit(lambda *a: values_and_grads(  # (one compiled program, not op by op)
        lambda q, k, v, fq, fk, g: reference_hybrid(q, k, v, fq, fk, mask, g, 3, causal), a,
        jnp.asarray(cotangent, jnp.float64)))(*args)
  for what, a, b in zip(("out", "d_q", "d_k", "d_v", "d_fq", "d_fk", "d_g"), got, want):
    assert_relatively_close(a, b, 2e-5, what)
  if causal:  # a later key changes no earlier output
    changed = k.copy()
    changed[:, 7:] += 1.0
    later = np.asarray(fn(q, changed, v, fq, fk, mix=g))
    np.testing.assert_array_equal(later[:, :7], np.asarray(got[0])[:, :7])


def test_window_linear_with_a_window_over_the_row_is_softmax_with_the_same_weights():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(2, 9, 8)), jnp.float32)
  mask = jnp.asarray(rng.random((2, 9)) > 0.2).at[:, 0].set(True)
  def apply(module, params):  # (compiled: one program, not op by op)
    return jax.jit(module.apply)({"params": params}, x, mask)

  for hybrid_name, softmax_name in (("window_linear", "softmax"), ("causal_window_linear",
                                                                   "causal")):
    hybrid = attention.get(hybrid_name).build(num_heads=2, window=9)
    params = jax.jit(hybrid.init)(jax.random.key(0), x, mask)["params"]
    kept = {name: params[name] for name in ("query", "key", "value", "out")}
    want = apply(attention.get(softmax_name).build(num_heads=2, implementation="xla"), kept)
    for kernel in ("xla", "chunked"):
      hybrid = attention.get(hybrid_name).build(num_heads=2, window=9, implementation=kernel)
      np.testing.assert_allclose(apply(hybrid, params), want, atol=2e-6)
    short = attention.get(hybrid_name).build(num_heads=2, window=2)
    assert np.abs(apply(short, params) - want).max() > 1e-3


def test_auto_counts_the_configured_window():
  """"auto" picks the blocked kernel from 2 windows of the configured size on, not of the
  default 64 (a run once resolved window 256 at 200 tokens to one padded block, ~3x the work)."""
  from textattn import defaults, models, run
  config = defaults.complete(defaults.classification())
  with config.unlocked():
    config.model.attention, config.model.attention_impl, config.max_len = "window_linear", "auto", 200
    run.with_parts(config, "model.hybrid")
  assert models.resolved_kernel(config) == "chunked"
  config.model.hybrid.window = 256
  assert models.resolved_kernel(config) == "xla"


@pytest.mark.parametrize("kernel", ["xla", "chunked"])
def test_window_linear_decoding_one_token_at_a_time_equals_the_whole_row(kernel):
  """The cached step (a ring of 3 keys that wraps three times over L = 11, plus the linear state
  of the keys that left it) against the whole row, a padded first position included; the
  translation decoder and beam search run on it."""
  rng = np.random.default_rng(5)
  x = jnp.asarray(rng.normal(size=(B, L, 8)), jnp.float32)
  mask, _ = padding_and_segments()
  module = attention.get("causal_window_linear").build(num_heads=H, window=3,
                                                       implementation=kernel)
  params = jax.jit(module.init)(jax.random.key(1), x, jnp.asarray(mask))
  params = jax.tree.map(lambda p: p + 0.3 * rng.normal(size=p.shape).astype(np.float32),
                        params)  # (away from the feature map's identity start and g = 0.5)
  whole = np.asarray(jax.jit(module.apply)(params, x, jnp.asarray(mask)))
  _, shapes = jax.eval_shape(lambda p: module.apply(p, x, mask, decode=True, mutable=["cache"]),
                             params)
  cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  step = jax.jit(lambda cache, x_t, m_t: module.apply({**params, **cache}, x_t, m_t,
                                                      decode=True, mutable=["cache"]))
  for t in range(L):
    out, cache = step(cache, x[:, t:t + 1], mask[:, t:t + 1])
    np.testing.assert_allclose(np.asarray(out)[:, 0], whole[:, t], rtol=2e-5, atol=2e-5,
                               err_msg=str(t))
  with pytest.raises(ValueError, match="decode=True needs the causal"):
    attention.get("window_linear").build(num_heads=H).init(jax.random.key(0), x, mask,
                                                          decode=True)
