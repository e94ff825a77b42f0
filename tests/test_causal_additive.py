"""Causal additive attention (textattn/attention/causal_additive.py), both forms: against
float64 references written from the definitions, causality, padding, and step-by-step decoding
of the recurrent form."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from textattn import attention
from textattn.attention import additive, causal_additive, causal_additive_pallas, common

B, L, H, D = 2, 7, 2, 4


def softmax_sum(scores, values):
  """sum_i softmax(scores)_i values_i in float64; scores [n, H], values [n, H, D]."""
  w = np.exp(scores - scores.max(0))
  w /= w.sum(0)
  return np.einsum("nh,nhd->hd", w, values)


def score(x, kernel):  # x [n, H, D] -> [n, H]
  return x.reshape(len(x), -1) @ kernel / np.sqrt(x.shape[-1])


def reference(q, k, mask, wa, wb, form):
  """Position by position, from the definitions (float64)."""
  out = np.zeros(q.shape)
  for b in range(q.shape[0]):
    for t in range(q.shape[1]):
      seen = [i for i in range(t + 1) if mask[b, i]]
      if not seen:
        continue
      g_q = softmax_sum(score(q[b, seen], wa), q[b, seen])
      if form == "direct":
        p = k[b, seen] * g_q[None]
      else:  # each key with the global query of its own position
        p = np.stack([k[b, i] * softmax_sum(score(q[b, [j for j in seen if j <= i]], wa),
                                            q[b, [j for j in seen if j <= i]]) for i in seen])
      out[b, t] = q[b, t] * softmax_sum(score(p, wb), p)
  return out


def inputs(seed=0):
  rng = np.random.default_rng(seed)
  q, k = rng.normal(size=(2, B, L, H, D))
  wa, wb = rng.normal(size=(2, H * D, H))
  mask = np.ones((B, L), bool)
  mask[1, 5:] = False  # padding after the tokens
  mask[1, 0] = False  # and a padded first position: its prefix has no real token
  return q, k, mask, wa, wb


@pytest.mark.parametrize("form", causal_additive.FORMS)
def test_each_form_matches_its_definition_in_float64(form):
  q, k, mask, wa, wb = inputs()
  got = causal_additive.CORES[form](*(jnp.asarray(x, jnp.float32) for x in (q, k)),
                                    jnp.asarray(mask), jnp.asarray(wa, jnp.float32),
                                    jnp.asarray(wb, jnp.float32))
  np.testing.assert_allclose(np.asarray(got), reference(q, k, mask, wa, wb, form), rtol=2e-4,
                             atol=2e-5)
  assert not np.asarray(got)[1, 0].any()  # nothing real seen yet: exactly 0


def test_the_two_forms_differ_and_the_direct_form_ends_as_bidirectional_fastformer():
  q, k, mask, wa, wb = (jnp.asarray(x, jnp.float32) if x.dtype != bool else jnp.asarray(x)
                        for x in inputs(1))
  mask = jnp.ones((B, L), bool)
  direct = causal_additive.direct_causal_additive(q, k, mask, wa, wb)
  recurrent = causal_additive.recurrent_causal_additive(q, k, mask, wa, wb)
  assert not np.allclose(direct, recurrent, atol=1e-3)  # two different functions
  full = additive.additive_attention(q, k, mask, wa, wb)
  np.testing.assert_allclose(direct[:, -1], full[:, -1], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(direct[:, 0], recurrent[:, 0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,implementation", [
    ("causal_additive", "auto"), ("causal_additive_recurrent", "auto"),
    ("causal_additive_recurrent", "chunked"), ("causal_additive_recurrent", "pallas")])
def test_no_position_sees_a_later_one_and_padding_changes_nothing(name, implementation):
  variant = attention.get(name)
  assert variant.causal and implementation in variant.implementations
  module = variant.build(num_heads=H, implementation=implementation, dtype=jnp.float32)
  x = jax.random.normal(jax.random.key(0), (B, L, H * D))
  mask = jnp.ones((B, L), bool)
  params = jax.jit(module.init)(jax.random.key(1), x, mask)
  apply = jax.jit(module.apply)
  y = apply(params, x, mask)
  for t in range(L - 1):
    changed = x.at[:, t + 1:].set(jax.random.normal(jax.random.key(t + 2), x[:, t + 1:].shape))
    np.testing.assert_allclose(apply(params, changed, mask)[:, :t + 1], y[:, :t + 1],
                               rtol=1e-5, atol=1e-6)
  longer = jnp.concatenate([x, jax.random.normal(jax.random.key(9), (B, 3, H * D))], axis=1)
  padded = jnp.concatenate([mask, jnp.zeros((B, 3), bool)], axis=1)
  np.testing.assert_allclose(apply(params, longer, padded)[:, :L], y, rtol=1e-5, atol=1e-6)
  grads = jax.jit(jax.grad(lambda p: module.apply(p, longer, padded).sum()))(params)
  assert all(np.isfinite(g).all() for g in jax.tree_util.tree_leaves(grads))


def test_recurrent_decoding_step_by_step_equals_the_whole_sequence():
  q, k, mask, wa, wb = inputs(2)
  q, k, wa, wb = (jnp.asarray(x, jnp.float32) for x in (q, k, wa, wb))
  whole = causal_additive.recurrent_causal_additive(q, k, jnp.asarray(mask), wa, wb)
  state = causal_additive.init_state(B, H, D)
  step = jax.jit(causal_additive.recurrent_step)
  for t in range(L):
    state, u = step(state, q[:, t], k[:, t], jnp.asarray(mask[:, t]), wa, wb)
    expected = np.where(mask[:, t, None, None], whole[:, t], 0.0)
    np.testing.assert_allclose(u, expected, rtol=1e-5, atol=1e-6)
  # The state is the same size after 7 tokens as after 1: O(1) decoding.
  assert state.alpha_values.shape == (B, H, D)


def chunked_inputs(seed=0, length=37, spread=1.0):
  """float32 q, k, scoring kernels and a mask with right padding and a padded first position, at
  a length that is not a multiple of the chunks used. `spread` scales the scoring kernels, so
  the scores span about +-spread * 10."""
  rng = np.random.default_rng(seed)
  q, k = (jnp.asarray(rng.normal(size=(B, length, H, 8)), jnp.float32) for _ in range(2))
  wa, wb = (jnp.asarray(spread * rng.normal(size=(H * 8, H)), jnp.float32) for _ in range(2))
  mask = np.arange(length)[None] < np.array([length, length - 14])[:, None]
  mask[1, 0] = False
  return q, k, jnp.asarray(mask), wa, wb


def assert_relatively_close(got, want, tolerance, name=""):
  """max |got - want| <= tolerance * max |want|: float32 rounding relative to the tensor's scale
  (element-wise relative error is meaningless where a value is ~0)."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  assert np.all(np.isfinite(got)), name
  error, scale = np.max(np.abs(got - want)), np.max(np.abs(want))
  assert error <= tolerance * scale, f"{name}: max error {error:.3g} vs scale {scale:.3g}"


