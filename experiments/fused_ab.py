"""A/B of the fused softmax kernel's forward inside the seed model's full train step.

"rowsum": textattn's forward (row sums of the unnormalised weights by a separate reduction);
"augV": row sums from P.[V, 1] (experiments/kernel_ab.py; one pass fewer over the weights, 6-15%
faster for the kernel alone on a quiet machine). Same backward. Interleaved rounds of 40 steps
(median of 7), so both see the same machine load; batch 32 x length 200 with random lengths,
float32. Result (experiments/RESULTS.md): no measurable difference in the full step, so
textattn keeps "rowsum".

    python experiments/fused_ab.py [NUM_CPU_DEVICES]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax

if len(sys.argv) > 1:
  jax.config.update("jax_num_cpu_devices", int(sys.argv[1]))

from kernel_ab import forward_augmented_v
from speed_ab import (
  interleaved_rounds,
  print_rounds,
  random_batch,
  run_steps,
  seed_step,
)

from textattn import attention, train


def main():
  data_sharding, replicated = train.data_parallel_shardings()
  batch = jax.device_put(random_batch(), data_sharding)
  augv_core = jax.custom_vjp(attention._fused_core.fun, nondiff_argnums=(4,))
  augv_core.defvjp(forward_augmented_v, attention._fused_backward)
  cores = {"rowsum": attention._fused_core, "augV": augv_core}
  entries = {}
  for name, core in cores.items():
    attention._fused_core = core  # read when the step is traced (first call below)
    step, state = seed_step("softmax", "fused", "hash")
    state = jax.device_put(state, replicated)
    state, _ = run_steps(step, state, batch, 10)
    entries[name] = [step, state]
  attention._fused_core = cores["rowsum"]
  times = interleaved_rounds(entries, batch, 7)
  print(f"{jax.device_count()} device(s), load average {os.getloadavg()[0]:.2f}")
  print_rounds(times)


if __name__ == "__main__":
  main()
