"""The device mesh of a sequence-parallel run: a "data" axis (the batch) beside a "sequence"
axis (the length), and the checks a length must pass before it is split along the second.

    mesh = sharding.make_mesh(data=2, sequence=4)          # 8 devices: 2 x 4
    x = jax.device_put(x, sharding.length_sharding(mesh, x.ndim))   # [batch, length, ...]

Per-token layers (projections, FFN, norms) need nothing more: XLA keeps a length-sharded array
sharded through them. Attention, which mixes positions, runs under `jax.shard_map` along the
sequence axis (textattn/attention/sequence.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax

from textattn.errors import UsageError

DATA = "data"
SEQUENCE = "sequence"


def make_mesh(data: int = 1, sequence: int = 1,
              devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
  """A (data, sequence) mesh over the first data * sequence devices (or `devices`)."""
  if devices is None:
    if data * sequence > jax.device_count():
      raise UsageError(f"a mesh of data={data} x sequence={sequence} needs {data * sequence} "
                       f"devices, and this run has {jax.device_count()}.")
    devices = jax.devices()[:data * sequence]
  auto = jax.sharding.AxisType.Auto
  return jax.make_mesh((data, sequence), (DATA, SEQUENCE), axis_types=(auto, auto),
                       devices=devices)


def sequence_size(mesh: jax.sharding.Mesh | None) -> int:
  """How many shards the length is split into (1 without a mesh or a sequence axis)."""
  if mesh is None or SEQUENCE not in mesh.axis_names:
    return 1
  return mesh.shape[SEQUENCE]


def data_axis(mesh: jax.sharding.Mesh) -> str | None:
  return DATA if DATA in mesh.axis_names else None


def length_spec(mesh: jax.sharding.Mesh, ndim: int) -> jax.P:
  """[batch, length, ...] split along data and sequence, the rest whole."""
  return jax.P(data_axis(mesh), SEQUENCE, *([None] * (ndim - 2)))


def length_sharding(mesh: jax.sharding.Mesh, ndim: int) -> jax.NamedSharding:
  return jax.NamedSharding(mesh, length_spec(mesh, ndim))


def check_length(length: int, shards: int, multiple: int = 1, why: str = "") -> None:
  """UsageError unless `length` splits into `shards` equal pieces, each a multiple of `multiple`.

  A length is refused rather than padded here: padding belongs to the batch (the runner pads to
  a fixed length anyway), and a silently longer sequence would change what positions mean."""
  if length % (shards * multiple):
    unit = f"{shards} x {multiple} = {shards * multiple}" if multiple > 1 else str(shards)
    raise UsageError(f"a sequence length of {length} cannot be split over {shards} sequence "
                     f"shards{why}: it must be a multiple of {unit}; pad the batch to such a "
                     f"length (config.max_len) or choose another mesh.sequence.")