def chunked(chunk_size):
  return functools.partial(causal_additive.chunked_recurrent_causal_additive,
                           chunk_size=chunk_size)


@pytest.mark.parametrize("spread", [1.0, 30.0], ids=["scores_O(10)", "scores_O(300)"])
@pytest.mark.parametrize("chunk_size", [8, 64])
def test_chunked_recurrent_form_equals_the_scan_values_and_gradients(chunk_size, spread):
  # 37 positions: chunks of 8 leave a ragged last chunk of 5; 64 is one chunk longer than the
  # input.
  q, k, mask, wa, wb = chunked_inputs(spread=spread)
  scan = causal_additive.recurrent_causal_additive
  assert_relatively_close(chunked(chunk_size)(q, k, mask, wa, wb), scan(q, k, mask, wa, wb),
                          1e-5, "u")
  cotangent = jax.random.normal(jax.random.key(3), q.shape)

  def grads(kernel):
    loss = lambda q, k, wa, wb: jnp.sum(kernel(q, k, mask, wa, wb) * cotangent)
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(q, k, wa, wb)

  for name, got, want in zip(("q", "k", "alpha_kernel", "beta_kernel"),
                             grads(chunked(chunk_size)), grads(scan)):
    assert_relatively_close(got, want, 1e-5 if spread == 1 else 1e-4, name)


