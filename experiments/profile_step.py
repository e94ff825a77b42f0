"""Profile the seed model's default train step: ms/step, then the ops of a 20-step jax.profiler
trace by total time; the trace and the optimised HLO (to name the fusions) go to /tmp/prof.

    taskset -c 0 python experiments/profile_step.py softmax     # or additive; UPD=lazy env var
"""

import os, sys, time, glob, gzip, json, collections
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jax, jax.numpy as jnp, numpy as np
from configs import imdb_keras_example
from textattn import models, train
attention = sys.argv[1] if len(sys.argv) > 1 else "softmax"
rng = np.random.default_rng(0)
lengths = rng.integers(50, 201, 32)
tokens = np.where(np.arange(200)[None] < lengths[:, None], rng.integers(2, 20000, (32, 200)), 0)
batch = {"inputs": jnp.asarray(tokens, jnp.int32), "labels": jnp.asarray(rng.integers(0, 2, 32), jnp.int32)}
config = imdb_keras_example.get_config()
config.model.attention = attention
config.optimizer.embedding_update = os.environ.get("UPD", "dense")
model = models.build_model(config, 2)
tx = train.make_optimizer(config.optimizer, 1000)
def init(key):
  params = model.init(key, jnp.ones((1, 200), jnp.int32))["params"]
  return train.TrainState.create(apply_fn=model.apply, params=params, tx=tx, dropout_key=jax.random.key_data(key))
state = jax.jit(init)(jax.random.key(0))
step = jax.jit(train.train_step, donate_argnums=0)
for _ in range(20): state, _ = step(state, batch)
jax.block_until_ready(state)
t=time.perf_counter()
for _ in range(50): state, _ = step(state, batch)
jax.block_until_ready(state); dt=(time.perf_counter()-t)/50
print(f"{dt*1e3:.1f} ms/step {32/dt:.0f} ex/s")
os.makedirs("/tmp/prof", exist_ok=True)
d = "/tmp/prof/trace_"+attention
os.system(f"rm -rf {d}")
with jax.profiler.trace(d, create_perfetto_trace=True):
  for _ in range(20): state, _ = step(state, batch)
  jax.block_until_ready(state)
f = glob.glob(d+"/**/*.trace.json.gz", recursive=True)[0]
tr = json.load(gzip.open(f))
ev = [e for e in tr["traceEvents"] if e.get("ph")=="X"]
tot = collections.Counter(); 
for e in ev: tot[e["name"]] += e["dur"]
for k,v in tot.most_common(45): print(f"{v/20/1e3:8.3f} ms  {k[:100]}")
open(f"/tmp/prof/hlo_{attention}.txt","w").write(step.lower(state,batch).compile().as_text())
