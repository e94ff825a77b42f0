"""One-off probe (2026-11-22 23:32), kept as it ran: experiments/val_sweep.py's run_one (validation only)
with the token table initialised from build_table.py's vectors ("keras": rescaled to the random init's std;
"off": the random init). Usage (one core each):
  taskset -c 0 python experiments/w2v_probe/train_probe.py /tmp/w2v/ff64.npz off configs/imdb_fastformer.py 0 \
    max_len=400,num_epochs=2,model.token_dropout_rate=0.0
  taskset -c 1 python experiments/w2v_probe/train_probe.py /tmp/w2v/ff64.npz keras configs/imdb_fastformer.py 0 \
    max_len=400,num_epochs=2,model.token_dropout_rate=0.0
Needs .sweep/imdb_800.npz (val_sweep.py export)."""
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import jax
import jax.numpy as jnp
import val_sweep

from textattn import train

table_path, scale_mode = sys.argv[1], sys.argv[2]   # scale_mode: none | keras | off
config_path, seed = sys.argv[3], int(sys.argv[4])
overrides = val_sweep.parse_variant("x:" + (sys.argv[5] if len(sys.argv) > 5 else ""))[1]

orig = train.init_train_state
def patched(model, tx, rng, length, optimizer=None):
  state = orig(model, tx, rng, length, optimizer)
  if scale_mode == "off":
    return state
  f = np.load(table_path)
  table, found = f["table"], f["found"]
  cur = state.params["embedding"]["token"]["embedding"]
  vecs = table[found]
  if scale_mode == "keras":
    vecs = vecs / vecs.std() * 0.05 / np.sqrt(3)
  elif scale_mode.startswith("std"):
    vecs = vecs / vecs.std() * float(scale_mode[3:])
  new = cur.at[jnp.asarray(found)].set(jnp.asarray(vecs))
  params = jax.tree.map(lambda x: x, state.params)
  params["embedding"]["token"]["embedding"] = new
  return state.replace(params=params, opt_state=state.tx.init(params))
train.init_train_state = patched
r = val_sweep.run_one(os.path.join(ROOT, ".sweep/imdb_800.npz"), config_path, overrides, seed)
print(json.dumps({"table": table_path, "scale": scale_mode, "seed": seed, "overrides": overrides, **r}), flush=True)