def test_chunked_form_keeps_rows_whose_scores_lie_far_below_a_later_one_in_the_chunk():
  # Alpha scores rising by ~120 a position: with one max per chunk, exp(s_i - max) of every
  # early row of a chunk underflows to 0 and those rows come out 0 (or 0/0); the row-wise
  # running max keeps each of them exact.
  length, chunk = 16, 8
  q = jnp.ones((1, length, 1, 4), jnp.float32) * jnp.arange(1, length + 1)[None, :, None, None]
  k = jnp.ones_like(q)
  wa = jnp.full((4, 1), 60.0, jnp.float32)  # score_alpha(q_t) = 4 * 60 * t / 2 = 120 t
  wb = jnp.full((4, 1), 0.1, jnp.float32)
  mask = jnp.ones((1, length), bool)
  want = causal_additive.recurrent_causal_additive(q, k, mask, wa, wb)
  assert np.all(np.abs(np.asarray(want)) > 0)
  assert_relatively_close(chunked(chunk)(q, k, mask, wa, wb), want, 1e-6)


# Chunks of the Pallas kernel's tests: 8 in interpret mode; Triton's `dot` (on a GPU, where
# experiments/gpu/accelerators.sh runs these tests compiled) needs at least 16.
PALLAS_CHUNK = 8 if jax.default_backend() == "cpu" else 16


def pallas(chunk_size):
  return functools.partial(causal_additive_pallas.pallas_recurrent_causal_additive,
                           chunk_size=chunk_size)


@pytest.mark.parametrize("kernel", [chunked, pallas])
def test_chunked_form_is_causal_across_and_inside_chunks(kernel):
  q, k, mask, wa, wb = chunked_inputs(seed=4)
  kernel = jax.jit(kernel(8))
  u = np.asarray(kernel(q, k, mask, wa, wb))
  for t in (0, 6, 7, 8, 20, 35):  # inside a chunk, at its end, at the next one's start
    later = jax.random.normal(jax.random.key(t), q[:, t + 1:].shape)
    changed = kernel(q.at[:, t + 1:].add(later), k.at[:, t + 1:].add(later), mask, wa, wb)
    np.testing.assert_array_equal(np.asarray(changed)[:, :t + 1], u[:, :t + 1], err_msg=str(t))
    assert not np.allclose(np.asarray(changed)[0, t + 1:], u[0, t + 1:])


@pytest.mark.parametrize("dtype,tolerance", [(np.float32, 1e-5), (jnp.bfloat16, 2e-2)])
@pytest.mark.parametrize("spread", [1.0, 30.0], ids=["scores_O(1)", "scores_O(30)"])
def test_pallas_chunked_kernel_matches_float64_definition(spread, dtype, tolerance):
  # Pallas in interpret mode on a CPU. 3 heads of 4 (12 features, padded to 16 in the kernel),
  # 21 positions in chunks of PALLAS_CHUNK (a ragged last chunk), the padding of inputs();
  # bfloat16 inputs are compared with float64 on the same rounded values (bound: 2e-2 of the
  # scale; bfloat16's step is 3.9e-3).
  rng = np.random.default_rng(5)
  batch, length, heads, head_dim = 2, 21, 3, 4
  q, k = (np.asarray(jnp.asarray(rng.normal(size=(batch, length, heads, head_dim)), dtype),
                     np.float64) for _ in range(2))
  wa, wb = (np.asarray(jnp.asarray(spread * rng.normal(size=(heads * head_dim, heads)), dtype),
                       np.float64) for _ in range(2))
  mask = np.ones((batch, length), bool)
  mask[1, 15:], mask[1, 0] = False, False
  want = reference(q, k, mask, wa, wb, "recurrent")
  got = jax.jit(pallas(PALLAS_CHUNK))(*(jnp.asarray(x, dtype) for x in (q, k)), jnp.asarray(mask),
                           *(jnp.asarray(x, dtype) for x in (wa, wb)))
  assert got.dtype == dtype
  assert_relatively_close(jnp.asarray(got, jnp.float32), want, tolerance, "u")
  assert not np.asarray(got, np.float32)[1, 0].any()


