"""Per-device memory and communication of one attention layer's forward + backward, read from the
compiled program on a (data, sequence) mesh: nothing is run, only compiled (issue 43).

The layer is an attention module (projections + core + output projection) of batch B, total
length L and embed E; the loss is sum(output * cotangent), its gradient taken with respect to the
parameters and the input. Inputs are split along (data, sequence), parameters replicated.

Memory, per device, from `compiled.memory_analysis()`: footprint = argument_size_in_bytes +
output_size_in_bytes + temp_size_in_bytes - alias_size_in_bytes (temp: XLA's buffer assignment
of every intermediate, reuse included; generated code and the runtime are not counted). The
parameters, replicated on every device, enter twice, as an argument and as their gradient (an
output): `params` is their bytes, and activation = footprint - 2 x params.

Communication: textattn/benchmark/collectives.py (HLO operand bytes and the stated formulas).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from textattn import attention, flax_layers, sharding
from textattn.attention import sequence
from textattn.benchmark import collectives
from textattn.models.layers import DTYPES


def layer_module(name: str, mesh: jax.sharding.Mesh, heads: int, dtype: str = "float32",
                 always_sharded: bool = False):
  """The layer a run on `mesh` gets (`sequence.build`: the registry's one-device module, its
  reference implementation, when the sequence axis has one device), or with always_sharded the sequence-sharded module even then
  (S = 1: the same shard_map program on one device)."""
  variant = attention.get(name)
  kwargs = {"num_heads": heads, "implementation": variant.reference, "dtype": DTYPES[dtype],
            "name": "attention"}
  if always_sharded:
    return variant.shard(mesh=mesh, **kwargs)
  return sequence.build(variant, mesh, **kwargs)


def compile_layer(module, mesh: jax.sharding.Mesh, batch: int, length: int, embed: int,
                  dtype: str = "float32") -> tuple[Any, int]:
  """jit(value_and_grad(sum(module(x) * cotangent))) compiled for abstract inputs on `mesh`:
  (the compiled program, the parameter count)."""
  tokens = sharding.length_sharding(mesh, 3)
  x = jax.ShapeDtypeStruct((batch, length, embed), DTYPES[dtype], sharding=tokens)
  mask = jax.ShapeDtypeStruct((batch, length), jnp.bool_,
                              sharding=sharding.length_sharding(mesh, 2))
  shards = sharding.sequence_size(mesh)
  rows = mesh.devices.size // shards  # one row per data shard: the sharded module splits it
  small = (jnp.zeros((rows, 2 * shards, embed), DTYPES[dtype]),
           jnp.ones((rows, 2 * shards), bool))
  param_shapes = jax.eval_shape(module.init, jax.random.key(0), *small)
  replicated = jax.NamedSharding(mesh, jax.P())
  params = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=replicated),
                        param_shapes)
  param_count = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))

  def loss(params, x, mask, cotangent):
    return jnp.sum((module.apply(params, x, mask) * cotangent).astype(jnp.float32))

  compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(params, x, mask,
                                                                     x).compile()
  return compiled, param_count


def footprint_bytes(compiled) -> int:
  """argument + output + temp - alias bytes of `compiled.memory_analysis()`, per device."""
  memory = compiled.memory_analysis()
  return int(memory.argument_size_in_bytes + memory.output_size_in_bytes
             + memory.temp_size_in_bytes - memory.alias_size_in_bytes)


def layer_cost(name: str, mesh: jax.sharding.Mesh, batch: int, length: int, embed: int,
               heads: int, dtype: str = "float32", always_sharded: bool = False,
               communication: bool = True) -> dict:
  """Memory (bytes per device) and, with `communication`, collective bytes (HLO and formula) of
  one layer of `name` on `mesh`; see the module docstring for the definitions."""
  module = layer_module(name, mesh, heads, dtype, always_sharded)
  compiled, param_count = compile_layer(module, mesh, batch, length, embed, dtype)
  footprint = footprint_bytes(compiled)
  param_bytes = 4 * param_count  # float32 parameters (the modules' param_dtype)
  shards = sharding.sequence_size(mesh)
  row = {"variant": name, "D": int(mesh.devices.size // shards), "S": shards, "length": length,
         "batch": batch, "embed": embed, "heads": heads, "dtype": dtype,
         "footprint": footprint, "params": param_bytes,
         "activation": footprint - 2 * param_bytes,
         "temp": int(compiled.memory_analysis().temp_size_in_bytes)}
  if communication:
    comm = collectives.collective_bytes(compiled.as_text(), shards)
    row.update(comm=comm, comm_total=sum(comm.values()), comm_formula=collectives.formula(
        name, batch // row["D"], length, heads, embed // heads, shards, param_count, dtype,
        data=row["D"], merged_projections=flax_layers.contracts_merged_axes()))
  return row
