"""Dispatch overhead of one jitted call carrying the seed model's train state (a no-op step).

    python experiments/dispatch_overhead.py
"""

import time

import jax
import jax.numpy as jnp
from speed_ab import random_batch, seed_step


def main():
  _, state = seed_step("additive")
  batch = random_batch()
  noop = jax.jit(lambda s, b: (s.replace(step=s.step + 1), jnp.sum(b["labels"])),
                 donate_argnums=0)
  for _ in range(50):
    state, _ = noop(state, batch)
  jax.block_until_ready(state)
  start = time.perf_counter()
  for _ in range(500):
    state, _ = noop(state, batch)
  jax.block_until_ready(state)
  print(f"no-op call with the train state ({len(jax.tree.leaves(state))} leaves): "
        f"{(time.perf_counter() - start) / 500 * 1e3:.3f} ms")


if __name__ == "__main__":
  main()
