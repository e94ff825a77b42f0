"""Issues 81 and 83: the linear recurrences' cores, chunked against recurrent, on this machine.

Forward + backward (the gradient of a sum of the outputs with respect to every input) of each
core at batch 4, 4 heads of 64 (keys and values), float32, jitted: the median of --repeats timed
calls after one warm-up, each form alone in turn; and the compiled program's memory (XLA's
temporary buffers plus arguments and outputs, `compiled.memory_analysis()`) at --memory_length,
against causal linear attention's chunked kernel (elu+1 features) at the same shapes.

    python experiments/seq_len/recurrent_cores.py --out=experiments/seq_len/recurrent_cores.json

Cores: "scalar" = the gated core with a decay per head and position (RetNet's and Mamba-2's),
"per_dim" = with a decay per key dimension (GLA's), "delta" = the delta rule (DeltaNet),
"gated_delta" = with decays (Gated DeltaNet).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from experiments.provenance import commit, cpu_name  # noqa: E402
from textattn.attention import linear  # noqa: E402
from textattn.attention.recurrent import delta_rule, gated  # noqa: E402

B, H, D = 4, 4, 64


def inputs(core: str, length: int):
  r = np.random.default_rng(0)
  q, k, v = (jnp.asarray(r.normal(size=(B, length, H, D)), jnp.float32) for _ in range(3))
  if core in ("delta", "gated_delta"):
    k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    beta = jax.nn.sigmoid(jnp.asarray(r.normal(size=(B, length, H)), jnp.float32))
    gates = (-jax.nn.softplus(jnp.asarray(r.normal(size=(B, length, H)), jnp.float32))
             if core == "gated_delta" else None)
    return (q, k, v, beta) + ((gates,) if gates is not None else ())
  if core == "causal_linear":
    return q, k, v
  shape = (B, length, H, D) if core == "per_dim" else (B, length, H)
  return q, k, v, -jax.nn.softplus(jnp.asarray(r.normal(size=shape), jnp.float32))


def function(core: str, form: str):
  if core == "causal_linear":
    real, runs = jnp.ones((B, 1), bool), jnp.zeros((B, 1), jnp.int32)

    def run(q, k, v):
      mask = jnp.broadcast_to(real, q.shape[:2])
      kernel = linear.CAUSAL_KERNELS[form]
      return kernel(linear.elu1(q), linear.elu1(k), v, mask, jnp.broadcast_to(runs, q.shape[:2]))
    return run
  forms = ({"chunked": delta_rule.delta_rule_chunked, "recurrent": delta_rule.delta_rule_recurrent}
           if "delta" in core else
           {"chunked": gated.gated_chunked, "recurrent": gated.gated_recurrent})
  return lambda *args: forms[form](*args)[0]


def forward_backward(core: str, form: str):
  run = function(core, form)
  return jax.jit(jax.grad(lambda *args: jnp.sum(run(*args)), argnums=tuple(range(4))
                          if core != "causal_linear" else (0, 1, 2)))


def timed(core: str, form: str, length: int, repeats: int) -> float:
  args = inputs(core, length)
  step = forward_backward(core, form)
  jax.block_until_ready(step(*args))  # compile and warm up
  times = []
  for _ in range(repeats):
    started = time.perf_counter()
    jax.block_until_ready(step(*args))
    times.append(time.perf_counter() - started)
  return statistics.median(times)


def memory_bytes(core: str, form: str, length: int) -> int:
  args = inputs(core, length)
  analysis = forward_backward(core, form).lower(*args).compile().memory_analysis()
  return int(analysis.temp_size_in_bytes + analysis.argument_size_in_bytes
             + analysis.output_size_in_bytes)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--length", type=int, default=4096)
  parser.add_argument("--memory_length", type=int, default=16384)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--cores", default="scalar,per_dim,delta,gated_delta")
  parser.add_argument("--out", default="")
  args = parser.parse_args()
  rows = []
  for core in args.cores.split(","):
    chunked = timed(core, "chunked", args.length, args.repeats)
    recurrent = timed(core, "recurrent", args.length, args.repeats)
    rows.append({"core": core, "length": args.length, "chunked_s": round(chunked, 4),
                 "recurrent_s": round(recurrent, 4), "speedup": round(recurrent / chunked, 2),
                 "chunked_memory_mib": round(memory_bytes(core, "chunked",
                                                          args.memory_length) / 2**20, 1)})
    print(json.dumps(rows[-1]), flush=True)
  reference = memory_bytes("causal_linear", "chunked", args.memory_length) / 2**20
  for row in rows:
    row["memory_vs_causal_linear"] = round(row["chunked_memory_mib"] / reference, 2)
  result = {"rows": rows, "causal_linear_chunked_memory_mib": round(reference, 1),
            "memory_length": args.memory_length, "batch": B, "heads": H, "head_dim": D,
            "cpu": f"{cpu_name()}, {os.cpu_count()} cores", "jax": jax.__version__,
            "commit": commit(),
            "date": datetime.date.today().isoformat()}
  print(json.dumps(result, indent=1))
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)


if __name__ == "__main__":
  main()
