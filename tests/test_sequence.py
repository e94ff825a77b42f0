"""Sequence parallelism (textattn/attention/sequence.py): every variant that declares sharding
gives one device's outputs and gradients on 2 and 8 sequence shards and on a 2 x 4
(data x sequence) mesh (4 shards); the causal ring is balanced; what cannot be split is refused.

The multi-device checks run in a subprocess on 8 fake CPU devices (XLA reads the device count
when JAX starts, and the rest of the suite runs on one); this file is also that subprocess's
script: `python tests/test_sequence.py CHECK VARIANT` prints one JSON line.
"""

import json
import os
import subprocess
import sys

import pytest

SHARDED = ("softmax", "causal", "additive", "causal_additive_recurrent", "causal_linear",
           "retnet", "gla", "mamba2", "deltanet", "gated_deltanet")
# The linear recurrences (textattn/attention/recurrent/parallel.py) are also checked in float64.
RECURRENT = ("causal_linear", "retnet", "gla", "mamba2", "deltanet", "gated_deltanet")
# (data, sequence); 4 shards are checked on the 2 x 4 mesh, which also splits the batch. (Two
# shards: the language-model test below, 1 x 2 and 2 x 2, for the causal forms.)
MESHES = ((1, 8), (2, 4))
TOLERANCE = 1e-5  # relative to the largest value of the compared output or gradient


