"""Linear attention (textattn/attention/linear.py), Performer FAVOR+ (performer.py) and sliding-
window attention (sliding_window.py): every kernel against float64 references written from the
definitions (values and gradients), padding, causality, segment isolation (a state reset at a
boundary inside a chunk), step-by-step decoding, the Performer's seed, and one training step of
each variant. Tiny shapes, one compilation per kernel or layer shared by the tests that use
it (compiling is nearly all of the file's time: 28 s on a 2-core CPU where
tests/test_causal_additive.py takes 104 s)."""

import functools
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from textattn import attention, models
from textattn.attention import common, linear, performer, sliding_window
from textattn.errors import UsageError

B, L, H, D = 2, 11, 2, 4
CHUNK = 4  # chunks [0, 4) [4, 8) [8, 11): row 0's segment boundary at 6 is inside one
WINDOW = 3
VARIANTS = ("linear", "causal_linear", "sliding_window", "local", "performer",
            "causal_performer")
WINDOWED = ("sliding_window", "local")


def padding_and_segments():
  """Row 0: no padding, segments 1 (positions 0-5) and 2 (6-10). Row 1: a padded first position,
  segments 1, 2, 3 (boundaries at 3, inside the first chunk, and at 6) and padding from 8."""
  mask = np.ones((B, L), bool)
  mask[1, 0], mask[1, 8:] = False, False
  segments = np.array([[1] * 6 + [2] * 5, [0, 1, 1, 2, 2, 2, 3, 3, 0, 0, 0]], np.int32)
  return mask, segments


def visibility(mask, segments, in_band):
  """bool [b, t, i] from the definition: key i is real, in t's band, and t and i lie in one
  segment with no other id between them (segment id 0 is padding)."""
  out = np.zeros((B, L, L), bool)
  for b in range(B):
    for t in range(L):
      for i in range(L):
        lo, hi = min(t, i), max(t, i)
        same = segments is None or (len(set(segments[b, lo:hi + 1])) == 1 and segments[b, i])
        out[b, t, i] = bool(in_band(t, i) and mask[b, i] and same)
  return out


def causal_band(t, i):
  return i <= t


def float64_kernel_attention(fq, fk, v, visible, xp=jnp):
  """sum_i A_ti v_i / sum_i A_ti with A_ti = phi(q_t).phi(k_i) over the visible keys; 0 where
  there is none. float64: xp=np, or jnp under jax.enable_x64 (differentiable)."""
  scores = xp.einsum("bthf,bihf->bhti", fq, fk) * visible[:, None]
  total = xp.sum(scores, axis=-1, keepdims=True)
  weights = xp.where(total > 0, scores / xp.where(total > 0, total, 1.0), 0.0)
  return xp.einsum("bhti,bihd->bthd", weights, v)


def float64_softmax_attention(q, k, v, visible, xp=jnp):
  """Softmax of q.k / sqrt(d) over the visible keys; 0 where there is none (float64 as above)."""
  logits = xp.einsum("bthd,bihd->bhti", q, k) / np.sqrt(q.shape[-1])
  logits = xp.where(visible[:, None], logits, -np.inf)
  top = xp.max(logits, axis=-1, keepdims=True)
  e = xp.where(visible[:, None], xp.exp(logits - xp.where(xp.isfinite(top), top, 0.0)), 0.0)
  total = xp.sum(e, axis=-1, keepdims=True)
  return xp.einsum("bhti,bihd->bthd", xp.where(total > 0, e / xp.where(total > 0, total, 1.0),
                                                 0.0), v)


