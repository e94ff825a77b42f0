"""One point's timed function and its arguments, per mode (in the point's subprocess): random
inputs, the attention layer alone, a decoding step, the classifier's forward (and backward) and
its training step, on one device or a --mesh.

Imported only by the point's process (through cli.py's one lazy import), so JAX loads here at
module level; nothing here runs a JAX operation on import (request_mesh_devices must come first).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from textattn import attention as attention_lib
from textattn import data as data_lib
from textattn import models, optim, platform, sharding, train_state
from textattn.attention import sequence
from textattn.errors import UsageError
from textattn.tasks.classification import step


def random_inputs(spec: dict, seq_len: int, batch_size: int):
  rng = np.random.default_rng(spec["seed"])
  lengths = rng.integers(seq_len // 2 if seq_len > 1 else 1, seq_len + 1, batch_size)
  lengths[0] = seq_len  # the full length is always exercised
  if spec.get("lengths", "half_to_full") == "full":
    lengths[:] = seq_len
  padding_mask = np.arange(seq_len)[None, :] < lengths[:, None]
  tokens = np.where(padding_mask, rng.integers(1, max(spec["vocab_size"], 2),
                                               (batch_size, seq_len)), 0).astype(np.int32)
  labels = rng.integers(0, spec["num_classes"], batch_size).astype(np.int32)
  return rng, padding_mask, tokens, labels


def mesh_shape(spec: dict) -> tuple[int, int] | None:
  """(data, sequence) of the point's --mesh ("DxS" in its spec), or None."""
  if not spec.get("mesh"):
    return None
  data, shards = spec["mesh"].split("x")
  return int(data), int(shards)


def point_mesh(spec: dict):
  """The point's (data, sequence) mesh from --mesh, or None."""
  if mesh_shape(spec) is None:
    return None
  return sharding.make_mesh(*mesh_shape(spec))


def request_mesh_devices(spec: dict) -> None:
  """On a CPU, D x S devices for a --mesh point (before any JAX operation), unless XLA_FLAGS
  sets the count already."""
  if spec.get("mesh") and "xla_force_host_platform_device_count" not in os.environ.get(
      "XLA_FLAGS", ""):
    data, shards = mesh_shape(spec)
    jax.config.update("jax_num_cpu_devices", data * shards)


def _build_attention(config, rng, padding_mask, key, short, backward=False, mesh=None):
  """The attention layer alone; with a `mesh` its sequence-sharded module (sequence.build) on
  inputs split along (data, sequence), parameters replicated, and the cotangent an argument
  split like x (captured, it would be a constant whole on every device)."""
  models.validate_model_config(config)
  m = config.model
  dtype = models.DTYPES[m.dtype]
  # "auto" resolved for this point's length (not the short init's): models.resolved_kernel.
  module = sequence.build(attention_lib.get(m.attention), mesh, num_heads=m.num_heads,
                          implementation=models.resolved_kernel(config), dtype=dtype)
  batch_size, seq_len = padding_mask.shape
  x = jnp.asarray(rng.standard_normal((batch_size, seq_len, m.embed_dim)), dtype)
  mask = jnp.asarray(padding_mask)
  params = jax.jit(module.init)(key, x[:1, :short], mask[:1, :short])["params"]
  if mesh is not None:
    params = jax.device_put(params, jax.NamedSharding(mesh, jax.P()))
    x = jax.device_put(x, sharding.length_sharding(mesh, 3))
    mask = jax.device_put(mask, sharding.length_sharding(mesh, 2))
  if backward:  # gradients of the parameters and the input, for a fixed random cotangent
    cotangent = jnp.asarray(rng.standard_normal(x.shape), dtype)

    def loss(p, x, mask, cotangent):
      return jnp.sum((module.apply({"params": p}, x, mask) * cotangent).astype(jnp.float32))

    gradient = jax.value_and_grad(loss, argnums=(0, 1))
    if mesh is not None:
      cotangent = jax.device_put(cotangent, sharding.length_sharding(mesh, 3))
      return jax.jit(gradient), (params, x, mask, cotangent)
    return jax.jit(lambda p, x, mask: gradient(p, x, mask, cotangent)), (params, x, mask)
  return jax.jit(lambda p, x, mask: module.apply({"params": p}, x, mask)), (params, x, mask)