def run_on_eight_devices(*args: str, script: str = __file__) -> dict:
  """`python SCRIPT ARGS` on 8 fake CPU devices; its last stdout line, parsed as JSON."""
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} "
                       f"--xla_force_host_platform_device_count=8")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
  done = subprocess.run([sys.executable, os.path.abspath(script), *args], env=env,
                        check=False, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.cpu_only
@pytest.mark.parametrize("variant", [n for n in SHARDED if n not in RECURRENT])
def test_sharded_outputs_and_gradients_equal_one_device(variant):
  """Padding sits inside shards, at their ends, fills whole shards, and (causal) leaves the
  first positions with no visible key."""
  result = run_on_eight_devices("exactness", variant)
  assert result["same_parameters"], result
  for mesh, errors in result["errors"].items():
    assert errors["output"] <= TOLERANCE, (mesh, errors)
    assert errors["gradient"] <= TOLERANCE, (mesh, errors)
  # Variants that take segment ids: packed rows (documents crossing shard boundaries) too.
  from textattn import attention
  assert bool(result["segment_errors"]) == attention.get(variant).segment_ids, result
  for mesh, errors in result["segment_errors"].items():
    assert errors["output"] <= TOLERANCE, (mesh, errors)
    assert errors["gradient"] <= TOLERANCE, (mesh, errors)


@pytest.mark.cpu_only
def test_linear_recurrences_sharded_equal_one_device_in_float64_and_float32():
  """Each shard's (transition, state) pair from a zero state, the exclusive scan over shards and
  the rerun from the incoming state are exact: one device's outputs and parameter and input
  gradients within 1e-10 in float64 (a 2 x 4 mesh) and 1e-5 in float32 (1 x 8), on packed rows
  whose documents cross shard boundaries, with padding inside and at the ends of shards (one
  device: the recurrent reference, or causal_linear's masked quadratic form). One subprocess
  for the four variants (its compilations are the cost)."""
  result = run_on_eight_devices("exactness64", ",".join(RECURRENT))
  for name, errors in result.items():
    assert errors["same_parameters"], name
    for dtype, tolerance in (("float64", 1e-10), ("float32", 1e-5)):
      error = errors[dtype]
      assert error["output"] <= tolerance and error["gradient"] <= tolerance, (name, dtype, error)


@pytest.mark.cpu_only
def test_a_language_model_on_a_sequence_mesh_keeps_documents_apart_and_equals_one_device():
  """Causal softmax (the ring; with learned and with rotary positions, the latter turned by
  their global positions before the split) and causal additive (recurrent prefix over shards)
  as 2-layer language models on a 1 x 2 and a 2 x 2 mesh: the logits equal one device's, and
  changing one document of a packed row (one that crosses the shard boundary) leaves the
  others' unchanged."""
  for variant in ("causal", "causal:rotary", "causal_additive_recurrent"):
    result = run_on_eight_devices("lm_segments", variant)
    for mesh, errors in result.items():
      assert errors["against_one_device"] <= TOLERANCE, (variant, mesh, errors)
      assert errors["other_documents"] <= TOLERANCE, (variant, mesh, errors)
      assert errors["changed_document"] > 1e-3, (variant, mesh, errors)


@pytest.mark.cpu_only
def test_causal_ring_computes_the_same_blocks_on_every_device():
  """Zig-zag: 3 + 2(S-1) chunk-blocks on every device. The contiguous layout, which a ring
  without load balancing uses, fails the same check (device S-1 does S times device 0's
  work), so the check can tell them apart."""
  result = run_on_eight_devices("balance", "causal")
  for shards in ("2", "4", "8"):
    zigzag = result["zigzag"][shards]
    assert max(zigzag) - min(zigzag) <= 1, result
    assert zigzag[0] == 3 + 2 * (int(shards) - 1), result
    # 4 blocks per step, S-1 steps skipped on device 0, none on device S-1.
    contiguous = result["contiguous"][shards]
    assert max(contiguous) - min(contiguous) == 4 * (int(shards) - 1), result


@pytest.mark.cpu_only
def test_communication_per_layer_is_the_stated_formula():
  """Collective bytes of one layer's forward + backward, read from the compiled program, equal
  the formulas stated in textattn/benchmark/collectives.py. The ring's backward once sent the blocks
  as the forward had, and XLA reused the forward's transfers: fewer bytes than the formula
  (and every received block kept alive until the backward)."""
  result = run_on_eight_devices("communication", "-")
  for name, (measured, expected) in result.items():
    assert measured == expected, (name, measured, expected)


@pytest.mark.cpu_only
def test_lengths_the_mesh_does_not_divide_are_refused():
  result = run_on_eight_devices("refusals", "-")
  assert result["additive"] == (
      "a sequence length of 30 cannot be split over 4 sequence shards: it must be a multiple "
      "of 4; pad the batch to such a length (config.max_len) or choose another mesh.sequence.")
  # The zig-zag layout splits each shard in two: 36 = 4 x 9 is not enough.
  assert result["causal"].startswith(
      "a sequence length of 36 cannot be split over 4 sequence shards (the causal ring's "
      "zig-zag layout halves each shard): it must be a multiple of 4 x 2 = 8;"), result
  assert all("Traceback" not in message for message in result.values())


def test_a_variant_without_sharding_is_refused_in_one_sentence():
  import jax

  from textattn import attention
  from textattn.attention import sequence
  from textattn.errors import UsageError

  mesh = jax.sharding.AbstractMesh((1, 4), ("data", "sequence"))
  variant = attention.get("causal_additive")  # the direct form declares none
  with pytest.raises(UsageError, match=r"^config.model.attention='causal_additive' declares no "
                     r"sequence sharding, so it cannot run with mesh.sequence=4; use "
                     r"mesh.sequence=1 or a variant that does \(softmax, causal, additive, "
                     r"causal_additive_recurrent, causal_linear, retnet, gla, mamba2, deltanet, "
                     r"gated_deltanet\)\.$"):
    sequence.build(variant, mesh, num_heads=2, name="attention")
  # One sequence shard needs no declaration.
  one = jax.sharding.AbstractMesh((4, 1), ("data", "sequence"))
  assert type(sequence.build(variant, one, num_heads=2)) is type(variant.build(num_heads=2))


def test_builtins_declare_sharding_in_the_registry():
  from textattn import attention
  declared = {name for name in attention.names() if attention.get(name).shard is not None}
  assert declared == set(SHARDED)


# --------------------------------------------------------------------------------------------
# The subprocess (8 fake CPU devices).

def _inputs(batch=2, length=32, embed=8, dtype="float32"):
  import jax.numpy as jnp
  import numpy as np
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(batch, length, embed)), dtype)
  cotangent = jnp.asarray(rng.normal(size=(batch, length, embed)), dtype)
  mask = np.ones((batch, length), bool)
  # Row 0: padding at 5-7 (the end of a shard for S = 4 and 8), then from 20 on (whole shards).
  # Row 1: its first three positions (causal rows seeing no real key), one inside a shard (13)
  # and the last two.
  mask[0, 5:8] = False
  mask[0, 20:] = False
  mask[1, :3] = False
  mask[1, [13, 30, 31]] = False
  return x, jnp.asarray(mask), cotangent


