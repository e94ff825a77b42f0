"""A/B of the seed model's full train step (forward, backward, Adam) across the speed changes.

Builds each variant once, warms it up, then times interleaved rounds of 40 steps (median of 5
rounds), so every variant sees the same machine load. Batch 32 x length 200 with random
lengths 50..200, float32.

    python experiments/speed_ab.py
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np

from configs import imdb_keras_example
from textattn import models, train

VARIANTS = [  # (attention, softmax kernel, dropout bits)
    ("softmax", "xla", "threefry"),
    ("softmax", "fused", "threefry"),
    ("softmax", "fused", "hash"),
    ("additive", "xla", "threefry"),
    ("additive", "xla", "hash"),
]


def random_batch(seed=0):
  """Batch 32 x length 200, random lengths 50..200 (right padding), random ids and labels."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(50, 201, 32)
  tokens = np.where(np.arange(200)[None] < lengths[:, None], rng.integers(2, 20000, (32, 200)), 0)
  return {"inputs": jnp.asarray(tokens, jnp.int32),
          "labels": jnp.asarray(rng.integers(0, 2, 32), jnp.int32)}


def seed_step(attention="softmax", kernel="fused", dropout_rng="hash", embedding_update="dense"):
  """(jitted train_step with the state donated, initial state) of the seed model's config."""
  config = imdb_keras_example.get_config()
  config.model.update(attention=attention, attention_impl=kernel, dropout_rng=dropout_rng)
  config.optimizer.embedding_update = embedding_update
  model = models.build_model(config, 2)
  tx = train.make_optimizer(config.optimizer, 1000)

  state = jax.jit(lambda key: train.init_train_state(model, tx, key, 200, config.optimizer))(
      jax.random.key(0))
  return jax.jit(train.train_step, donate_argnums=0), state


def config_step(config, min_length: int, full_first: bool = False):
  """(initial state, batch) of a config's model, batch size and max_len: lengths uniform in
  [min_length, max_len] (example 0 full if `full_first`), ids uniform in [2, vocab_size)."""
  model = models.build_model(config, 2)
  tx = train.make_optimizer(config.optimizer, 1000)
  state = jax.jit(lambda key: train.init_train_state(model, tx, key, config.max_len,
                                                     config.optimizer))(jax.random.key(0))
  rng = np.random.default_rng(0)
  length, size = config.max_len, config.batch_size
  lengths = rng.integers(min_length, length + 1, size)
  if full_first:
    lengths[0] = length
  tokens = np.where(np.arange(length)[None] < lengths[:, None],
                    rng.integers(2, config.vocab_size, (size, length)), 0)
  return state, {"inputs": jnp.asarray(tokens, jnp.int32),
                 "labels": jnp.asarray(rng.integers(0, 2, size), jnp.int32)}


def run_steps(step, state, batch, count):
  """`count` calls of step(state, batch) (state donated); returns (state, seconds per call)."""
  start = time.perf_counter()
  for _ in range(count):
    state, _ = step(state, batch)
  jax.block_until_ready(state)
  return state, (time.perf_counter() - start) / count


def print_rounds(times, batch_size=32):
  """One line per entry of interleaved_rounds' result: median ms/step, examples/s, the rounds."""
  for name, values in times.items():
    t = float(np.median(values))
    print(f"{name:7s} {t * 1e3:6.2f} ms/step {batch_size / t:6.0f} examples/s "
          f"(rounds: {' '.join(f'{v * 1e3:.1f}' for v in values)})")


def interleaved_rounds(entries, batch, rounds, count=40):
  """{key: [step, state]} (states updated in place) -> {key: [seconds per step of each round]};
  every round runs `count` steps of each entry in turn, so all see the same machine load."""
  times = {key: [] for key in entries}
  for _ in range(rounds):
    for key, entry in entries.items():
      entry[1], seconds = run_steps(entry[0], entry[1], batch, count)
      times[key].append(seconds)
  return times


def main():
  batch = random_batch()
  steps = {}
  for attention, kernel, dropout_rng in VARIANTS:
    step, state = seed_step(attention, kernel, dropout_rng)
    state, _ = run_steps(step, state, batch, 10)  # warm-up
    steps[(attention, kernel, dropout_rng)] = [step, state]
  times = interleaved_rounds(steps, batch, 5)
  print(f"load average before/after: {os.getloadavg()[0]:.2f}")
  for (attention, kernel, dropout_rng), values in times.items():
    t = float(np.median(values))
    print(f"{attention:8s} kernel={kernel:6s} dropout={dropout_rng:8s} "
          f"{t * 1e3:6.1f} ms/step {32 / t:6.0f} examples/s")


if __name__ == "__main__":
  main()
