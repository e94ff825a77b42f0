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


def softmax_over_tokens(scores, real):
  scores = jnp.where(real, scores, -jnp.inf)
  return jnp.exp(scores - scores.max()) * real / jnp.sum(jnp.exp(scores - scores.max()) * real)


def slot_reference(q, k, v, mask, alpha, beta, bias):
  """out [B, L, H, D] by the formula: alpha over each head's query scores (all heads' features
  against alpha's column), g_q, p = k * g_q per head, beta likewise over p, k_g and v_g; then
  each query's softmax over its in-window real keys and the slot."""
  out = []
  for b in range(B):
    real = jnp.asarray(mask[b])
    g_q = jnp.stack([softmax_over_tokens(q[b].reshape(L, H * D) @ alpha[:, h] / np.sqrt(D), real)
                     @ q[b, :, h] for h in range(H)])  # [H, D]
    p = (k[b] * g_q[None]).reshape(L, H * D)
    betas = [softmax_over_tokens(p @ beta[:, h] / np.sqrt(D), real) for h in range(H)]
    rows = []
    for t in range(L):
      heads = []
      for h in range(H):
        k_g, v_g = betas[h] @ k[b, :, h], betas[h] @ v[b, :, h]
        keys = [i for i in range(L) if mask[b, i] and abs(t - i) <= WINDOW]
        logits = jnp.stack([q[b, t, h] @ k[b, i, h] / np.sqrt(D) for i in keys]
                           + [q[b, t, h] @ k_g / np.sqrt(D) + bias[h]])
        w = jnp.exp(logits - logits.max())
        w = w / w.sum()
        heads.append(sum(w[j] * v[b, i, h] for j, i in enumerate(keys)) + w[-1] * v_g)
      rows.append(jnp.stack(heads))
    out.append(jnp.stack(rows))
  return jnp.stack(out)


@pytest.mark.parametrize("kernel", ["xla", "chunked"])
def test_window_additive_matches_float64_values_and_gradients(kernel):
  rng = np.random.default_rng(5)
  q, k, v, cotangent = (rng.normal(size=(B, L, H, D)).astype(np.float32) for _ in range(4))
  alpha, beta = (rng.normal(size=(H * D, H)).astype(np.float32) for _ in range(2))
  bias = np.array([0.3, -0.7], np.float32)
  mask, _ = padding_and_segments()
  fn = window_additive.KERNELS[kernel]
  got = jax.jit(lambda *a: values_and_grads(
      lambda q, k, v, al, be, bi: fn(q, k, v, jnp.asarray(mask), al, be, bi, window=WINDOW),
      a, cotangent * mask[:, :, None, None]))(q, k, v, alpha, beta, bias)
  with jax.enable_x64(True):
    args = tuple(jnp.asarray(a, jnp.float64) for a in (q, k, v, alpha, beta, bias))
    want = values_and_grads(lambda *a: slot_reference(*a[:3], mask, *a[3:]), args,
                            jnp.asarray(cotangent * mask[:, :, None, None], jnp.float64))
  real = mask[:, :, None, None]
  assert_relatively_close(np.asarray(got[0]) * real, np.asarray(want[0]) * real, 2e-5, "out")
  for what, a, b in zip(("d_q", "d_k", "d_v", "d_alpha", "d_beta", "d_bias"), got[1:], want[1:]):
    assert_relatively_close(a, b, 2e-5, what)


def test_a_window_over_the_row_and_no_slot_is_softmax_with_the_same_weights():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(2, 9, 8)), jnp.float32)
  mask = jnp.asarray(rng.random((2, 9)) > 0.2).at[:, 0].set(True)
  build = attention.get("window_additive").build
  params = build(num_heads=2, window=9).init(jax.random.key(0), x, mask)["params"]
  softmax = attention.get("softmax").build(num_heads=2, implementation="xla")
  kept = {name: params[name] for name in ("query", "key", "value", "out")}
  want = softmax.apply({"params": kept}, x, mask) * mask[..., None]
  closed = dict(params, slot_bias=jnp.full((2,), -1e30, jnp.float32))  # exp(-1e30 - m) = 0
  for kernel in ("xla", "chunked"):
    got = build(num_heads=2, window=9, implementation=kernel).apply({"params": closed}, x, mask)
    np.testing.assert_allclose(got * mask[..., None], want, atol=2e-6)
  opened = build(num_heads=2, window=9).apply({"params": params}, x, mask) * mask[..., None]
  assert np.abs(opened - want).max() > 1e-3  # the slot (bias 0) takes weight


def test_attention_transfer_trains_the_scoring_kernels_and_slot_bias_as_new():
  from textattn.recipes import attention_transfer
  x, mask = jnp.ones((1, 5, 8)), jnp.ones((1, 5), bool)
  student = {"encoder": {"block_0": {"attention": attention.get("window_additive").build(
      num_heads=2, window=2).init(jax.random.key(0), x, mask)["params"]}}}
  teacher = {"encoder": {"block_0": {"attention": attention.get("softmax").build(
      num_heads=2, implementation="xla").init(jax.random.key(0), x, mask)["params"]}}}
  trains = attention_transfer.trainable(student, teacher, "new")["encoder"]["block_0"]
  assert {name for name, leaf in trains["attention"].items()
          if all(jax.tree.leaves(leaf))} == {"alpha_kernel", "beta_kernel", "slot_bias"}
