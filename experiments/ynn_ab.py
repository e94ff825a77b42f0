"""XLA:CPU's YNNPACK fusion types for the seed model's train step, compared in one process.

XLA:CPU rewrites every reduction over more than 32 elements into a tree of `reduce-window` ops
(TreeReductionRewriter) unless YNNPACK takes the reduction. In the seed step that is 18 ops per
step: the bias and LayerNorm gradients (sums over batch x positions). With
`--xla_cpu_experimental_ynn_fusion_type=` (the seed config's flag: no YNNPACK fusions) all 18
remain; with LIBRARY_FUSION_TYPE_REDUCE only YNNPACK's reductions are used, 3 remain.
Each variant is the same jitted train step compiled with other `compiler_options`; they run in
interleaved rounds (median of rounds of 40 steps) so they share the machine's load.

    python experiments/ynn_ab.py softmax native [rounds]
    python experiments/ynn_ab.py additive fused [rounds]
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

from textattn import train

VARIANTS = {
    "none": "",  # the seed config's flag: no YNNPACK fusions
    "reduce": "LIBRARY_FUSION_TYPE_REDUCE",
    "default": None,  # XLA's default set
}


def main():
  attention = sys.argv[1] if len(sys.argv) > 1 else "softmax"
  kernel = sys.argv[2] if len(sys.argv) > 2 else "native"
  rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 7
  batch = random_batch()
  _, state0 = seed_step(attention, kernel, "hash")
  entries = {}
  for name, value in VARIANTS.items():
    options = {} if value is None else {
        "compiler_options": {"xla_cpu_experimental_ynn_fusion_type": value}}
    step = jax.jit(train.train_step, donate_argnums=0, **options)
    hlo = step.lower(state0, batch).compile().as_text()
    print(f"{name:8s} reduce-window ops: {hlo.count('reduce-window(')}, "
          f"YNNPACK fusions: {hlo.count('kind=kCustom, calls=%ynn')}")
    _, state = seed_step(attention, kernel, "hash")
    state, _ = run_steps(step, state, batch, 10)  # warm-up
    entries[name] = [step, state]
  print_rounds(interleaved_rounds(entries, batch, rounds))


if __name__ == "__main__":
  main()