def assert_relatively_close(got, want, tolerance, name=""):
  """max |got - want| <= tolerance * max |want| (float32 rounding relative to the tensor's
  scale; element-wise relative error means nothing where a value is ~0)."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  assert np.all(np.isfinite(got)), name
  error, scale = np.max(np.abs(got - want)), np.max(np.abs(want))
  assert error <= tolerance * scale, f"{name}: max error {error:.3g} vs scale {scale:.3g}"


def values_and_grads(fn, args, cotangent):
  """fn(*args) and the gradients of <fn(*args), cotangent> w.r.t. every argument."""
  loss = lambda *a: jnp.sum(fn(*a) * cotangent)
  return [fn(*args)] + list(jax.grad(loss, argnums=tuple(range(len(args))))(*args))


@functools.cache
def float64_vjp(fn):
  """fn(q, k, v, visible)'s values and gradients, jitted once per reference (float64 inside
  jax.enable_x64)."""
  def run(args, visible, cotangent):
    return values_and_grads(lambda *a: fn(*a, visible), args, cotangent)
  return jax.jit(run)


def reference(fn, args, visible, cotangent):
  with jax.enable_x64(True):
    args64 = tuple(jnp.asarray(a, jnp.float64) for a in args)
    got = float64_vjp(fn)(args64, jnp.asarray(visible), jnp.asarray(cotangent, jnp.float64))
    return [np.asarray(x) for x in got]


def features_inputs(seed=0, features=3):
  """Positive features fq, fk [B, L, H, f] (as a feature map gives), values, cotangent."""
  rng = np.random.default_rng(seed)
  fq, fk = (np.abs(rng.normal(size=(B, L, H, features))).astype(np.float32) for _ in range(2))
  v, cotangent = (rng.normal(size=(B, L, H, D)).astype(np.float32) for _ in range(2))
  return fq, fk, v, cotangent


# One compilation per kernel for every test below.
CAUSAL_LINEAR = {
    "xla": linear.causal_linear_attention,
    "chunked": functools.partial(linear.chunked_causal_linear_attention, chunk_size=CHUNK),
    "recurrent": linear.recurrent_causal_linear_attention}


@functools.cache
def causal_linear_vjp(name):
  """(fq, fk, v, real, runs, cotangent) -> [out, d_fq, d_fk, d_v], jitted once per kernel."""
  kernel = CAUSAL_LINEAR[name]

  def run(fq, fk, v, real, runs, cotangent):
    return values_and_grads(lambda a, b, c: kernel(a, b, c, real, runs), (fq, fk, v), cotangent)
  return jax.jit(run)


def run_causal_linear(name, fq, fk, v, mask, segments, cotangent=None):
  real, runs = common.segment_runs(jnp.asarray(mask), None if segments is None
                                   else jnp.asarray(segments))
  cotangent = np.zeros_like(v) if cotangent is None else cotangent
  return [np.asarray(x) for x in causal_linear_vjp(name)(fq, fk, v, real, runs, cotangent)]


@pytest.mark.parametrize("name", list(CAUSAL_LINEAR))
@pytest.mark.parametrize("with_segments", [False, True], ids=["padding", "segments"])
def test_causal_linear_kernels_match_float64_values_and_gradients(name, with_segments):
  fq, fk, v, cotangent = features_inputs()
  mask, segments = padding_and_segments()
  segments = segments if with_segments else None
  visible = visibility(mask, segments, causal_band)
  want = reference(float64_kernel_attention, (fq, fk, v), visible, cotangent)
  got = run_causal_linear(name, fq, fk, v, mask, segments, cotangent)
  for what, g, w in zip(("out", "d_fq", "d_fk", "d_v"), got, want):
    assert_relatively_close(g, w, 1e-5, what)
  assert not got[0][1, 0].any()  # a first position that is padding sees nothing: exactly 0
  assert not got[2][~mask].any() and not got[3][~mask].any()  # padded keys contribute nothing


@pytest.mark.parametrize("name", list(CAUSAL_LINEAR))
def test_causal_linear_gradients_stay_finite_when_features_are_tiny(name):
  # Key features of ~1e-20 (FAVOR+'s exp(w.k - |k|^2/2) of a long key) make denominators ~1e-20:
  # squared in the quotient's derivative they underflowed float32 (-inf, then NaN at padding).
  # Scaling the keys' features leaves the output unchanged and scales d_fk by 1e20.
  fq, fk, v, cotangent = features_inputs()
  mask, segments = padding_and_segments()
  visible = visibility(mask, segments, causal_band)
  fk = fk * np.float32(1e-20)
  want = reference(float64_kernel_attention, (fq, fk, v), visible, cotangent)
  got = run_causal_linear(name, fq, fk, v, mask, segments, cotangent)
  for what, g, w in zip(("out", "d_fq", "d_fk", "d_v"), got, want):
    assert_relatively_close(g, w, 1e-5, what)


def test_merged_mean_gradient_is_finite_and_exact_for_tiny_weights():
  weights = jnp.array([1e-25, 1e-3, 0.0, 2.0], jnp.float32)
  values = jnp.array([[3e-25], [5e-3], [0.0], [1.0]], jnp.float32)
  _, (d_values, d_weights) = jax.value_and_grad(
      lambda v, w: jnp.sum(common.merged_mean(v, w)), argnums=(0, 1))(values, weights)
  np.testing.assert_array_equal(common.merged_mean(values, weights)[:, 0],
                                np.asarray(values[:, 0]) / np.where(weights > 0, weights, 1))
  np.testing.assert_allclose(d_values[:, 0], [1e25, 1e3, 0.0, 0.5], rtol=1e-6)
  np.testing.assert_allclose(d_weights, [-3e25, -5e3, 0.0, -0.25], rtol=1e-6)


def test_bidirectional_linear_matches_float64_values_and_gradients():
  fq, fk, v, cotangent = features_inputs(1)
  mask, _ = padding_and_segments()
  visible = visibility(mask, None, lambda t, i: True)
  want = reference(float64_kernel_attention, (fq, fk, v), visible, cotangent)
  real = jnp.asarray(mask)
  got = jax.jit(lambda *a: values_and_grads(
      lambda q, k, v: linear.linear_attention(q, k, v, real), a, cotangent))(fq, fk, v)
  for what, g, w in zip(("out", "d_fq", "d_fk", "d_v"), got, want):
    assert_relatively_close(g, w, 1e-5, what)
  assert not np.asarray(got[2])[~mask].any()


@pytest.mark.parametrize("name", list(CAUSAL_LINEAR))
def test_causal_linear_kernels_are_causal_and_isolate_segments(name):
  fq, fk, v, _ = features_inputs(2)
  mask, segments = padding_and_segments()
  out = run_causal_linear(name, fq, fk, v, mask, segments)[0]
  rng = np.random.default_rng(3)
  for t in (2, 3, 5, 6, 7):  # inside a chunk, at its end, at a boundary inside one
    later = (np.arange(L) > t)[None, :, None, None]
    changed = [np.where(later, np.abs(rng.normal(size=x.shape)).astype(np.float32), x)
               for x in (fq, fk, v)]
    got = run_causal_linear(name, *changed, mask, segments)[0]
    np.testing.assert_array_equal(got[:, :t + 1], out[:, :t + 1], err_msg=f"after {t}")
    assert not np.allclose(got[0, t + 1:], out[0, t + 1:])
  # Row 0's first segment (0-5) changed: its second segment (6-10) is exactly as it was, though
  # the boundary lies inside the chunk [4, 8) and the state of chunk [0, 4) is carried.
  first = ((np.arange(L) < 6)[None, :, None, None]) & (np.arange(B) == 0)[:, None, None, None]
  changed = [np.where(first, np.abs(rng.normal(size=x.shape)).astype(np.float32), x)
             for x in (fq, fk, v)]
  got = run_causal_linear(name, *changed, mask, segments)[0]
  np.testing.assert_array_equal(got[0, 6:], out[0, 6:])
  np.testing.assert_array_equal(got[1], out[1])
  assert not np.allclose(got[0, :6], out[0, :6])


def test_decoding_step_by_step_equals_the_causal_kernel():
  fq, fk, v, _ = features_inputs(4)
  mask, segments = padding_and_segments()
  whole = run_causal_linear("xla", fq, fk, v, mask, segments)[0]
  state = linear.init_state(B, H, fq.shape[-1], D)
  step = jax.jit(linear.step)
  for t in range(L):
    # The caller's contract: reset at each segment start, real=False for padding.
    reset = segments[:, t] != (segments[:, t - 1] if t else -1)
    real = mask[:, t] & (segments[:, t] != 0)
    state, out = step(state, fq[:, t], fk[:, t], v[:, t], real=real, reset=reset)
    np.testing.assert_allclose(np.asarray(out), whole[:, t], rtol=1e-5, atol=1e-6,
                               err_msg=str(t))
  assert state.kv.shape == (B, H, fq.shape[-1], D)  # the same size after 11 tokens as after 1


SLIDING = {(impl, causal, window): functools.partial(
    sliding_window.KERNELS[impl], window=window, causal=causal)
    for impl in sliding_window.KERNELS for causal in (True, False) for window in (WINDOW, 16)}


@functools.cache
def sliding_vjp(impl, causal, window):
  kernel = SLIDING[impl, causal, window]

  def run(q, k, v, real, runs, cotangent):
    return values_and_grads(lambda a, b, c: kernel(a, b, c, real, runs), (q, k, v), cotangent)
  return jax.jit(run)


def run_sliding(key, q, k, v, mask, segments, cotangent=None):
  real, runs = common.segment_runs(jnp.asarray(mask), jnp.asarray(segments))
  cotangent = np.zeros_like(v) if cotangent is None else cotangent
  return [np.asarray(x) for x in sliding_vjp(*key)(q, k, v, real, runs, cotangent)]


@pytest.mark.parametrize("impl,causal,window", [
    ("xla", True, WINDOW), ("chunked", True, WINDOW), ("xla", False, WINDOW),
    ("chunked", False, WINDOW), ("chunked", True, 16)],
    ids=["xla-causal", "chunked-causal", "xla-local", "chunked-local", "chunked-window>L"])
def test_sliding_window_kernels_match_float64_values_and_gradients(impl, causal, window):
  # 11 positions in blocks of 3 (a ragged last block); window 16 is one block.
  rng = np.random.default_rng(5)
  q, k, v, cotangent = (rng.normal(size=(B, L, H, D)).astype(np.float32) for _ in range(4))
  mask, segments = padding_and_segments()
  band = ((lambda t, i: 0 <= t - i < window) if causal else (lambda t, i: abs(t - i) <= window))
  visible = visibility(mask, segments, band)
  want = reference(float64_softmax_attention, (q, k, v), visible, cotangent)
  got = run_sliding((impl, causal, window), q, k, v, mask, segments, cotangent)
  for what, g, w in zip(("out", "dq", "dk", "dv"), got, want):
    assert_relatively_close(g, w, 1e-5, what)
  assert not got[0][1, 0].any()
  # The band is the window, not all the keys: one far key changed, a query outside its reach
  # keeps its output exactly.
  far = k.copy()
  far[:, 0] += 10.0
  changed = run_sliding((impl, causal, window), q, far, v, mask, segments)[0]
  reach = window if causal else window + 1
  if reach < 6:
    np.testing.assert_array_equal(changed[0, reach:6], got[0][0, reach:6])
    assert not np.allclose(changed[0, 1:reach], got[0][0, 1:reach])



# ---------------------------------------------------------------------------------------------
# The registered modules, each in a one-layer model: embeddings x -> x + attention(x) -> masked
# mean -> logits. Parameters are random (shapes from jax.eval_shape, no compiled init) and one
# jitted value-and-gradient per variant serves every check of it.

MODULE_OPTIONS = {"linear": {}, "causal_linear": {"feature_map": "relu"}, "performer": {},
                  "causal_performer": {}, "sliding_window": {"window": WINDOW},
                  "local": {"window": WINDOW}}


def module_inputs(seed=6):
  return np.random.default_rng(seed).normal(size=(B, L, H * D)).astype(np.float32)


@functools.cache
def one_layer_model(name):
  """(module, params, f) with f(params, x, mask, segments) -> ((loss, attention output), grads);
  segments are passed to the module where the variant declares segment_ids."""
  variant = attention.get(name)
  module = variant.build(num_heads=H, implementation="auto", name="attention",
                         **MODULE_OPTIONS[name])
  x, mask = jnp.asarray(module_inputs()), jnp.ones((B, L), bool)
  shapes = jax.eval_shape(module.init, jax.random.key(0), x, mask)["params"]
  rng = np.random.default_rng(len(name))
  params = jax.tree.map(lambda s: (0.5 * rng.normal(size=s.shape)).astype(np.float32), shapes)
  params["head"] = (0.5 * rng.normal(size=(H * D, 2))).astype(np.float32)
  labels = jnp.asarray([1, 0])

  def loss(params, x, mask, segments):
    kwargs = {"segment_ids": segments} if variant.segment_ids else {}
    attention_params = {k: v for k, v in params.items() if k != "head"}
    out = module.apply({"params": attention_params}, x, mask, **kwargs)
    real = mask[..., None]
    pooled = jnp.sum((x + out) * real, 1) / jnp.maximum(jnp.sum(real, 1), 1)
    logits = pooled @ params["head"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), out

  return module, params, jax.jit(jax.value_and_grad(loss, has_aux=True))


def run_model(name, x, mask, segments, params=None):
  _, default_params, f = one_layer_model(name)
  (loss, out), grads = f(default_params if params is None else params, x, mask, segments)
  return float(loss), np.asarray(out), grads


def favor_features(projection):
  """Performer's positive random features exp(W x' - |x'|^2 / 2) / sqrt(m), x' = x / d^(1/4)."""
  w = np.asarray(projection, np.float64)

  def phi(x):
    x = x / D ** 0.25
    return np.exp(x @ w.T - 0.5 * np.sum(x * x, -1, keepdims=True)) / np.sqrt(len(w))
  return phi


FEATURES = {"linear": lambda a: np.where(a > 0, a + 1.0, np.exp(a)),  # elu(a) + 1
            "causal_linear": lambda a: np.maximum(a, 0.0),  # relu
            "performer": favor_features(performer.random_projection(0, 2 * D, D)),
            "causal_performer": favor_features(performer.random_projection(0, 2 * D, D))}


def float64_module_output(name, params, x, visible):
  """The variant's layer from its definition, float64 NumPy with the module's parameters."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  x = np.asarray(x, np.float64)
  q, k, v = (np.einsum("ble,ehd->blhd", x, p[n]["kernel"]) + p[n]["bias"]
             for n in ("query", "key", "value"))
  if name in WINDOWED:
    u = float64_softmax_attention(q, k, v, visible, xp=np)
  else:
    u = float64_kernel_attention(FEATURES[name](q), FEATURES[name](k), v, visible, xp=np)
  return np.einsum("blhd,hde->ble", u, p["out"]["kernel"]) + p["out"]["bias"]


