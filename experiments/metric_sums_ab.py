"""train_step's per-step metric reductions (gradient norm, count of non-finite parameters):
jnp.sum (XLA:CPU turns each long one into a reduce-window tree) against train._sum_all (sums of
32 consecutive elements), in the seed model's full train step; both compiled in one process
and timed in interleaved rounds of 40 steps.

    python experiments/metric_sums_ab.py softmax|additive [rounds]
"""

import sys
from unittest import mock

import jax
import jax.numpy as jnp
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
  attention = sys.argv[1] if len(sys.argv) > 1 else "softmax"
  rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 9
  name, value = imdb_keras_example.get_config().xla_flags.lstrip("-").split("=", 1)
  batch = random_batch()
  entries = {}
  for label, sum_all in (("jnp.sum", jnp.sum), ("_sum_all", train._sum_all)):
    _, state = seed_step(attention, "native", "hash")
    with mock.patch.object(train, "_sum_all", sum_all):
      step = jax.jit(train.train_step, donate_argnums=0,
                     compiler_options={name: value}).lower(state, batch).compile()
    state, _ = run_steps(step, state, batch, 10)  # warm-up
    entries[label] = [step, state]
  print_rounds(interleaved_rounds(entries, batch, rounds))


if __name__ == "__main__":
  main()
