"""Median ms/step of the seed model's train step (speed_ab.seed_step, one device, lengths
50..200, 5 rounds of 40 steps after 20 warm-up) under whatever XLA_FLAGS the process was started
with; alternate runs to compare flags (they are read when jax is imported):

    for r in 1 2 3 4; do
      python experiments/xla_flag_ab.py softmax native
      XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= python experiments/xla_flag_ab.py softmax native
    done
"""

import os
import sys

import numpy as np
from speed_ab import random_batch, run_steps, seed_step


def main():
  attention = sys.argv[1] if len(sys.argv) > 1 else "softmax"
  kernel = sys.argv[2] if len(sys.argv) > 2 else "native"
  step, state = seed_step(attention, kernel, "hash")
  batch = random_batch()
  state, _ = run_steps(step, state, batch, 20)
  times = []
  for _ in range(5):
    state, seconds = run_steps(step, state, batch, 40)
    times.append(seconds)
  t = float(np.median(times))
  print(f"{os.environ.get('XLA_FLAGS', 'default')} {attention}/{kernel}: {t * 1e3:.2f} ms/step "
        f"{32 / t:.0f} examples/s")


if __name__ == "__main__":
  main()
