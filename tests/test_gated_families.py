"""The gated recurrent families (textattn/attention/recurrent/), and the layers of every linear
recurrence: the gated core's chunked form
against its recurrent reference in float64 (values, final states and gradients of every input),
float32 and bfloat16 against float64, the cross-checks (gamma = 1 is unnormalised causal linear
attention; equal per-dimension gates are the scalar core), long-sequence finiteness under strong
and no decay, and each layer (RetNet, GLA, Mamba-2): forms equal with padding and packed
documents, decoding one token at a time and after a prefill equal to the whole row, bad options
refused in one sentence."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from textattn import attention
from textattn.attention.recurrent.gated import gated_chunked, gated_recurrent
from textattn.errors import UsageError

B, L, H, K, V = 2, 37, 2, 4, 3
CHUNK = 16  # 37 = 2 chunks + 5: boundaries at 10 and 23 inside chunks, padding from 32
FAMILIES = ("retnet", "gla", "mamba2")
# Their layers, and the delta rule's (the core's own tests: tests/test_delta_rule.py).
LAYERS = FAMILIES + ("deltanet", "gated_deltanet")


def segments_and_mask():
  """Row 0: documents 1 (0-9), 2 (10-22), 3 (23-31), then padding (id 0). Row 1: one document
  with a padded position at 5 (mask only)."""
  segments = np.array([[1] * 10 + [2] * 13 + [3] * 9 + [0] * 5, [1] * 37], np.int32)
  mask = segments != 0
  mask[1, 5] = False
  return segments, mask


def core_inputs(per_dim: bool, dtype=np.float64, seed=0, length=L):
  r = np.random.default_rng(seed)
  q, k = (r.normal(size=(B, length, H, K)) for _ in range(2))
  v = r.normal(size=(B, length, H, V))
  g = -np.log1p(np.exp(r.normal(size=(B, length, H, K) if per_dim else (B, length, H))))
  s0 = r.normal(size=(B, H, K, V))
  return tuple(np.asarray(x, dtype) for x in (q, k, v, g, s0))


def relative_error(got, want):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-300)


def values_and_gradients(form, segment_ids, mask, **keywords):
  """jitted (out, final state) and the gradients of a loss of both wrt q, k, v, g, s0."""
  def run(q, k, v, g, s0):
    return form(q, k, v, g, initial_state=s0, segment_ids=segment_ids, mask=mask, **keywords)

  def loss(*args):
    out, state = run(*args)
    return jnp.sum(jnp.sin(out) * jnp.cos(jnp.arange(out.size).reshape(out.shape))) + jnp.sum(
        state ** 2)
  return jax.jit(lambda *a: (run(*a), jax.grad(loss, argnums=range(5))(*a)))


@pytest.mark.parametrize("per_dim", [False, True], ids=["scalar", "per_dim"])
@pytest.mark.parametrize("length", [32, L], ids=["multiple", "not_multiple"])
def test_chunked_equals_recurrent_in_float64_values_states_and_gradients(per_dim, length):
  segments, mask = segments_and_mask()
  segments, mask = segments[:, :length], mask[:, :length]
  with jax.enable_x64(True):
    args = core_inputs(per_dim, length=length)
    want = values_and_gradients(gated_recurrent, segments, mask)(*args)
    got = values_and_gradients(functools.partial(gated_chunked, chunk_size=CHUNK), segments,
                               mask)(*args)
  for name, a, b in zip(["out", "state", "dq", "dk", "dv", "dg", "ds0"],
                        jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    assert relative_error(a, b) <= 1e-10, name
    assert np.abs(np.asarray(b)).max() > 0, name  # (every input is on the path)


@pytest.mark.parametrize("per_dim", [False, True], ids=["scalar", "per_dim"])
def test_a_packed_document_gets_what_it_gets_alone_and_padding_changes_nothing(per_dim):
  segments, mask = segments_and_mask()
  with jax.enable_x64(True):
    q, k, v, g, _ = core_inputs(per_dim)
    run = jax.jit(lambda q, k, v, g, s, m: gated_chunked(q, k, v, g, segment_ids=s, mask=m,
                                                         chunk_size=CHUNK))
    packed, state = run(q, k, v, g, segments, mask)
    for start, stop in ((0, 10), (10, 23), (23, 32)):
      alone = lambda x: np.asarray(x)[:1, start:stop]
      out, alone_state = gated_recurrent(*(alone(x) for x in (q, k, v, g)))
      assert relative_error(np.asarray(packed)[0, start:stop], out) <= 1e-12
    assert relative_error(np.asarray(state)[0], alone_state[0]) <= 1e-12  # the last document's
    # Row 1's padded position 5: the same as the row without it.
    keep = np.r_[0:5, 6:L]
    out, without = run(*(np.asarray(x)[1:, keep] for x in (q, k, v, g)),
                       np.ones((1, L - 1), np.int32), np.ones((1, L - 1), bool))
    assert relative_error(np.asarray(packed)[1, keep], out[0]) <= 1e-12
    assert relative_error(np.asarray(state)[1], without[0]) <= 1e-12


@pytest.mark.parametrize("dtype,values,gradients", [("float32", 1e-5, 1e-4),
                                                     ("bfloat16", 2e-2, 2e-2)])
@pytest.mark.parametrize("per_dim", [False, True], ids=["scalar", "per_dim"])
def test_float32_and_bfloat16_against_float64(per_dim, dtype, values, gradients):
  segments, mask = segments_and_mask()
  with jax.enable_x64(True):
    args64 = core_inputs(per_dim, seed=1)
    want = values_and_gradients(gated_recurrent, segments, mask)(*args64)
  args = tuple(jnp.asarray(x, dtype) for x in args64)
  got = values_and_gradients(functools.partial(gated_chunked, chunk_size=CHUNK), segments,
                             mask)(*args)
  (out, state), grads = got
  (want_out, want_state), want_grads = want
  assert relative_error(out, want_out) <= values
  assert relative_error(state, want_state) <= values
  for name, a, b in zip("q k v g s0".split(), grads, want_grads, strict=True):
    assert relative_error(a, b) <= gradients, name


def test_cross_checks_gamma_one_is_causal_linear_and_equal_dimensions_are_scalar():
  with jax.enable_x64(True):
    q, k, v, g, _ = core_inputs(False)
    scale = K ** -0.5
    out, _ = gated_chunked(q, k, v, np.zeros_like(g), chunk_size=CHUNK)
    scores = np.einsum("bihd,bjhd->bhij", q, k) * scale * np.tril(np.ones((L, L)))
    assert relative_error(out, np.einsum("bhij,bjhv->bihv", scores, v)) <= 1e-12
    scalar, scalar_state = gated_chunked(q, k, v, g, chunk_size=CHUNK)
    per_dim, per_dim_state = gated_chunked(q, k, v, np.repeat(g[..., None], K, -1),
                                           chunk_size=CHUNK)
    assert relative_error(per_dim, scalar) <= 1e-12
    assert relative_error(per_dim_state, scalar_state) <= 1e-12


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_long_sequences_stay_finite_under_strong_and_no_decay(dtype):
  length = 16384
  r = np.random.default_rng(0)
  q, k = (jnp.asarray(r.normal(size=(1, length, 1, 8)), dtype) for _ in range(2))
  v = jnp.asarray(r.normal(size=(1, length, 1, 8)), dtype)

  @jax.jit
  def values_and_grads(g):
    loss = lambda *a: jnp.sum(gated_chunked(*a)[0].astype(jnp.float32) ** 2)
    return gated_chunked(q, k, v, g)[0], jax.grad(loss, argnums=range(4))(q, k, v, g)

  for per_dim in (False, True):
    shape = (1, length, 1, 8) if per_dim else (1, length, 1)
    for log_gate in (-20.0, 0.0):
      out, grads = values_and_grads(jnp.full(shape, log_gate, dtype))
      assert all(np.isfinite(np.asarray(x, np.float32)).all() for x in (out, *grads)), (
          per_dim, log_gate)


# ---------------------------------------------------------------------------------------------
# The layers.

def layer(name, implementation, dtype=jnp.float32, embed=16, **options):
  small = {"mamba2": {"state_dim": 8}}.get(name, {})
  return attention.get(name).build(num_heads=2, implementation=implementation, dtype=dtype,
                                   name="mixer", **{**small, "chunk_size": 8, **options})


def layer_inputs(dtype=np.float32, length=21, embed=16):
  x = np.random.default_rng(2).normal(size=(B, length, embed)).astype(dtype)
  segments = np.array([[1] * 6 + [2] * 11 + [0] * 4, [3] * length], np.int32)[:, :length]
  mask = segments != 0
  mask[1, 9] = False
  return x, mask, segments


@pytest.mark.parametrize("name", LAYERS)
def test_layer_forms_agree_in_float64_values_and_parameter_gradients(name):
  with jax.enable_x64(True):
    x, mask, segments = layer_inputs(np.float64)
    chunked, recurrent = layer(name, "chunked", jnp.float64), layer(name, "recurrent",
                                                                      jnp.float64)
    params = chunked.init(jax.random.key(0), x, mask)
    params = jax.tree.map(lambda p: p.astype(jnp.float64), params)

    def both(module):
      loss = lambda p, x: jnp.sum(jnp.sin(module.apply(p, x, mask, segment_ids=segments)))
      return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    (_, want), (_, got) = both(recurrent)(params, x), both(chunked)(params, x)
    out_c = chunked.apply(params, x, mask, segment_ids=segments)
    out_r = recurrent.apply(params, x, mask, segment_ids=segments)
  assert relative_error(out_c, out_r) <= 1e-10
  for path, a, b in zip(jax.tree_util.tree_leaves_with_path(got),
                        jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    assert relative_error(a, b) <= 1e-10, path[0]


@pytest.mark.parametrize("name", LAYERS)
def test_decoding_one_token_at_a_time_and_after_a_prefill_equals_the_whole_row(name):
  module = layer(name, "chunked")
  x, mask, segments = layer_inputs()
  params = module.init(jax.random.key(1), x, mask)
  whole = module.apply(params, x, mask, segment_ids=segments)
  _, cache = module.apply(params, x, mask, decode=True, mutable=["cache"])
  fresh = jax.tree.map(jnp.zeros_like, cache)
  step = jax.jit(lambda cache, x_t, m_t, s_t: module.apply(
      {**params, **cache}, x_t, m_t, decode=True, segment_ids=s_t, mutable=["cache"]))
  cache = fresh
  for t in range(x.shape[1]):  # packed documents and padding, one token a call
    out, cache = step(cache, x[:, t:t + 1], mask[:, t:t + 1], segments[:, t:t + 1])
    real = mask[:, t]  # (a padding position's output means nothing)
    np.testing.assert_allclose(out[real, 0], whole[real, t], rtol=1e-5, atol=1e-5,
                               err_msg=str(t))
  # Prefill row 1's first 13 tokens by the chunked form in one call, then decode the rest.
  x1, mask1 = x[1:], np.ones((1, x.shape[1]), bool)
  whole1 = module.apply(params, x1, mask1)
  cache = jax.tree.map(lambda c: c[1:] if c.ndim else c, fresh)
  prefill = 13
  out, cache = module.apply({**params, **cache}, x1[:, :prefill], mask1[:, :prefill],
                            decode=True, mutable=["cache"])
  np.testing.assert_allclose(out, whole1[:, :prefill], rtol=1e-5, atol=1e-5)
  for t in range(prefill, x.shape[1]):
    out, cache = module.apply({**params, **cache}, x1[:, t:t + 1], mask1[:, t:t + 1],
                              decode=True, mutable=["cache"])
    np.testing.assert_allclose(out[:, 0], whole1[:, t], rtol=1e-5, atol=1e-5, err_msg=str(t))


def test_bad_options_are_refused_in_one_sentence():
  import ml_collections
  model = ml_collections.ConfigDict({"gla": {"chunk_size": -4}})
  with pytest.raises(UsageError, match=r"config\.model\.gla\.chunk_size=-4 must be a positive"):
    attention.build_options(attention.get("gla"), model)
  model = ml_collections.ConfigDict({"retnet": {"gate_rank": 16}})
  with pytest.raises(UsageError, match=r"config\.model\.retnet\.gate_rank is not an option"):
    attention.build_options(attention.get("retnet"), model)
  model = ml_collections.ConfigDict({"mamba2": {"dt_min": 0.5, "dt_max": 0.1}})
  with pytest.raises(UsageError, match=r"dt_min=0\.5 must not exceed"):
    attention.build_options(attention.get("mamba2"), model)
