"""Dispatch overhead of one jitted call carrying the seed model's train state (a no-op step).

    python experiments/dispatch_overhead.py
"""

import os
import sys, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jax, jax.numpy as jnp, numpy as np
from configs import imdb_keras_example
from textattn import models, train
config = imdb_keras_example.get_config(); config.model.attention = "additive"
model = models.build_model(config, 2)
tx = train.make_optimizer(config.optimizer, 1000)
def init(key):
  params = model.init(key, jnp.ones((1, 200), jnp.int32))["params"]
  return train.TrainState.create(apply_fn=model.apply, params=params, tx=tx, dropout_key=jax.random.key_data(key))
state = jax.jit(init)(jax.random.key(0))
batch = {"inputs": jnp.ones((32, 200), jnp.int32), "labels": jnp.zeros((32,), jnp.int32)}
noop = jax.jit(lambda s, b: (s.replace(step=s.step + 1), jnp.sum(b["labels"])), donate_argnums=0)
for _ in range(50): state, m = noop(state, batch)
jax.block_until_ready(state)
t = time.perf_counter()
for _ in range(500): state, m = noop(state, batch)
jax.block_until_ready(state)
print("noop step with state pytree: %.3f ms" % ((time.perf_counter() - t) / 500 * 1e3))
print("leaves:", len(jax.tree.leaves(state)))
