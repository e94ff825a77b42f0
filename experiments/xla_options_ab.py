"""XLA:CPU compiler options for the seed model's full train step, compared in one process.

Every variant is the same jitted train step compiled with the seed config's option (no
YNNPACK fusions) plus the variant's `name=value` options (`base` adds none; a value "default"
removes the seed config's option); they run in interleaved rounds of 40 steps (5 for a config
file's step), so all see the same machine load. Prints each variant's count of reduce-window
ops (XLA:CPU's slow form of long reductions) and the median ms/step. The step is the seed
model's (speed_ab.seed_step: batch 32 x 200, lengths 50..200, dropout, Adam) with the given
attention and kernel, or a config file's (its model, batch size and max_len; lengths uniform in
[max_len / 4, max_len]; kernel "-" keeps the config's).

    python experiments/xla_options_ab.py softmax native 9 \\
        xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_REDUCE \\
        xla_cpu_experimental_ynn_fusion_type=default
    python experiments/xla_options_ab.py configs/imdb_fastformer.py - 5 \\
        xla_cpu_experimental_ynn_fusion_type=default
"""

import importlib
import sys

import jax
from speed_ab import (
  config_step,
  interleaved_rounds,
  print_rounds,
  random_batch,
  run_steps,
  seed_step,
)

from configs import imdb_keras_example
from textattn import train


def file_config_step(path: str, kernel: str):
  """speed_ab.config_step of a config file (lengths in [max_len / 4, max_len])."""
  config = importlib.import_module(path.removesuffix(".py").replace("/", ".")).get_config()
  if kernel != "-":
    config.model.attention_impl = kernel
  return config_step(config, config.max_len // 4)


def main():
  attention, kernel, rounds, *variants = sys.argv[1:]
  base = dict([imdb_keras_example.get_config().xla_flags.lstrip("-").split("=", 1)])
  from_config = attention.endswith(".py")
  batch = file_config_step(attention, kernel)[1] if from_config else random_batch()
  entries = {}
  for variant in ["base", *variants]:
    options = dict(base)
    if variant != "base":
      name, value = variant.split("=", 1)
      options.pop(name, None)
      if value != "default":
        options[name] = value
    state = (file_config_step(attention, kernel)[0] if from_config
             else seed_step(attention, kernel, "hash")[1])
    step = jax.jit(train.train_step, donate_argnums=0,
                   compiler_options=options or None).lower(state, batch).compile()
    print(f"{variant}: reduce-window ops {step.as_text().count('reduce-window(')}")
    state, _ = run_steps(step, state, batch, 2 if from_config else 10)  # warm-up
    entries[variant] = [step, state]
  print_rounds(interleaved_rounds(entries, batch, int(rounds), count=5 if from_config else 40),
               batch_size=batch["inputs"].shape[0])


if __name__ == "__main__":
  main()
