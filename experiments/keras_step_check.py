"""Does textattn's transcription compute the same training steps as the seed Keras model?

experiments/keras_seed.py (the Keras model) learned faster than configs/imdb_keras_example.py in
its first epoch on the same token arrays until the config took the seed's padding layout and
Keras 3's Adam (experiments/RESULTS.md, "The Keras model's Adam"). This copies the Keras model's
initial weights into the transcription (configs/imdb_keras_example.py), switches dropout off in
both, feeds both the same batches of IMDB training reviews (padded before the tokens, as the
config's pipeline and Keras' pad_sequences do) and compares, after each of K Adam steps, the
losses and every parameter.

    TFDS_DATA_DIR=../shared/tensorflow_datasets python experiments/keras_step_check.py \
        [K] [adam|keras_adam]

The second argument is textattn's config.optimizer.name (default: the seed config's,
"keras_adam"; "adam" is optax's Adam, which drifts from the Keras model from step 1).

Prints, per step, both losses and the largest absolute parameter difference (and where).
Float32 rounding grows through the steps; a wrong layer, initialiser or optimizer formula shows
as a large difference at step 1.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np

from configs import imdb_keras_example
from experiments import keras_seed
from textattn import models, train
from textattn import data as data_lib

# Flax parameter path -> Keras weight path (the seed model's names).
NAMES = {
    ("embedding", "token", "embedding"): "token_and_position_embedding/embedding/embeddings",
    ("embedding", "position"): "token_and_position_embedding/embedding_1/embeddings",
    **{("block_0", "attention", part, leaf): f"transformer_block/multi_head_attention/{kpart}/{leaf}"
       for part, kpart in [("query", "query"), ("key", "key"), ("value", "value"),
                           ("out", "attention_output")] for leaf in ("kernel", "bias")},
    **{("block_0", part, leaf): f"transformer_block/sequential/{kpart}/{leaf}"
       for part, kpart in [("ffn_in", "dense"), ("ffn_out", "dense_1")]
       for leaf in ("kernel", "bias")},
    **{("block_0", part, leaf): f"transformer_block/{kpart}/{kleaf}"
       for part, kpart in [("norm_attention", "layer_normalization"),
                           ("norm_ffn", "layer_normalization_1")]
       for leaf, kleaf in [("scale", "gamma"), ("bias", "beta")]},
    **{(part, leaf): f"{kpart}/{leaf}" for part, kpart in [("mlp", "dense_2"), ("logits", "dense_3")]
       for leaf in ("kernel", "bias")},
}


def keras_params(model) -> dict:
  weights = {w.path: np.asarray(w.numpy()) for w in model.weights}
  tree: dict = {}
  for path, kpath in NAMES.items():
    if kpath not in weights:
      raise SystemExit(f"Keras weight {kpath} not found; the model has: {sorted(weights)}")
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = jnp.asarray(weights[kpath])
  return tree


def compare_steps(inputs: np.ndarray, labels: np.ndarray, steps: int, optimizer: str,
                  vocab_size: int, report=None,
                  attention_impl: str = "auto") -> list[tuple[float, float]]:
  """Trains the Keras seed model and the transcription (configs/imdb_keras_example.py; dropout
  off, the Keras model's initial weights copied over) on the same `steps` batches of 32 rows of
  `inputs` (int32 [N, 200], padding 0 before the tokens) and returns, after each step, (max |loss difference|, max |parameter difference|).
  `optimizer` is textattn's config.optimizer.name, `attention_impl` its attention kernel
  (config.model.attention_impl; "auto" = the native kernel on a CPU). `report(step, loss, kloss, worst, diff)` is
  called after each step when given."""
  config = imdb_keras_example.get_config()
  config.optimizer.name = optimizer
  config.model.dropout_rate = 0.0
  config.model.attention_impl = attention_impl
  keras_seed.keras.backend.clear_session()  # layer names restart (dense, dense_1, ...)
  keras_seed.keras.utils.set_random_seed(0)
  kmodel = keras_seed.seed_model("off", rate=0.0)
  params = keras_params(kmodel)
  model = models.build_model(config, 2, vocab_size=vocab_size)
  tx = train.make_optimizer(config.optimizer, 1000)
  state = train.init_train_state(model, tx, jax.random.key(0), config.max_len, config.optimizer)
  if jax.tree.structure(state.params) != jax.tree.structure(params):
    raise SystemExit("parameter trees differ")
  state = state.replace(params=params, opt_state=tx.init(params))
  step = jax.jit(train.train_step)
  out = []
  for i in range(steps):
    batch = {"inputs": inputs[i * 32:(i + 1) * 32], "labels": labels[i * 32:(i + 1) * 32]}
    state, metrics = step(state, batch)
    kloss = kmodel.train_on_batch(batch["inputs"], batch["labels"])
    kloss = float(kloss[0] if isinstance(kloss, (list, tuple)) else kloss)
    loss = float(metrics["loss_sum"]) / 32
    diffs = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), state.params,
                         keras_params(kmodel))
    flat = {"/".join(str(getattr(k, "key", k)) for k in path): v
            for path, v in jax.tree_util.tree_flatten_with_path(diffs)[0]}
    worst = max(flat, key=flat.get)
    out.append((abs(loss - kloss), flat[worst]))
    if report:
      report(i + 1, loss, kloss, worst, flat[worst])
  return out


def main():
  steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
  config = imdb_keras_example.get_config()
  optimizer = sys.argv[2] if len(sys.argv) > 2 else config.optimizer.name
  data = data_lib.load_dataset(config, None)  # padding before the tokens, as Keras
  order = np.random.default_rng(0).permutation(len(data.train))[:steps * 32]
  compare_steps(data.train.inputs[order], data.train.labels[order], steps, optimizer,
                data.vocab_size,
                report=lambda i, loss, kloss, worst, diff: print(
                    f"step {i}: loss textattn {loss:.6f} keras {kloss:.6f}; "
                    f"max |param diff| {diff:.2e} ({worst})", flush=True))


if __name__ == "__main__":
  main()
