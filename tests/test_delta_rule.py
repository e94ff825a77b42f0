"""Delta-rule cores (textattn/attention/recurrent/delta_rule.py): the recurrent form against a
float64 NumPy loop of the formula; the chunked form against the recurrent one in values and in
the gradients of every input (float64 to 1e-10; float32, bfloat16 against float64), with padding,
packed segments, grouped keys; what the delta rule does (recall, replacement, beta = 0); long
rows stay finite; the sequence-parallel form equals one device on 8 fake CPU devices.

The multi-device check runs in a subprocess (XLA reads the device count when JAX starts); this
file is also that subprocess's script: `python tests/test_delta_rule.py sharded` prints one JSON
line.
"""

import functools
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.test_sequence import run_on_eight_devices
from textattn.attention.recurrent import delta_rule
from textattn.attention.recurrent.delta_rule import delta_rule_shard

# Jitted (eager, every small operation compiles on its own: slower here than one program).
delta_rule_recurrent = jax.jit(delta_rule.delta_rule_recurrent, static_argnames="scale")
delta_rule_chunked = jax.jit(delta_rule.delta_rule_chunked, static_argnames=("scale", "chunk_size"))
delta_rule_step = jax.jit(delta_rule.delta_rule_step, static_argnames="scale")
ARGS = ("q", "k", "v", "beta", "log_gates", "initial_state")


def random_inputs(length, *, batch=2, heads=2, key_heads=None, key_dim=4, value_dim=6, seed=0):
  """float64 NumPy (q, k, v, beta, log_gates, initial_state) as a layer makes them: keys
  L2-normalised, beta = sigmoid(.), log-gates = -softplus(.)."""
  rng = np.random.default_rng(seed)
  key_heads = key_heads or heads
  q = rng.standard_normal((batch, length, key_heads, key_dim))
  k = rng.standard_normal((batch, length, key_heads, key_dim))
  k /= np.linalg.norm(k, axis=-1, keepdims=True)
  v = rng.standard_normal((batch, length, heads, value_dim))
  beta = 1 / (1 + np.exp(-rng.standard_normal((batch, length, heads))))
  log_gates = -np.logaddexp(0, rng.standard_normal((batch, length, heads)))
  initial_state = rng.standard_normal((batch, heads, key_dim, value_dim))
  return q, k, v, beta, log_gates, initial_state


def packed(length, boundaries, padding=()):
  """Row 0: documents starting at `boundaries` (ids 1, 2, ...), id 0 and mask False at `padding`;
  row 1: one document, mask False at its last two positions."""
  ids = np.ones((2, length), np.int32)
  for start in boundaries:
    ids[0, start:] += 1
  mask = np.ones((2, length), bool)
  mask[1, -2:] = False
  for position in padding:
    ids[0, position], mask[0, position] = 0, False
  return ids, mask


