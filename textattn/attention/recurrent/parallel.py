"""Sequence parallelism for the linear recurrences: the length split into contiguous shards over
a mesh's "sequence" axis (and its rows over "data"), exact against one device.

A shard's effect on the state is affine: S_out = M S_in + S_local, with S_local its final state
from a zero state and M its transition (the gated core: the product of its decays, a scalar or a
diagonal per head; causal linear attention: the identity; the delta rule: a key x key matrix,
recurrent/delta_rule.py). Each shard computes its pair without communication (the core's
chunked form from a zero state; its outputs are not needed, and XLA drops them); one all_gather
of the pairs lets every shard compose those before it in order (an exclusive scan over S shards,
O(S) states each); each shard then runs its chunked form from that incoming state. Documents:
run numbers are counted over the whole row before the split; a shard whose first real token
starts a new document takes a zero state instead, and a shard holding a document start has
M = 0 (its final state does not depend on what came in).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from textattn import sharding
from textattn.attention.recurrent.chunking import document_runs

Array = jax.Array
SEQUENCE = sharding.SEQUENCE


def shard_over_sequence(core: Callable, mesh: jax.sharding.Mesh, arrays: tuple[Array, ...],
                        out_ndim: int) -> Array:
  """core(*arrays) under shard_map: every array [batch, length, ...] split along (data,
  sequence); its one output [batch, length, ...] split the same way."""
  spec = lambda ndim: sharding.length_spec(mesh, ndim)
  return jax.shard_map(core, mesh=mesh, in_specs=tuple(spec(a.ndim) for a in arrays),
                       out_specs=spec(out_ndim))(*arrays)


def incoming_state(local: Array, first_run: Array, last_run: Array, transition: Array,
                   apply: Callable[[Array, Array], Array] = jnp.multiply,
                   initial: Array | None = None) -> Array:
  """This shard's incoming state (inside shard_map): the exclusive scan over the shards of
  S_in(j) = [first_run(j) == last_run(j - 1)] (M(j - 1) S_in(j - 1) + S_local(j - 1)),
  S_in(0) = `initial` (None: zeros), where apply(M, S) is M S (broadcast elementwise for the
  gated core's decays; a matrix product for the delta rule's transitions)."""
  every = jax.lax.all_gather((transition, local, first_run, last_run), SEQUENCE)
  me = jax.lax.axis_index(SEQUENCE)
  state = mine = jnp.zeros_like(local) if initial is None else initial
  for j in range(1, every[1].shape[0]):
    continues = every[2][j] == every[3][j - 1]  # [batch]
    carried = apply(every[0][j - 1], state) + every[1][j - 1]
    state = jnp.where(continues.reshape((-1,) + (1,) * (local.ndim - 1)), carried, 0.0)
    mine = jnp.where(me == j, state, mine)
  return mine


def shard_edges(real: Array, ids: Array) -> tuple[Array, Array, Array]:
  """(first_run [b], last_run [b], local_single bool [b]) of a shard: the global run of its first
  real position (of its first position if none is real), of its last position, and whether the
  whole shard is one run (no document starts inside it)."""
  first_real = jnp.argmax(real, axis=1)
  first_run = jnp.take_along_axis(ids, first_real[:, None], axis=1)[:, 0]
  _, local_runs = document_runs(real, ids, real.shape)
  return first_run, ids[:, -1], local_runs[:, -1] == 0