def _segment_ids():
  """Packed rows for _inputs' masks: documents that cross shard boundaries, id 0 at the
  padding."""
  import jax.numpy as jnp
  import numpy as np
  ids = np.zeros((2, 32), np.int32)
  ids[0, :11], ids[0, 11:20] = 1, 2
  ids[1, :9], ids[1, 9:18], ids[1, 18:30] = 1, 2, 3
  return jnp.asarray(ids)


def _exactness(name: str) -> dict:
  result = _exactness_of(name, None)
  result["segment_errors"] = {}
  from textattn import attention
  if attention.get(name).segment_ids:
    result["segment_errors"] = _exactness_of(name, _segment_ids())["errors"]
  return result


def _exactness64(names: str) -> dict:
  import jax
  jax.config.update("jax_enable_x64", True)
  result = {}
  for name in names.split(","):
    wide = _exactness_of(name, _segment_ids(), "float64", meshes=((2, 4),))
    narrow = _exactness_of(name, _segment_ids(), "float32", meshes=((1, 8),))
    result[name] = {"float64": wide["errors"]["2x4"], "float32": narrow["errors"]["1x8"],
                    "same_parameters": wide["same_parameters"] and narrow["same_parameters"]}
  return result


def _exactness_of(name: str, segment_ids, dtype: str = "float32", meshes=MESHES) -> dict:
  import jax
  import jax.numpy as jnp

  from textattn import attention, sharding
  from textattn.attention import sequence

  x, mask, cotangent = _inputs(dtype=dtype)
  variant = attention.get(name)
  kwargs = {"num_heads": 2, "implementation": variant.reference, "dtype": jnp.dtype(dtype),
            "name": "attention"}
  extra = {} if segment_ids is None else {"segment_ids": segment_ids}
  one = variant.build(**kwargs)
  # (jitted: op by op, an init compiles ~200 small programs, ~6 s in this fresh process)
  params = jax.jit(one.init)(jax.random.key(0), x, mask)
  params = jax.tree.map(lambda p: p.astype(dtype), params)

  def outputs_and_gradients(module):
    def loss(params, x):
      out = module.apply(params, x, mask, **extra)
      if segment_ids is not None:  # (a padding position's output is not compared)
        out = jnp.where((segment_ids != 0)[..., None], out, 0.0)
      return jnp.sum(out * cotangent), out
    return jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(params, x)

  def relative(a, b):
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))

  reference_gradients, reference = outputs_and_gradients(one)
  errors, same_parameters = {}, True
  for data, shards in meshes:
    mesh = sharding.make_mesh(data, shards)
    module = sequence.build(variant, mesh, **kwargs)
    shapes = jax.eval_shape(module.init, jax.random.key(0), x, mask)
    same_parameters &= jax.tree.structure(shapes) == jax.tree.structure(params)
    gradients, out = outputs_and_gradients(module)
    # Each gradient against its largest entry's scale: a leaf whose exact gradient is 0 (the
    # key bias under softmax) is compared at the scale of the whole gradient.
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(reference_gradients))
    gradient_error = max(float(jnp.max(jnp.abs(a - b))) / scale for a, b in
                         zip(jax.tree.leaves(gradients), jax.tree.leaves(reference_gradients)))
    errors[f"{data}x{shards}"] = {"output": relative(out, reference), "gradient": gradient_error}
  return {"errors": errors, "same_parameters": bool(same_parameters)}


def _balance() -> dict:
  from textattn import sharding
  from textattn.attention import ring
  result = {}
  for layout in ("zigzag", "contiguous"):
    result[layout] = {
        str(shards): [int(c) for c in ring.ring_block_counts(
            sharding.make_mesh(1, shards), layout, batch=1, length=2 * shards)]
        for shards in (2, 4, 8)}
  return result