def relative(a, b):
  """max|a - b| / max|b|."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def values_and_gradients(core, arrays, cotangents, **keywords):
  """((out, final_state), gradients of sum(out * c_out) + sum(final * c_final) w.r.t. every
  input), jitted; `arrays` = (q, k, v, beta, log_gates, initial_state)."""
  def loss(*args):
    out, final = core(*args[:5], initial_state=args[5], **keywords)
    c_out, c_final = (jnp.asarray(c, jnp.promote_types(out.dtype, jnp.float32))
                      for c in cotangents)
    return jnp.sum(out * c_out) + jnp.sum(final * c_final), (out, final)
  grad = jax.jit(jax.grad(loss, argnums=tuple(range(6)), has_aux=True))
  gradients, outputs = grad(*arrays)
  return outputs, gradients


def cotangents_for(arrays, seed=1):
  rng = np.random.default_rng(seed)
  v, state = arrays[2], arrays[5]
  return rng.standard_normal(v.shape), rng.standard_normal(state.shape)


def numpy_delta_rule(q, k, v, beta, log_gates, initial_state, scale, segment_ids, mask):
  """The recurrence as written, one token and one head at a time (float64)."""
  batch, length, heads, _ = v.shape
  group = heads // q.shape[2]
  out = np.zeros(v.shape)
  final = np.zeros(initial_state.shape)
  for b in range(batch):
    for h in range(heads):
      state = initial_state[b, h].copy()
      previous = None  # the last real token's segment id (padding joins its document)
      for t in range(length):
        real = mask[b, t] and segment_ids[b, t] != 0
        if real and previous is not None and segment_ids[b, t] != previous:
          state[:] = 0
        if real:
          previous = segment_ids[b, t]
          key = k[b, t, h // group]
          state = (np.exp(log_gates[b, t, h])
                   * (np.eye(len(key)) - beta[b, t, h] * np.outer(key, key)) @ state
                   + beta[b, t, h] * np.outer(key, v[b, t, h]))
        out[b, t, h] = scale * state.T @ q[b, t, h // group]
      final[b, h] = state
  return out, final


def test_recurrent_form_is_the_formula():
  """Grouped keys (1 key head, 2 heads), a scale, packed segments, padding, an initial state."""
  arrays = random_inputs(13, key_heads=1)
  ids, mask = packed(13, boundaries=(5, 9), padding=(7,))
  with jax.enable_x64(True):
    out, final = delta_rule_recurrent(*arrays[:5], scale=0.7, initial_state=arrays[5],
                                      segment_ids=ids, mask=mask)
  want_out, want_final = numpy_delta_rule(*arrays, 0.7, ids, mask)
  assert relative(out, want_out) <= 1e-12
  assert relative(final, want_final) <= 1e-12


CASES = {  # length, chunk, key heads, boundaries (row 0), padding (row 0), log-gates
    "multiple_of_chunk": (16, 8, 2, (), (), True),
    "not_a_multiple": (37, 8, 2, (), (), True),
    "chunk_longer_than_row": (7, 16, 2, (), (), True),
    "packed_and_padded": (37, 8, 2, (3, 12, 21, 27), (10, 11, 36), True),
    "deltanet_grouped_packed": (37, 16, 1, (5, 20), (30,), False),
}


@pytest.mark.parametrize("case", CASES)
def test_chunked_equals_recurrent_values_and_gradients_float64(case):
  """Every output, final state and gradient (q, k, v, beta, log-gates, initial state) to 1e-10
  of the largest entry. Boundaries fall inside chunks, at a chunk's start (21 - 5 = 16 ... and 8,
  16, 24 in row 0's runs) and just before one; padding inside runs and at the end."""
  length, chunk, key_heads, boundaries, padding, gated = CASES[case]
  arrays = random_inputs(length, key_heads=key_heads)
  ids, mask = packed(length, boundaries, padding)
  if not gated:
    arrays = arrays[:4] + (None,) + arrays[5:]
  with jax.enable_x64(True):
    cotangents = cotangents_for(arrays)
    segments = dict(segment_ids=ids, mask=mask) if boundaries or padding else {}
    want, want_gradients = values_and_gradients(delta_rule_recurrent, arrays, cotangents,
                                                **segments)
    got, got_gradients = values_and_gradients(delta_rule_chunked, arrays, cotangents,
                                              chunk_size=chunk, **segments)
  for name, a, b in zip(("out", "final_state"), got, want):
    assert relative(a, b) <= 1e-10, name
  for name, a, b in zip(ARGS, got_gradients, want_gradients):
    if arrays[ARGS.index(name)] is not None:
      assert np.max(np.abs(b)) > 0, name
      assert relative(a, b) <= 1e-10, name


def test_each_packed_document_equals_itself_alone():
  """Row 0 packs documents [0, 6), [6, 19), [19, 30) (boundaries inside chunks of 8): each part
  of the output equals the document run alone (the first with the initial state, the others from
  zero), and the final state is the last document's."""
  arrays = random_inputs(30)
  ids, _ = packed(30, boundaries=(6, 19))
  with jax.enable_x64(True):
    out, final = delta_rule_chunked(*arrays[:5], initial_state=arrays[5], segment_ids=ids,
                                    chunk_size=8)
    for start, end in ((0, 6), (6, 19), (19, 30)):
      part = tuple(a[:1, start:end] for a in arrays[:5])
      state = arrays[5][:1] if start == 0 else None
      alone, alone_final = delta_rule_chunked(*part, initial_state=state, chunk_size=8)
      assert relative(out[:1, start:end], alone) <= 1e-12, (start, end)
    assert relative(final[:1], alone_final) <= 1e-12


@pytest.mark.parametrize("dtype, value_tolerance, gradient_tolerance",
                         [("float32", 1e-5, 1e-4), ("bfloat16", 2e-2, 2e-2)])