def float64_recurrent(q, k, wa, wb, mask, runs=None):
  """The recurrent form as masked [t, i] softmax matrices (call under jax.enable_x64 with float64
  inputs): differentiable, and independent of chunks, scans and running sums. `runs`: a
  position sees only its own run's (segment's)."""
  batch, length, _, head_dim = q.shape
  visible = mask[:, None, :] & jnp.tril(jnp.ones((length, length), bool))[None]
  if runs is not None:
    visible = visible & (runs[:, :, None] == runs[:, None, :])
  visible = visible[..., None]

  def pool(x, kernel):  # [b, t, h, d]: sum_{i<=t, real} softmax(score(x_i)) x_i
    scores = jnp.einsum("bif,fh->bih", x.reshape(batch, length, -1), kernel) / np.sqrt(head_dim)
    scores = jnp.where(visible, scores[:, None], -1e30)  # [b, t, i, h]
    top = jax.lax.stop_gradient(jnp.max(scores, axis=2, keepdims=True))
    e = jnp.where(visible, jnp.exp(scores - top), 0.0)
    total = jnp.sum(e, axis=2, keepdims=True)
    return jnp.einsum("btih,bihd->bthd", jnp.where(total > 0, e / jnp.maximum(total, 1e-300), 0.0),
                      x)

  return q * pool(k * pool(q, wa), wb)


@jax.jit
def pallas_vjp(q, k, mask, wa, wb, cotangent):
  """u and the gradients of <u, cotangent> w.r.t. q, k and both scoring kernels, through the
  Pallas backward kernel (one compilation per dtype for every test below)."""
  u, pullback = jax.vjp(lambda *args: pallas(PALLAS_CHUNK)(args[0], args[1], mask, *args[2:]), q, k, wa, wb)
  return (u,) + pullback(cotangent.astype(u.dtype))


def pallas_gradient_inputs(dtype, spread=1.0, seed=6, length=21):
  """3 heads of 4 (12 features, padded to 16 in the kernel), 21 positions in chunks of
  PALLAS_CHUNK (a ragged last chunk); padding inside example 0, at the end of example 1 and at
  its first position. Values rounded to `dtype`, returned in float64 with a float64 cotangent."""
  rng = np.random.default_rng(seed)
  batch, heads, head_dim = 2, 3, 4
  q, k, cotangent = (rng.normal(size=(batch, length, heads, head_dim)) for _ in range(3))
  wa, wb = (spread * rng.normal(size=(heads * head_dim, heads)) for _ in range(2))
  mask = np.ones((batch, length), bool)
  mask[0, 9], mask[1, 15:], mask[1, 0] = False, False, False
  q, k, wa, wb, cotangent = (np.asarray(jnp.asarray(x, dtype), np.float64)
                             for x in (q, k, wa, wb, cotangent))
  return q, k, mask, wa, wb, cotangent


@pytest.mark.parametrize("dtype,tolerances", [
    (np.float32, {1.0: 1e-5, 30.0: 1e-4}), (jnp.bfloat16, {1.0: 1e-2, 30.0: 1e-2})],
    ids=["float32", "bfloat16"])
def test_pallas_chunked_kernel_gradients_match_float64_definition(dtype, tolerances):
  # The backward kernel's dq, dk and scoring-kernel gradients against autodiff of the float64
  # definition, at scores O(1) and O(30), relative to each tensor's scale (measured on
  # 2026-11-26: float32 <= 4.4e-7 at O(1), <= 3.1e-5 at O(30), where float32 scores of ~100
  # carry ~1e-5 absolute rounding into the exponents; bfloat16 <= 3.1e-3, about its step of
  # 3.9e-3: inputs and cotangent rounded to bfloat16 on both sides, the kernel's outputs and
  # gradients rounded to bfloat16).
  for spread, tolerance in tolerances.items():
    q, k, mask, wa, wb, cotangent = pallas_gradient_inputs(dtype, spread)
    got = pallas_vjp(*(jnp.asarray(x, dtype) for x in (q, k)), jnp.asarray(mask),
                     *(jnp.asarray(x, dtype) for x in (wa, wb, cotangent)))
    with jax.enable_x64(True):
      u, pullback = jax.vjp(functools.partial(float64_recurrent, mask=jnp.asarray(mask)),
                            q, k, wa, wb)
      want = [np.asarray(x) for x in (u,) + pullback(jnp.asarray(cotangent))]
    for name, g, w in zip(("u", "dq", "dk", "d_alpha_kernel", "d_beta_kernel"), got, want):
      assert g.dtype == dtype, name
      assert_relatively_close(jnp.asarray(g, jnp.float32), w, tolerance, f"{spread}: {name}")