def _communication() -> dict:
  from textattn import sharding
  from textattn.benchmark import layer_cost
  result = {}
  # (The linear recurrences' all_gather of state pairs has no formula in collectives.py yet.)
  for name in (n for n in SHARDED if n not in RECURRENT):
    row = layer_cost.layer_cost(name, sharding.make_mesh(1, 4), batch=1, length=32, embed=8,
                                heads=2, always_sharded=True)
    result[name] = (row["comm_total"], row["comm_formula"])
  return result


def _refusals() -> dict:
  import jax.numpy as jnp

  from textattn import sharding
  from textattn.attention import sequence
  from textattn.errors import UsageError

  mesh = sharding.make_mesh(1, 4)
  messages = {}
  for name, length in (("additive", 30), ("causal", 36)):
    q = jnp.zeros((1, length, 1, 2))
    mask = jnp.ones((1, length), bool)
    try:
      if name == "additive":
        sequence.sharded_additive(q, q, mask, jnp.zeros((2, 1)), jnp.zeros((2, 1)), mesh=mesh)
      else:
        sequence.sharded_softmax(q, q, q, mask, mesh=mesh, causal=True)
      messages[name] = "not refused"
    except UsageError as error:
      messages[name] = str(error)
  return messages


def _lm_segments(name: str) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np

  from textattn import sharding
  from textattn.tasks.language_model import config as lm_config
  from textattn.tasks.language_model import model as lm_model

  config = lm_config.defaults()
  m = config.model
  name, _, position = name.partition(":")  # ("causal:rotary": config.model.position)
  m.attention, m.attention_impl, m.position = name, "xla", position or m.position
  m.embed_dim, m.num_heads, m.ffn_dim, m.num_layers = 16, 2, 32, 2
  config.max_len = 30  # padded to 32 on the mesh (2 x 2 x 8 zig-zag chunks)
  rng = np.random.default_rng(0)
  # Two packed rows: row 0 holds documents of 9, 12 (crossing the middle) and 9 positions,
  # row 1 one of 30.
  inputs = jnp.asarray(rng.integers(3, 200, (2, config.max_len)), jnp.int32)
  ids = np.ones((2, config.max_len), np.int32)
  ids[0, 9:21], ids[0, 21:] = 2, 3
  positions = np.concatenate([np.arange(9), np.arange(12), np.arange(9)])
  ids, positions = jnp.asarray(ids), jnp.asarray(np.stack([positions, np.arange(30)]))
  changed = inputs.at[0, 12:18].set((inputs[0, 12:18] + 7) % 200 + 3)  # inside document 2
  one = lm_model.build(config, 258)
  params = jax.jit(one.init)(jax.random.key(0), inputs)  # (jitted: one compile, not hundreds)
  reference = jax.jit(one.apply)(params, inputs, ids, positions)
  result = {}
  for data, shards in ((1, 2), (2, 2)):
    mesh = sharding.make_mesh(data, shards)
    model = lm_model.build(config, 258, mesh)
    run = jax.jit(lambda t, model=model: model.apply(params, t, ids, positions))
    a, b = run(inputs), run(changed)
    others = jnp.concatenate([jnp.arange(9), jnp.arange(21, 30)])
    scale = float(jnp.max(jnp.abs(reference)))
    result[f"{data}x{shards}"] = {
        "against_one_device": float(jnp.max(jnp.abs(a - reference))) / scale,
        "other_documents": float(jnp.max(jnp.abs(a[0, others] - b[0, others]))) / scale,
        "changed_document": float(jnp.max(jnp.abs(a[0, 12:21] - b[0, 12:21]))) / scale}
  return result


if __name__ == "__main__":
  check, variant = sys.argv[1:3]
  result = {"exactness": lambda: _exactness(variant), "balance": _balance,
            "exactness64": lambda: _exactness64(variant),
            "lm_segments": lambda: _lm_segments(variant),
            "refusals": _refusals, "communication": _communication}[check]()
  print(json.dumps(result))
