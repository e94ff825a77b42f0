"""The window + additive-slot hybrid (textattn/attention/window_additive.py): both kernels against
its formula in float64, query by query (values and gradients of every input), the softmax it
becomes with a window over the row and no slot, and its place in attention transfer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.test_attention_families import (
  B,
  D,
  H,
  L,
  assert_relatively_close,
  padding_and_segments,
  values_and_grads,
)
from textattn import attention
from textattn.attention import window_additive

WINDOW = 3  # L = 11: four blocks in the chunked kernel, the last padded


def slot_reference(q, k, v, mask, alpha, beta, bias, window=WINDOW):
  """out [B, L, H, D] by the formula, with the masks written out: alpha over each head's query
  scores (all heads' features against alpha's column) gives g_q; p = k * g_q per head, beta
  likewise over p; k_g, v_g the beta-weighted keys and values; then each query's softmax over
  its in-window real keys and the slot."""
  real = jnp.asarray(mask)[:, :, None]  # [B, L, 1]

  def over_tokens(scores):  # [B, L, H], softmax over L on the real tokens
    e = jnp.where(real, jnp.exp(scores - jnp.max(scores, axis=1, keepdims=True)), 0.0)
    return e / jnp.sum(e, axis=1, keepdims=True)

  a = over_tokens(q.reshape(B, L, H * D) @ alpha / np.sqrt(D))
  g_q = jnp.sum(a[..., None] * q, axis=1)  # [B, H, D]
  p = k * g_q[:, None]
  b = over_tokens(p.reshape(B, L, H * D) @ beta / np.sqrt(D))
  k_g, v_g = jnp.sum(b[..., None] * k, axis=1), jnp.sum(b[..., None] * v, axis=1)
  t, i = np.arange(L)[:, None], np.arange(L)[None, :]
  seen = (np.abs(t - i) <= window)[None, None] & mask[:, None, None, :]  # [B, 1, L, L]
  scores = jnp.einsum("bthd,bihd->bhti", q, k) / np.sqrt(D)
  slot = jnp.einsum("bthd,bhd->bht", q, k_g) / np.sqrt(D) + bias[None, :, None]
  top = jnp.maximum(jnp.max(jnp.where(seen, scores, -np.inf), axis=-1), slot)
  near = jnp.where(seen, jnp.exp(scores - top[..., None]), 0.0)
  far = jnp.exp(slot - top)
  total = jnp.sum(near, axis=-1) + far
  out = (jnp.einsum("bhti,bihd->bthd", near, v)
         + jnp.einsum("bht,bhd->bthd", far, v_g)) / total.transpose(0, 2, 1)[..., None]
  return out


# window 0: each token attends to itself and the slot only (the chunked kernel's blocks of one)
@pytest.mark.parametrize("kernel, window", [("xla", WINDOW), ("chunked", WINDOW), ("xla", 0),
                                            ("chunked", 0)])
def test_window_additive_matches_float64_values_and_gradients(kernel, window):
  rng = np.random.default_rng(5)
  q, k, v, cotangent = (rng.normal(size=(B, L, H, D)).astype(np.float32) for _ in range(4))
  alpha, beta = (rng.normal(size=(H * D, H)).astype(np.float32) for _ in range(2))
  bias = np.array([0.3, -0.7], np.float32)
  mask, _ = padding_and_segments()
  fn = window_additive.KERNELS[kernel]
  got = jax.jit(lambda *a: values_and_grads(
      lambda q, k, v, al, be, bi: fn(q, k, v, jnp.asarray(mask), al, be, bi, window=window),
      a, cotangent * mask[:, :, None, None]))(q, k, v, alpha, beta, bias)
  with jax.enable_x64(True):
    args = tuple(jnp.asarray(a, jnp.float64) for a in (q, k, v, alpha, beta, bias))
    want = jax.jit(lambda *a: values_and_grads(  # (one compiled program, not op by op)
        lambda *a: slot_reference(*a[:3], mask, *a[3:], window), a,
        jnp.asarray(cotangent * mask[:, :, None, None], jnp.float64)))(*args)
  real = mask[:, :, None, None]
  assert_relatively_close(np.asarray(got[0]) * real, np.asarray(want[0]) * real, 2e-5, "out")
  for what, a, b in zip(("d_q", "d_k", "d_v", "d_alpha", "d_beta", "d_bias"), got[1:], want[1:]):
    assert_relatively_close(a, b, 2e-5, what)


def test_a_window_over_the_row_and_no_slot_is_softmax_with_the_same_weights():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(2, 9, 8)), jnp.float32)
  mask = jnp.asarray(rng.random((2, 9)) > 0.2).at[:, 0].set(True)
  def apply(module, params):  # (compiled: one program, not op by op)
    return jax.jit(module.apply)({"params": params}, x, mask) * mask[..., None]

  build = attention.get("window_additive").build
  params = jax.jit(build(num_heads=2, window=9).init)(jax.random.key(0), x, mask)["params"]
  kept = {name: params[name] for name in ("query", "key", "value", "out")}
  want = apply(attention.get("softmax").build(num_heads=2, implementation="xla"), kept)
  closed = dict(params, slot_bias=jnp.full((2,), -1e30, jnp.float32))  # exp(-1e30 - m) = 0
  for kernel in ("xla", "chunked"):
    got = apply(build(num_heads=2, window=9, implementation=kernel), closed)
    np.testing.assert_allclose(got, want, atol=2e-6)
  opened = apply(build(num_heads=2, window=9), params)
  assert np.abs(opened - want).max() > 1e-3  # the slot (bias 0) takes weight


def test_attention_transfer_trains_the_scoring_kernels_and_slot_bias_as_new():
  from textattn.recipes import attention_transfer
  x, mask = jnp.ones((1, 5, 8)), jnp.ones((1, 5), bool)
  student = {"encoder": {"block_0": {"attention": jax.eval_shape(attention.get(
      "window_additive").build(num_heads=2, window=2).init, jax.random.key(0), x, mask)["params"]}}}
  teacher = {"encoder": {"block_0": {"attention": jax.eval_shape(attention.get("softmax").build(
      num_heads=2, implementation="xla").init, jax.random.key(0), x, mask)["params"]}}}
  trains = attention_transfer.trainable(student, teacher, "new")["encoder"]["block_0"]
  assert {name for name, leaf in trains["attention"].items()
          if all(jax.tree.leaves(leaf))} == {"alpha_kernel", "beta_kernel", "slot_bias"}


def test_window_0_reaches_the_model_and_a_negative_window_is_refused():
  import re

  from tests.test_models import small_config
  from textattn import models
  from textattn.errors import UsageError
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 50, (2, 16)))
  config = small_config("window_additive", "auto")
  config.model.window = attention.default_options("window_additive")
  outputs = {}
  for size in (15, 0):  # (15: the whole row of 16; 0 taken for "unset" would give the same)
    config.model.window.size = size
    model = models.build_model(config, num_classes=2)
    if size == 15:
      params = jax.jit(model.init)(jax.random.key(0), tokens)
    outputs[size] = np.asarray(jax.jit(model.apply)(params, tokens))
  assert np.abs(outputs[0] - outputs[15]).max() > 1e-4
  config.model.window.size = -1
  with pytest.raises(UsageError, match=re.escape("config.model.window.size=-1 must be a number "
                                                 "of positions, 0 or more")):
    models.build_model(config, num_classes=2)
