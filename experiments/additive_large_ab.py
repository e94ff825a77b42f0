"""The native additive kernel against the XLA function at the sequence-length benchmark's model
size (embed 256, 4 heads of 64, 1 layer, vocabulary 1,000, batch B, length L; lengths uniform in
[L/2, L], example 0 full): the full train step of each, interleaved rounds of 5 steps.

    python experiments/additive_large_ab.py 1024 4
"""

import sys

import jax
from speed_ab import config_step, interleaved_rounds, print_rounds, run_steps

from configs import default
from textattn import train


def main():
  length, size = int(sys.argv[1]), int(sys.argv[2])
  entries, batch = {}, None
  for impl in ("xla", "native"):
    config = default.get_config()
    config.vocab_size, config.max_len, config.batch_size = 1000, length, size
    config.model.update(attention="additive", attention_impl=impl, embed_dim=256, num_heads=4,
                        num_layers=1)
    state, batch = config_step(config, length // 2, full_first=True)
    step = jax.jit(train.train_step, donate_argnums=0)
    state, _ = run_steps(step, state, batch, 3)  # warm-up
    entries[impl] = [step, state]
  print_rounds(interleaved_rounds(entries, batch, 7, count=5), batch_size=size)


if __name__ == "__main__":
  main()