def band_of(name):
  if name == "sliding_window":
    return lambda t, i: 0 <= t - i < WINDOW
  if name == "local":
    return lambda t, i: abs(t - i) <= WINDOW
  return causal_band if attention.get(name).causal else (lambda t, i: True)


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_layer_matches_float64_ignores_padding_and_trains(name):
  variant = attention.get(name)
  _, params, _ = one_layer_model(name)
  x = module_inputs()
  mask, segments = padding_and_segments()
  if not variant.segment_ids:
    segments = None
  _, out, _ = run_model(name, x, mask, segments)
  visible = visibility(mask, segments, band_of(name))
  want = float64_module_output(name, params, x, visible)
  assert_relatively_close(out, want, 1e-5, "layer output")
  real = mask if segments is None else mask & (segments != 0)

  # Padding: new embeddings at every padded position change no real position's output.
  noise = np.random.default_rng(9).normal(size=x.shape).astype(np.float32)
  _, padded, _ = run_model(name, np.where(real[..., None], x, noise), mask, segments)
  np.testing.assert_allclose(padded[real], out[real], rtol=1e-6, atol=1e-6)

  if variant.causal:  # no position sees a later one
    for t in (3, 6):
      _, later, _ = run_model(name, np.where((np.arange(L) > t)[None, :, None], noise, x), mask,
                              segments)
      np.testing.assert_array_equal(later[:, :t + 1], out[:, :t + 1])
      assert not np.allclose(later[0, t + 1:], out[0, t + 1:])
  if segments is not None:  # row 0's first segment changed: its second is exactly as it was
    first = (np.arange(B)[:, None, None] == 0) & (np.arange(L) < 6)[None, :, None]
    _, other, _ = run_model(name, np.where(first, noise, x), mask, segments)
    np.testing.assert_array_equal(other[0, 6:], out[0, 6:])
    np.testing.assert_array_equal(other[1], out[1])

  # One gradient step of the model, on a batch with an all-padding row: finite, and it helps.
  empty = np.ones((B, L), bool)
  empty[1] = False
  loss, _, grads = run_model(name, x, empty, None if segments is None else segments * empty)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
  assert np.abs(np.asarray(grads["query"]["kernel"])).max() > 0  # attention is on the path
  stepped = jax.tree.map(lambda p, g: p - 0.01 * np.asarray(g), params, grads)
  assert run_model(name, x, empty, None if segments is None else segments * empty,
                   stepped)[0] < loss