def test_pallas_chunked_kernel_at_a_length_that_is_a_multiple_of_the_chunk():
  # Values and gradients against float64 where no chunk is ragged (3 whole chunks), padding
  # as above.
  q, k, mask, wa, wb, cotangent = pallas_gradient_inputs(np.float32, length=3 * PALLAS_CHUNK)
  got = pallas_vjp(*(jnp.asarray(x, jnp.float32) for x in (q, k)), jnp.asarray(mask),
                   *(jnp.asarray(x, jnp.float32) for x in (wa, wb, cotangent)))
  with jax.enable_x64(True):
    u, pullback = jax.vjp(functools.partial(float64_recurrent, mask=jnp.asarray(mask)),
                          q, k, wa, wb)
    want = [np.asarray(x) for x in (u,) + pullback(jnp.asarray(cotangent))]
  for name, g, w in zip(("u", "dq", "dk", "d_alpha_kernel", "d_beta_kernel"), got, want):
    assert_relatively_close(g, w, 1e-5, name)


# Packed documents over 21 positions in chunks of PALLAS_CHUNK: row 0 has a boundary inside the
# first chunk, a document across the chunks' border, a padding position between documents and
# a last one across the next border; row 1 one document over every chunk (with the padding of
# pallas_gradient_inputs).
PACKED = np.array([[1] * 5 + [2] * 9 + [0] + [3] * 6, [4] * 21])


@jax.jit
def pallas_vjp_with_runs(q, k, mask, wa, wb, cotangent, runs):
  u, pullback = jax.vjp(lambda *args: pallas(PALLAS_CHUNK)(args[0], args[1], mask, *args[2:],
                                                             runs), q, k, wa, wb)
  return (u,) + pullback(cotangent.astype(u.dtype))


def test_pallas_chunked_kernel_with_segments_matches_float64_values_and_gradients():
  q, k, mask, wa, wb, cotangent = pallas_gradient_inputs(np.float32)
  real, runs = common.segment_runs(jnp.asarray(mask), jnp.asarray(PACKED))
  got = pallas_vjp_with_runs(*(jnp.asarray(x, jnp.float32) for x in (q, k)), real,
                             *(jnp.asarray(x, jnp.float32) for x in (wa, wb, cotangent)), runs)
  with jax.enable_x64(True):
    u, pullback = jax.vjp(functools.partial(float64_recurrent, mask=real, runs=runs),
                          q, k, wa, wb)
    want = [np.asarray(x) for x in (u,) + pullback(jnp.asarray(cotangent))]
  for name, g, w in zip(("u", "dq", "dk", "d_alpha_kernel", "d_beta_kernel"), got, want):
    assert_relatively_close(g, w, 1e-5, name)
  # A document's first position sees only itself: not the one before it across the boundary.
  u0 = np.asarray(got[0])[0]
  assert not np.allclose(u0[5], np.asarray(pallas(PALLAS_CHUNK)(
      *(jnp.asarray(x, jnp.float32) for x in (q, k)), real, *(jnp.asarray(x, jnp.float32)
                                                               for x in (wa, wb))))[0, 5])