def _build_decode_step(config, rng, key, short):
  """One decoding step of the causal layer at the last position of a cache of max_len
  positions: (params, cache, x_t, mask_t) -> (output, cache), the cache donated and its
  position set back to the last, so each repeat is the same step, updating the cache in place
  as decoding does (without donation every call copied the whole cache: a KV cache's O(L) cost
  doubled against a recurrent state's). On a GPU the point's peak memory includes the
  full-length call that fills the cache."""
  m = config.model
  dtype = models.DTYPES[m.dtype]
  module = attention_lib.get(m.attention).build(
      num_heads=m.num_heads, implementation=models.resolved_kernel(config), dtype=dtype)
  batch_size, seq_len = config.batch_size, config.max_len
  x = jnp.asarray(rng.standard_normal((batch_size, seq_len, m.embed_dim)), dtype)
  mask = jnp.ones((batch_size, seq_len), bool)
  params = jax.jit(module.init)(key, x[:, :short], mask[:, :short])["params"]
  _, variables = jax.jit(lambda p: module.apply({"params": p}, x, mask, decode=True,
                                                mutable=["cache"]))(params)
  # Positions 0..L-2 are (as good as) cached: the step timed is position L-1.
  def at_last_position(cache):
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: jnp.asarray(seq_len - 1, leaf.dtype)
        if getattr(path[-1], "key", None) == "index" else leaf, cache)

  def step(p, c, x_t, m_t):
    out, updated = module.apply({"params": p, "cache": c}, x_t, m_t, decode=True,
                                mutable=["cache"])
    return out, at_last_position(updated["cache"])
  return (jax.jit(step, donate_argnums=1),
          (params, at_last_position(variables["cache"]), x[:, -1:], mask[:, -1:]))


def _build_train_step(spec, config, model, tokens, labels, key, short):
  tx = optim.make_optimizer(config.optimizer, total_steps=max(spec["warmup"] + spec["repeats"],
                                                              1000))

  def init(rng):
    return train_state.init_train_state(model, tx, rng, short, config.optimizer)

  # As in training: the batch sharded over all devices (config.platform.num_cpu_devices on a CPU), the
  # state replicated.
  mesh = platform.run_mesh()
  data_sharding, replicated = jax.NamedSharding(mesh, jax.P("data")), platform.replicated(mesh)
  if config.batch_size % jax.device_count():
    raise UsageError(f"config.batch_size={config.batch_size} must be a multiple of the device "
                     f"count ({jax.device_count()}).")
  state = jax.jit(init, out_shardings=replicated)(key)
  batch = jax.device_put({"inputs": tokens, "labels": labels}, data_sharding)
  return jax.jit(step.train_step, in_shardings=(replicated, data_sharding),
                 out_shardings=(replicated, replicated), donate_argnums=0,
                 compiler_options=platform.step_compiler_options(config)), (state, batch)


def _build_classifier(mode: str, model, params, tokens, labels, mesh):
  """The classifier's forward (train=False), or the value and gradient of its mean
  cross-entropy; with a `mesh` the batch split along (data, sequence), parameters replicated."""
  if mesh is not None:
    params = jax.device_put(params, platform.replicated(mesh))
    tokens = jax.device_put(tokens, platform.batch_sharding(mesh, tokens.shape))
    labels = jax.device_put(labels, platform.batch_sharding(mesh, labels.shape))
  if mode == "forward":
    return jax.jit(lambda p, t: model.apply({"params": p}, t, train=False)), (params, tokens)

  def loss_fn(params, tokens, labels):
    logits = model.apply({"params": params}, tokens, train=False)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))

  return jax.jit(jax.value_and_grad(loss_fn)), (params, tokens, labels)


def build(spec: dict, config, implementation: str | None = None):
  """(jitted function, its arguments) for the spec's mode. `implementation` overrides the
  attention's kernel (the reference check builds the same function on the reference one)."""
  config = config.copy_and_resolve_references()
  if implementation is not None:
    with config.unlocked():
      config.model.attention_impl = implementation
  seq_len, batch_size, mode = config.max_len, config.batch_size, spec["mode"]
  rng, padding_mask, tokens, labels = random_inputs(spec, seq_len, batch_size)
  if not mode.startswith("attention") and data_lib.pads_before(config):
    tokens = data_lib.pad_before(tokens)  # the layout the model trains on
  key = jax.random.key(spec["seed"])
  short = min(seq_len, 8)  # parameter shapes do not depend on the length: init cheaply

  mesh = point_mesh(spec)
  if mode.startswith("attention"):
    return _build_attention(config, rng, padding_mask, key, short,
                            backward=mode == "attention+backward", mesh=mesh)
  if mode == "decode_step":
    return _build_decode_step(config, rng, key, short)
  model = models.build_model(config, spec["num_classes"], mesh=mesh)
  tokens, labels = jnp.asarray(tokens), jnp.asarray(labels)
  if mode == "train_step":
    return _build_train_step(spec, config, model, tokens, labels, key, short)
  params = jax.jit(model.init)(key, tokens[:1, :short])["params"]
  return _build_classifier(mode, model, params, tokens, labels, mesh)