@pytest.mark.parametrize("name", ["causal_linear", "causal_performer", "sliding_window"])
def test_module_decoding_one_token_at_a_time_equals_the_whole_row(name):
  module, params, _ = one_layer_model(name)
  params = {"params": {k: v for k, v in params.items() if k != "head"}}
  x = module_inputs()
  mask, segments = padding_and_segments()
  _, whole, _ = run_model(name, x, mask, segments)
  # The first decode=True call only allocates the cache (zeros): its shapes suffice.
  _, shapes = jax.eval_shape(lambda p: module.apply(p, x, mask, decode=True, mutable=["cache"]),
                             params)
  cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  step = jax.jit(lambda cache, x_t, m_t, s_t: module.apply(
      {**params, **cache}, x_t, m_t, decode=True, segment_ids=s_t, mutable=["cache"]))
  for t in range(L):  # (the window's ring of 3 wraps three times)
    out, cache = step(cache, x[:, t:t + 1], mask[:, t:t + 1], segments[:, t:t + 1])
    np.testing.assert_allclose(np.asarray(out)[:, 0], whole[:, t], rtol=1e-5, atol=1e-5,
                               err_msg=str(t))


def test_performer_projection_is_a_constant_of_its_seed():
  x, mask = module_inputs(), jnp.ones((B, L), bool)

  module = attention.get("causal_performer").build(num_heads=H, seed=4, name="attention")
  init = jax.jit(lambda key: module.init(key, x, mask)["constants"]["feature_map"]["projection"])
  w = np.asarray(init(jax.random.key(0)))
  np.testing.assert_array_equal(np.asarray(init(jax.random.key(1))), w)  # not the init RNG's
  np.testing.assert_array_equal(performer.random_projection(4, 2 * D, D), w)
  assert not np.allclose(performer.random_projection(0, 2 * D, D), w)
  w = performer.random_projection(0, 2 * D, D)  # the seed of one_layer_model's module
  module, params, _ = one_layer_model("causal_performer")
  assert "projection" not in str(jax.tree_util.tree_structure(params))  # nothing to train
  # Stored, or redrawn from the seed when a caller keeps only "params": the same output.
  with_constants = jax.jit(lambda p: module.apply(p, x, mask))(
      {"params": {k: v for k, v in params.items() if k != "head"},
       "constants": {"feature_map": {"projection": w}}})
  # (Equal up to float32 rounding: the two are compiled as different programs, whose fusions
  # may round differently on some CPUs; a wrong projection differs by O(1).)
  np.testing.assert_allclose(np.asarray(with_constants),
                             run_model("causal_performer", x, np.ones((B, L), bool), None)[1],
                             rtol=1e-5, atol=1e-5)
  # Orthogonal random features: blocks of D orthogonal rows (12 features: three blocks of 4).
  for block in performer.random_projection(3, 12, D).reshape(3, D, D).astype(np.float64):
    gram = block @ block.T
    np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0.0, atol=1e-5)