def test_pallas_chunked_kernel_gradient_path_is_causal():
  # d(u_s)/d(q_t, k_t) = 0 for every t > s: with a cotangent on the rows <= s only, the
  # backward kernel's dq and dk are exactly 0 after s (inside a chunk, at its end, at the next
  # one's start), and not before.
  q, k, mask, wa, wb, cotangent = (jnp.asarray(x, bool if x.dtype == bool else jnp.float32)
                                   for x in pallas_gradient_inputs(np.float32))
  for s in (3, 7, 8, 17):
    before = (jnp.arange(q.shape[1]) <= s)[None, :, None, None]
    _, d_q, d_k, _, _ = pallas_vjp(q, k, mask, wa, wb, jnp.where(before, cotangent, 0.0))
    for name, gradient in (("dq", d_q), ("dk", d_k)):
      assert not np.asarray(gradient)[:, s + 1:].any(), f"{name} after {s}"
      real = np.asarray(gradient)[0, :s + 1][np.asarray(mask)[0, :s + 1]]  # (0 at padding)
      assert np.abs(real).min() > 0, f"{name} up to {s}"


# Packed documents: row 0 has segments at 0-2 and 3-6 (a boundary inside the first chunk of 4),
# row 1 a padded first position, segments 1, 2, 3 (boundaries at 3, inside a chunk, and at 4, a
# chunk's start) and padding at the end.
SEGMENTS = np.array([[1, 1, 1, 2, 2, 2, 2], [0, 1, 1, 2, 3, 3, 0]])
SEGMENTED_KERNELS = {
    "direct": ("direct", causal_additive.direct_causal_additive),
    "scan": ("recurrent", causal_additive.recurrent_causal_additive),
    "chunked": ("recurrent", functools.partial(causal_additive.chunked_recurrent_causal_additive,
                                               chunk_size=4)),
    # (chunks of 4 in interpret mode; a GPU's Triton dot needs 16)
    "pallas": ("recurrent", pallas(4 if jax.default_backend() == "cpu" else PALLAS_CHUNK))}


@pytest.mark.parametrize("kernel", SEGMENTED_KERNELS)
def test_segments_pool_only_their_own_earlier_positions_as_each_document_alone(kernel):
  form, f = SEGMENTED_KERNELS[kernel]
  q, k, _, wa, wb = inputs(3)
  q[0, :3] *= 40.0  # row 0's first document scores far above its second (a shared max would
  # underflow the second's weights to 0)
  mask = np.ones((B, L), bool)
  real, runs = common.segment_runs(jnp.asarray(mask), jnp.asarray(SEGMENTS))
  args = [jnp.asarray(x, jnp.float32) for x in (q, k, wa, wb)]
  got = np.asarray(f(args[0], args[1], real, args[2], args[3], runs))
  want = np.zeros(q.shape)
  for b in range(B):
    for segment in set(SEGMENTS[b]) - {0}:
      at = np.flatnonzero(SEGMENTS[b] == segment)
      want[b, at] = reference(q[b:b + 1, at], k[b:b + 1, at], mask[b:b + 1, at], wa, wb, form)[0]
  assert_relatively_close(got, want, 1e-5, kernel)
  assert not got[1, [0, 6]].any()  # padding: exactly 0
  if kernel == "chunked":  # gradients as the scan's, with segments (on unscaled inputs: with
    # scores in the hundreds the two forms' beta gradients part by ~5% under the suite's XLA -O0,
    # with or without segments, and agree to 1e-7 at XLA's default -O2)
    args[0] = jnp.asarray(inputs(3)[0], jnp.float32)
    cotangent = jax.random.normal(jax.random.key(3), q.shape)

    def grads(g):
      loss = lambda q, k, wa, wb: jnp.sum(g(q, k, real, wa, wb, runs) * cotangent)
      return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(*args)

    for name, a, b in zip(("q", "k", "alpha", "beta"), grads(f),
                          grads(causal_additive.recurrent_causal_additive)):
      assert_relatively_close(a, b, 1e-5, name)


def test_the_pallas_module_takes_segments_as_the_chunked_form_does():
  x, mask = jax.random.normal(jax.random.key(0), (B, L, H * D)), jnp.ones((B, L), bool)
  modules = {impl: attention.get("causal_additive_recurrent").build(num_heads=H,
                                                                     implementation=impl)
             for impl in ("pallas", "chunked")}
  params = modules["chunked"].init(jax.random.key(1), x, mask)
  outputs = {impl: np.asarray(m.apply(params, x, mask, segment_ids=jnp.asarray(SEGMENTS)))
             for impl, m in modules.items()}
  assert_relatively_close(outputs["pallas"], outputs["chunked"], 1e-5)
