"""A/B of the softmax kernels in the seed model's full train step: "fused" (XLA, textattn's
previous default) against "native" (the C++ XLA FFI kernel, textattn/native/). Interleaved
rounds of 40 steps (median of 7), so both see the same machine load; batch 32 x length 200 with
random lengths 50..200 (speed_ab.random_batch), float32, one device. With --profile, also a
jax.profiler trace of 20 native steps: the ops by total time.

    python experiments/native_ab.py [--profile]

(The 2-device figures in RESULTS.md were taken with `python experiments/native_ab.py 2` before
textattn refused the native kernel with several devices; that argument now stops with that
refusal.)
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax

args = [a for a in sys.argv[1:] if not a.startswith("--")]
if args:
  jax.config.update("jax_num_cpu_devices", int(args[0]))

from profile_step import profile_and_summarize
from speed_ab import (
  interleaved_rounds,
  print_rounds,
  random_batch,
  run_steps,
  seed_step,
)

from textattn import train


def main():
  data_sharding, replicated = train.data_parallel_shardings()
  batch = jax.device_put(random_batch(), data_sharding)
  entries = {}
  for kernel in ("fused", "native"):
    step, state = seed_step("softmax", kernel, "hash")
    state = jax.device_put(state, replicated)
    state, _ = run_steps(step, state, batch, 10)
    entries[kernel] = [step, state]
  times = interleaved_rounds(entries, batch, 7)
  print(f"{jax.device_count()} device(s), load average {os.getloadavg()[0]:.2f}")
  print_rounds(times)
  if "--profile" in sys.argv:
    profile_and_summarize(*entries["native"], batch, "/tmp/prof/native_ab", top=30)


if __name__ == "__main__":
  main()