def test_favor_features_estimate_softmax_attention():
  # With many random features the estimate approaches softmax's exp(q.k / sqrt(d)), so the
  # attention approaches softmax attention (an unscaled x, a missing |x|^2 / 2, or the biased
  # directions of a QR without sign correction would not; that last one was 38% off).
  rng = np.random.default_rng(12)
  q, k, v = (0.5 * rng.normal(size=(1, 6, 1, D)) for _ in range(3))
  phi = favor_features(performer.random_projection(0, 8192, D))
  visible = np.ones((1, 6, 6), bool)
  got = float64_kernel_attention(phi(q), phi(k), v, visible, xp=np)
  want = float64_softmax_attention(q, k, v, visible, xp=np)
  assert_relatively_close(got, want, 0.02)


def test_registry_entries():
  for name in VARIANTS:
    variant = attention.get(name)
    assert variant.implementations[0] == "auto" and variant.reference == "xla"
    assert set(dict(variant.kernels)) == set(variant.implementations) - {"auto"}, name
    assert variant.causal == (name in ("causal_linear", "sliding_window", "causal_performer"))
    assert variant.segment_ids == (variant.causal or name == "local")
    # Linear in the length, not quadratic.
    assert variant.forward_flops(1, 2048, 1, 16) == 2 * variant.forward_flops(1, 1024, 1, 16)
    assert variant.kernel("auto", 16, length=16) == "xla"
    assert variant.kernel("auto", 16, length=4096) == (
        "chunked" if len(variant.implementations) > 2 else "xla")
  with pytest.raises(ValueError, match="feature_map='nope' is not a registered feature map"):
    jax.eval_shape(attention.get("linear").build(num_heads=H, feature_map="nope").init,
                   jax.random.key(0), module_inputs(), jnp.ones((B, L), bool))


