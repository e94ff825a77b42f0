"""A/B of the fused softmax kernel's forward inside the seed model's full train step.

"rowsum": the forward as it was before 2026-11-22 evening (row sums of the unnormalised weights
by a separate reduction); "augV": textattn's forward now (row sums from P.[V, 1], one pass over
the weights). Same backward. Interleaved rounds of 40 steps (median of 7), so both see the same
machine load; batch 32 x length 200 with random lengths, float32.

    python experiments/fused_ab.py [NUM_CPU_DEVICES]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax

if len(sys.argv) > 1:
  jax.config.update("jax_num_cpu_devices", int(sys.argv[1]))

import jax.numpy as jnp
import numpy as np
from speed_ab import interleaved_rounds, random_batch, run_steps, seed_step

from textattn import attention, train


def forward_rowsum(q, k, v, padding_mask, causal):
  scores = jnp.matmul(q, jnp.swapaxes(k, -1, -2), preferred_element_type=jnp.float32)
  scores = scores + attention._mask_bias(padding_mask, causal, q.shape[2])
  unnormalised = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
  row_sum = jnp.sum(unnormalised, axis=-1, keepdims=True)
  out = jnp.matmul(unnormalised.astype(v.dtype), v, preferred_element_type=jnp.float32) / row_sum
  out = out.astype(v.dtype)
  return out, (q, k, v, unnormalised, row_sum, out)


def main():
  data_sharding, replicated = train.data_parallel_shardings()
  batch = jax.device_put(random_batch(), data_sharding)
  rowsum_core = jax.custom_vjp(attention._fused_core.fun, nondiff_argnums=(4,))
  rowsum_core.defvjp(forward_rowsum, attention._fused_backward)
  cores = {"rowsum": rowsum_core, "augV": attention._fused_core}
  entries = {}
  for name, core in cores.items():
    attention._fused_core = core  # read when the step is traced (first call below)
    step, state = seed_step("softmax", "fused", "hash")
    state = jax.device_put(state, replicated)
    state, _ = run_steps(step, state, batch, 10)
    entries[name] = [step, state]
  attention._fused_core = cores["augV"]
  times = interleaved_rounds(entries, batch, 7)
  print(f"{jax.device_count()} device(s), load average {os.getloadavg()[0]:.2f}")
  for name, values in times.items():
    t = float(np.median(values))
    print(f"{name:7s} {t * 1e3:6.2f} ms/step {32 / t:6.0f} examples/s "
          f"(rounds: {' '.join(f'{v * 1e3:.1f}' for v in values)})")


if __name__ == "__main__":
  main()
