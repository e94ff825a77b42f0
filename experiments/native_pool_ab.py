"""The native kernels' workers: std::threads started per call ("own") against XLA's intra-op
thread pool ("xla", attention.NATIVE_WORKERS), in the seed config's full train step (batch 32 x
200, lengths uniform in [100, 200] as the benchmark's batch, softmax and additive attention,
the config's XLA flags); interleaved rounds of 40 steps in one process, so every variant sees
the same machine load.

    python experiments/native_pool_ab.py [rounds]
"""

import sys

import jax
from speed_ab import config_step, interleaved_rounds, print_rounds, run_steps

from configs import imdb_keras_example
from textattn import attention, train


def main():
  rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
  for kind in ("softmax", "additive"):
    config = imdb_keras_example.get_config()
    config.model.attention = kind
    entries, batch = {}, None
    for workers in ("own", "xla"):
      attention.NATIVE_WORKERS = workers  # read when the step is traced (its first call)
      state, batch = config_step(config, 100)
      step = jax.jit(train.train_step, donate_argnums=0,
                     compiler_options=train.step_compiler_options(config))
      state, _ = run_steps(step, state, batch, 10)  # warm-up (and compilation)
      entries[f"{kind[:3]}/{workers}"] = [step, state]
    print_rounds(interleaved_rounds(entries, batch, rounds))


if __name__ == "__main__":
  main()