# ---------------------------------------------------------------------------------------------
# The families' options from the config (config.model.window / linear / performer).

def test_config_options_reach_the_attention_and_bad_ones_are_refused():
  """config.model.window.size builds the classifier's local attention with that window: with a
  window covering the row it equals softmax (same parameters), with a small one it does not;
  an unknown field or a bad value is refused in one sentence naming it."""
  from tests.test_models import small_config
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 50, (2, 16)))
  outputs = {}
  for name, size in (("softmax", None), ("local", 16), ("local", 2)):
    config = small_config(name, "xla")
    if size:
      config.model.window = attention.default_options("local")
      config.model.window.size = size
    model = models.build_model(config, num_classes=2)
    if name == "softmax":
      params = model.init(jax.random.key(0), tokens)
    outputs[size] = np.asarray(model.apply(params, tokens))
  np.testing.assert_allclose(outputs[16], outputs[None], atol=1e-5)
  assert np.abs(outputs[2] - outputs[None]).max() > 1e-3
  bad = [("window", "sizes", 4, "config.model.window.sizes is not an option"),
         ("window", "size", 0, "config.model.window.size=0 must be a positive"),
         ("linear", "feature_map", "tanh", "config.model.linear.feature_map='tanh' is not"),
         ("performer", "features", -1, "config.model.performer.features=-1 must be")]
  for sub, field, value, message in bad:
    name = {"window": "local", "linear": "linear", "performer": "performer"}[sub]
    config = small_config(name, "xla")
    config.model[sub] = attention.default_options(name)
    with config.model[sub].unlocked():
      config.model[sub][field] = value
    with pytest.raises(UsageError, match=re.escape(message)):
      models.build_model(config, num_classes=2)


