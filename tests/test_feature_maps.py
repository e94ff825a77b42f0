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
    want = values_and_grads(attend64, args, jnp.asarray(cotangent, jnp.float64))
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
    params = layer.init(jax.random.key(0), x, mask)["params"]
    assert set(params["feature_map"]) == leaves, params["feature_map"].keys()
    if name == "hedgehog":
      np.testing.assert_array_equal(params["feature_map"]["query_kernel"][1], np.eye(4))
    grads = jax.grad(lambda p, layer=layer: jnp.sum(layer.apply({"params": p}, x, mask) ** 2))(
        params)
    assert all(np.abs(np.asarray(g)).max() > 0 for g in jax.tree.leaves(grads["feature_map"]))