def test_lower_precisions_against_float64(dtype, value_tolerance, gradient_tolerance):
  """The chunked form in float32/bfloat16 against the float64 recurrence of the same (rounded)
  inputs, packed and padded; the state is float32 in both."""
  arrays = tuple(jnp.asarray(a, dtype) for a in random_inputs(37))
  ids, mask = packed(37, boundaries=(12, 21), padding=(36,))
  cotangents = cotangents_for(arrays)
  got, got_gradients = values_and_gradients(delta_rule_chunked, arrays, cotangents,
                                            chunk_size=8, segment_ids=ids, mask=mask)
  assert got[0].dtype == jnp.dtype(dtype) and got[1].dtype == jnp.float32
  with jax.enable_x64(True):
    want, want_gradients = values_and_gradients(
        delta_rule_recurrent, tuple(np.asarray(a, np.float64) for a in arrays), cotangents,
        segment_ids=ids, mask=mask)
  for name, a, b in zip(("out", "final_state"), got, want):
    assert relative(a, b) <= value_tolerance, name
  for name, a, b in zip(ARGS, got_gradients, want_gradients):
    assert relative(a, b) <= gradient_tolerance, name


def test_zero_log_gates_are_deltanet_and_beta_zero_keeps_the_initial_state():
  arrays = random_inputs(19)
  q, k, v, beta, _, state = arrays
  with jax.enable_x64(True):
    for core in (delta_rule_recurrent, functools.partial(delta_rule_chunked, chunk_size=8)):
      gated = core(q, k, v, beta, np.zeros(beta.shape), initial_state=state)
      plain = core(q, k, v, beta, initial_state=state)
      for a, b in zip(gated, plain):
        assert relative(a, b) <= 1e-14
      out, final = core(q, k, v, np.zeros(beta.shape), initial_state=state, scale=0.3)
      assert relative(out, 0.3 * np.einsum("bhkv,blhk->blhv", state, q)) <= 1e-14
      assert relative(final, state) == 0


def test_a_written_key_recalls_its_value_and_a_second_write_replaces_it():
  """Unit keys, scale 1, no decay, beta 1 for the writes. Key e0 is written with a, then
  orthogonal keys e1, e2 are written, e0 is queried (a), written again with c, and queried (c);
  e1 is queried last and still gives its own value, so the padding token before it (key e1,
  beta 0.9, log-gate -5) neither wrote nor decayed."""
  eye = np.eye(4)
  values = np.random.default_rng(0).standard_normal((4, 3))
  keys = [eye[0], eye[1], eye[2], eye[3], eye[0], eye[1], eye[3]]
  written = [values[0], values[1], values[2], np.zeros(3), values[3], values[2], np.zeros(3)]
  queries = [eye[0], eye[1], eye[2], eye[0], eye[0], eye[3], eye[1]]
  beta = np.array([1, 1, 1, 0, 1, 0.9, 0])
  mask = np.array([True] * 5 + [False, True])
  gates = np.where(mask, 0, -5.0)
  as_row = lambda x: jnp.asarray(np.asarray(x)[None, :, None], jnp.float32)
  for core in (delta_rule_recurrent, functools.partial(delta_rule_chunked, chunk_size=4)):
    out, _ = core(as_row(queries), as_row(keys), as_row(written), as_row(beta), as_row(gates),
                  scale=1.0, mask=jnp.asarray(mask[None]))
    out = np.asarray(out[0, :, 0])
    np.testing.assert_allclose(out[3], values[0], atol=1e-6)  # e0 recalls a
    np.testing.assert_allclose(out[4], values[3], atol=1e-6)  # replaced by c
    np.testing.assert_allclose(out[6], values[1], atol=1e-6)  # e1 untouched


def test_the_step_with_reset_and_real_flags_is_the_chunked_form():
  """Decoding: delta_rule_step token by token, `reset` at each document start (a real token whose
  id differs from the last real token's) and `real` for the padding, gives the chunked form's
  outputs and final state."""
  arrays = random_inputs(11, key_heads=1)
  ids, mask = packed(11, boundaries=(4,), padding=(8,))
  with jax.enable_x64(True):
    want_out, want_final = delta_rule_chunked(*arrays[:5], scale=0.5, initial_state=arrays[5],
                                              segment_ids=ids, mask=mask, chunk_size=4)
    state, outs = jnp.asarray(arrays[5]), []
    last = ids[:, 0].copy()  # each row's last real token's id (padding joins its document)
    for t in range(11):
      real = mask[:, t] & (ids[:, t] != 0)
      reset = jnp.asarray(real & (ids[:, t] != last))
      last = np.where(real, ids[:, t], last)
      real = jnp.asarray(real)
      state, out = delta_rule_step(state, *(a[:, t] for a in arrays[:5]), scale=0.5,
                                   reset=reset, real=real)
      outs.append(out)
  assert relative(np.stack(outs, 1), want_out) <= 1e-12
  assert relative(state, want_final) <= 1e-12


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_long_rows_have_finite_values_and_gradients(dtype):
  """16,384 tokens, log-gates of -20 per token (the chunk's cumulative sum reaches -1280) and of
  0, the chunked form: outputs, final state and every gradient finite."""
  length = 16_384
  arrays = random_inputs(length, batch=1, heads=1, key_dim=8, value_dim=8)
  cotangents = cotangents_for(arrays)

  def loss(*args):
    out, final = delta_rule_chunked(*args[:5], initial_state=args[5])
    return (jnp.sum(out.astype(jnp.float32) * cotangents[0])
            + jnp.sum(final * cotangents[1]), (out, final))
  grad = jax.jit(jax.grad(loss, argnums=tuple(range(6)), has_aux=True))
  for gate in (-20.0, 0.0):
    inputs = tuple(jnp.asarray(a, dtype) for a in arrays[:4] + (np.full(arrays[3].shape, gate),)
                   + arrays[5:])
    gradients, (out, final) = grad(*inputs)
    for name, a in zip(("out", "final_state") + ARGS, (out, final) + gradients):
      assert bool(jnp.all(jnp.isfinite(a))), (gate, name)
    assert float(jnp.max(jnp.abs(out.astype(jnp.float32)))) > 0


