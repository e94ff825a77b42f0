"""A peer row for the GPU script (experiments/gpu/accelerators.sh part 5): jax-linear-attention's
Pallas Mosaic GPU kernels (Hopper only) for GLA and Gated DeltaNet, forward and backward, at the
shape the additive core is timed at ([4, 16384, 4 heads, 64] in bfloat16; value dim 64), so
a linear-time family with a maintained GPU kernel stands beside textattn's.

  PYTHONPATH=/tmp/peer_site python experiments/gpu/peer.py OUT_DIR [--rehearse]

It imports nothing of textattn: jax-linear-attention is never textattn's dependency. Its wheel
is brought by experiments/gpu/prepare_peer.sh into .peer/ (gitignored, carried to the GPU
machine) and installed by accelerators.sh into a site folder of its own, without its
dependencies (its kernels need only jax and numpy, which the machine has). It pins one JAX
(jax-linear-attention 0.1.0: jax==0.11.2); where the machine's differs the row says so and
nothing runs (a virtual environment with that JAX would need its CUDA wheels, far over what a
device call carries). Timed as experiments/gpu/kernels.py times a point: jit of value_and_grad,
2 warm-up calls, median of 10. --rehearse (a CPU): GLA at a toy size through the package's
chunked XLA form (its "mosaic_gpu" kernels need a Hopper GPU).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

PACKAGE = "jax-linear-attention"


def pinned_jax() -> str | None:
  """The JAX version the installed package pins (its Requires-Dist jax==X), or None."""
  for requirement in importlib.metadata.requires(PACKAGE) or ():
    match = re.fullmatch(r"jax\s*==\s*([\w.]+)", requirement.split(";")[0].strip())
    if match:
      return match.group(1)
  return None


def inputs(kind: str, batch: int, length: int, heads: int, head_dim: int):
  keys = jax.random.split(jax.random.key(0), 6)
  q, k, v = (jax.random.normal(key, (batch, length, heads, head_dim), jnp.bfloat16)
             for key in keys[:3])
  if kind == "gla":  # a log-decay per key channel
    g = jax.nn.log_sigmoid(jax.random.normal(keys[3], q.shape) + 4.0).astype(jnp.bfloat16)
    return (q, k, v), {"g": g}
  g = jax.nn.log_sigmoid(jax.random.normal(keys[3], q.shape[:3]) + 4.0)  # one per head
  beta = jax.nn.sigmoid(jax.random.normal(keys[4], q.shape[:3]))
  k = k / jnp.linalg.norm(k.astype(jnp.float32), axis=-1, keepdims=True).astype(k.dtype)
  return (q, k, v), {"g": g, "beta": beta}


def time_kind(kind: str, implementation: str, shape, repeats: int) -> dict:
  from jla.ops import linear_attention  # (the package under test, from its own site folder)
  (q, k, v), gates = inputs(kind, *shape)
  names = tuple(gates)

  def loss(q, k, v, *gate_values):
    out, _ = linear_attention(kind, q, k, v, impl=implementation,
                              **dict(zip(names, gate_values)))
    return jnp.sum(out.astype(jnp.float32) ** 2)

  step = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(3 + len(names)))))
  args = (q, k, v, *gates.values())
  start = time.perf_counter()
  compiled = step.lower(*args).compile()
  compile_s = time.perf_counter() - start
  for _ in range(2):
    jax.block_until_ready(compiled(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - start)
  return {"compile_s": compile_s, "median_ms": float(np.median(times)) * 1e3}


def main(argv: list[str]) -> int:
  if not argv:
    raise SystemExit(__doc__)
  out_dir, rehearse = argv[0], "--rehearse" in argv
  os.makedirs(out_dir, exist_ok=True)
  rows = []
  try:
    version = importlib.metadata.version(PACKAGE)
  except importlib.metadata.PackageNotFoundError:
    print(f"peer: skipped: {PACKAGE} is not installed (bash experiments/gpu/prepare_peer.sh "
          f"puts its wheel in .peer/; carry .peer)")
    return 0
  pin = pinned_jax()
  device = jax.devices()[0]
  print(f"peer: {PACKAGE} {version} (pins jax {pin}); jax {jax.__version__} on "
        f"{device.device_kind}")
  if pin and pin != jax.__version__ and not rehearse:
    print(f"peer: skipped: it pins jax {pin}, this machine has {jax.__version__} (a virtual "
          f"environment with that JAX needs its CUDA wheels, beyond a device call's carry)")
    return 0
  shape = (1, 64, 1, 64) if rehearse else (4, 16384, 4, 64)
  implementation = "chunked" if rehearse else "mosaic_gpu"
  for kind in ("gla",) if rehearse else ("gla", "gated_deltanet"):
    row = {"peer": f"{PACKAGE} {version}", "kind": kind, "implementation": implementation,
           "shape": list(shape), "dtype": "bfloat16", "device": device.device_kind}
    try:
      row.update(time_kind(kind, implementation, shape, 2 if rehearse else 10), status="ok")
    except Exception as error:  # noqa: BLE001 -- a kernel that does not run here is a result
      row.update(status="error", message=" ".join(f"{type(error).__name__}: {error}".split())[:300])
    rows.append(row)
    print("peer: " + json.dumps(row), flush=True)
  with open(os.path.join(out_dir, "peer.json"), "w") as f:
    json.dump(rows, f, indent=1)
  return 0 if all(row["status"] == "ok" for row in rows) else 1


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