def test_additive_value_option_reaches_the_module_and_a_non_bool_is_refused():
  from tests.test_models import small_config
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 50, (2, 16)))
  outputs, params = [], None
  for residual in (True, False):
    config = small_config("additive_value", "xla")
    config.model.additive_value = attention.default_options("additive_value")
    config.model.additive_value.query_residual = residual
    model = models.build_model(config, num_classes=2)
    params = params or model.init(jax.random.key(0), tokens)  # the same parameters for both
    outputs.append(np.asarray(model.apply(params, tokens)))
  assert np.abs(outputs[0] - outputs[1]).max() > 1e-3  # the "+ q" is there, then not
  config = small_config("additive_value", "xla")
  config.model.additive_value = ml_collections.ConfigDict({"query_residual": "no"})
  with pytest.raises(UsageError, match=re.escape(
      "config.model.additive_value.query_residual='no' must be True")):
    models.build_model(config, num_classes=2)


def test_performer_feature_count_from_the_config():
  from tests.test_models import small_config
  config = small_config("performer", "xla")
  config.model.performer = attention.default_options("performer")
  config.model.performer.features = 24
  model = models.build_model(config, num_classes=2)
  variables = model.init(jax.random.key(0), jnp.ones((1, 16), jnp.int32))
  shapes = {jax.tree_util.keystr(p): x.shape for p, x in
            jax.tree_util.tree_leaves_with_path(variables.get("constants", {}))}
  assert shapes and all(s == (24, 4) for s in shapes.values()), shapes
