"""Cost of a masked-language-model pretraining step against a classification step, for a
config's model (random ids, lengths log-normal around 180, batch 32).

    python experiments/mlm_step_cost.py imdb_fastformer 32   # config module, max_predictions
"""
import functools
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, ".")
import importlib

from textattn import models, pretrain, train

name = sys.argv[1]; K = int(sys.argv[2])
config = importlib.import_module(f"configs.{name}").get_config()
model = models.build_model(config, 2, 20000)
tx = train.make_optimizer(config.optimizer, 1000)
L = config.max_len
def init(rng):
  params = model.init({"params": rng}, jnp.ones((1, L), jnp.int32), mlm_positions=jnp.zeros((1, K), jnp.int32), mask_input=jnp.zeros((1, L), bool))["params"]
  return train.TrainState.create(apply_fn=model.apply, params=params, tx=tx, dropout_key=jax.random.key_data(jax.random.key(1)))
state = jax.jit(init)(jax.random.key(0))
rng = np.random.default_rng(0)
lens = np.minimum(rng.lognormal(np.log(180), 0.7, 4096).astype(int) + 10, L)
def batch():
  b = np.zeros((32, L), np.int32)
  for i, n in enumerate(rng.choice(lens, 32)): b[i, :n] = rng.integers(2, 20000, n)
  return {"inputs": b}
opts = train.step_compiler_options(config)
step = jax.jit(functools.partial(pretrain.mlm_train_step, mask_rate=0.15, max_predictions=K, vocab_size=20000), donate_argnums=0, compiler_options=opts)
cls = jax.jit(train.train_step, donate_argnums=0, compiler_options=opts)
bs = [batch() for _ in range(8)]
state, m = step(state, bs[0]); jax.block_until_ready(m)
for r in range(3):
  t = time.perf_counter()
  for b in bs: state, m = step(state, b)
  jax.block_until_ready(m); print("mlm", (time.perf_counter() - t) / len(bs) * 1000, "ms", float(m["loss_sum"]/m["count"]), flush=True)
params = model.init({"params": jax.random.key(0)}, jnp.ones((1, L), jnp.int32))["params"]
st2 = train.TrainState.create(apply_fn=model.apply, params=params, tx=tx, dropout_key=jax.random.key_data(jax.random.key(1)))
for b in bs: b["labels"] = np.zeros(32, np.int32)
st2, m = cls(st2, bs[0]); jax.block_until_ready(m)
for r in range(2):
  t = time.perf_counter()
  for b in bs: st2, m = cls(st2, b)
  jax.block_until_ready(m); print("cls", (time.perf_counter() - t) / len(bs) * 1000, "ms", flush=True)
