"""The seed model with additive attention: the XLA function against the native C++ kernel, in
the full train step (speed_ab.seed_step: batch 32 x 200, lengths 50..200, dropout, Adam), each
compiled with and without the seed config's XLA flag (no YNNPACK fusions); interleaved rounds
of 40 steps in one process, so every variant sees the same machine load.

    python experiments/additive_native_ab.py [rounds]
"""

import sys

import jax
from speed_ab import (
  interleaved_rounds,
  print_rounds,
  random_batch,
  run_steps,
  seed_step,
)

from configs import imdb_keras_example
from textattn import train


def main():
  rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
  flag = imdb_keras_example.get_config().xla_flags  # "--xla_cpu_experimental_ynn_fusion_type="
  name, value = flag.lstrip("-").split("=", 1)
  batch = random_batch()
  entries = {}
  for kernel in ("xla", "native"):
    for label, options in (("flag", {name: value}), ("noflag", {})):
      _, state = seed_step("additive", kernel, "hash")
      step = jax.jit(train.train_step, donate_argnums=0, compiler_options=options or None)
      state, _ = run_steps(step, state, batch, 10)  # warm-up (and compilation)
      entries[f"{kernel}/{label}"] = [step, state]
  print_rounds(interleaved_rounds(entries, batch, rounds))


if __name__ == "__main__":
  main()