# ---------------------------------------------------------------------------------------------
# Sequence parallelism (subprocess on 8 fake CPU devices).

SHARD_TOLERANCE = {"float64": 1e-10, "float32": 1e-5}
MESHES = {"float64": ((1, 8), (2, 4)), "float32": ((1, 8),)}  # (data, sequence)


@pytest.mark.cpu_only
def test_sequence_parallel_equals_one_device():
  """96 tokens on 8 shards of 12 and (float64) on a 2 x 4 mesh (shards of 24), chunks of 8
  (shards not a multiple): row 0 packs documents that cross shard boundaries, one starting
  exactly at a shard boundary (48), padding inside and at the end; row 1 is one document over
  every shard with an initial state. Outputs, final state and every gradient against one device."""
  result = run_on_eight_devices("sharded", script=__file__)
  assert set(result) == {f"{dtype} {data}x{shards}" for dtype, meshes in MESHES.items()
                         for data, shards in meshes}, result
  for key, errors in result.items():
    assert len(errors) == 2 + len(ARGS), (key, errors)
    for name, error in errors.items():
      assert error <= SHARD_TOLERANCE[key.split()[0]], (key, name, error)


def _sharded_errors() -> dict:
  jax.config.update("jax_enable_x64", True)
  from textattn import sharding  # (the subprocess only)
  from textattn.attention.recurrent.chunking import document_runs
  length, chunk = 96, 8
  ids, mask = packed(length, boundaries=(30, 48, 50), padding=(40, 41, 95))
  real, runs = document_runs(jnp.asarray(mask), jnp.asarray(ids), mask.shape)
  result = {}
  for dtype in SHARD_TOLERANCE:
    arrays = tuple(jnp.asarray(a, dtype) for a in random_inputs(length, key_heads=1, seed=3))
    cotangents = cotangents_for(arrays)
    want_values, want = values_and_gradients(delta_rule_chunked, arrays, cotangents,
                                             segment_ids=ids, mask=mask, chunk_size=chunk)
    for data, shards in MESHES[dtype]:
      mesh = sharding.make_mesh(data, shards)
      tokens, rows = jax.P("data", "sequence"), jax.P("data")

      def shard(q, k, v, beta, log_gates, initial_state, real, runs):
        out, final = delta_rule_shard(q, k, v, beta, log_gates, axis_name="sequence",
                                      initial_state=initial_state, runs=runs, mask=real,
                                      chunk_size=chunk)
        return out, final[None]
      sharded = jax.shard_map(shard, mesh=mesh, in_specs=(tokens,) * 5 + (rows, tokens, tokens),
                              out_specs=(tokens, jax.P("sequence", "data")))

      def core(q, k, v, beta, log_gates, *, initial_state, sharded=sharded):
        out, finals = sharded(q, k, v, beta, log_gates, initial_state, real, runs)
        return out, finals[-1]
      got_values, got = values_and_gradients(core, arrays, cotangents)
      errors = {name: relative(a, b) for name, a, b in zip(
          ("out", "final_state") + ARGS, tuple(got_values) + tuple(got),
          tuple(want_values) + tuple(want))}
      result[f"{dtype} {data}x{shards}"] = errors
  return result


if __name__ == "__main__":
  print(json.dumps({"sharded": _sharded_errors}[sys.argv[1]]()))
