"""Dispatch overhead of one jitted call carrying the seed model's train state (a no-op step).

    python experiments/dispatch_overhead.py
"""

import jax
import jax.numpy as jnp
from speed_ab import random_batch, run_steps, seed_step


def main():
  _, state = seed_step("additive")
  batch = random_batch()
  noop = jax.jit(lambda s, b: (s.replace(step=s.step + 1), jnp.sum(b["labels"])),
                 donate_argnums=0)
  state, _ = run_steps(noop, state, batch, 50)  # warm-up
  state, seconds = run_steps(noop, state, batch, 500)
  print(f"no-op call with the train state ({len(jax.tree.leaves(state))} leaves): "
        f"{seconds * 1e3:.3f} ms")


if __name__ == "__main__":
  main()
