"""Where a pretrained encoder's softmax heads put their weight (issue 55: why additive attention
cannot imitate them). For each layer and head, on N texts (each text's real query tokens
averaged, then the texts), the attention weight on the query's own token, on its neighbours
within 1..RADIUS positions, on [CLS] and [SEP] (the "no-op" sinks), and how query-dependent the
weights are: the total-variation distance between a query's weights and the mean of its text's
queries' (0: every query weighs the keys alike, one pooled vector per text, which is all
Fastformer's global key is; at most 1 - 1/n for n real queries). Fastformer's output for token
t is W_o(g_k * q_t) + q_t ("additive"; "additive_value": W_o(g_k * v_t) [+ q_t]) with one pooled
g_k per head and text: weight on t itself it can mimic; weight on t's neighbours, or weights
that differ from query to query, it cannot.

    python experiments/pretrained/attention_locality.py --model DIR/all-MiniLM-L6-v2 \
        [--tfds imdb_reviews --split test --max_len 128] [--texts 64] [--radius 2]

Prints one row per layer (heads' median and range) and the encoder's count of heads with most
of their weight on their own token, and on their neighbours. A description of the checkpoint,
not a result of ours.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import tensorflow_datasets as tfds

from textattn import attention as attention_lib
from textattn.models import bert
from textattn.pretrained import hf
from textattn.recipes import attention_transfer as transfer


def texts_of(args) -> list[str]:
  rows = tfds.load(args.tfds, split=f"{args.split}[:{args.texts}]", shuffle_files=False)
  return [row["text"].decode() for row in tfds.as_numpy(rows)]


def head_statistics(weights: np.ndarray, real: np.ndarray, sinks: np.ndarray, radius: int):
  """weights [h, t, i] of one text, real [l] bool, sinks [l] bool -> (self, near, sink,
  spread) [h] each, over the text's real queries."""
  length = weights.shape[-1]
  offsets = np.abs(np.arange(length)[:, None] - np.arange(length)[None, :])
  queries = real.astype(np.float64)
  count = queries.sum()

  def per_query_mean(x):  # [h, t] -> [h]
    return (x * queries).sum(-1) / count
  itself = per_query_mean((weights * (offsets == 0)).sum(-1))
  near = per_query_mean((weights * ((offsets >= 1) & (offsets <= radius))).sum(-1))
  sink = per_query_mean((weights * sinks[None, None, :]).sum(-1))
  mean = (weights * queries[None, :, None]).sum(1, keepdims=True) / count
  spread = per_query_mean(0.5 * np.abs(weights - mean).sum(-1))
  return itself, near, sink, spread


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--model", required=True)
  parser.add_argument("--tfds", default="imdb_reviews")
  parser.add_argument("--split", default="test")
  parser.add_argument("--texts", type=int, default=64)
  parser.add_argument("--max_len", type=int, default=128)
  parser.add_argument("--radius", type=int, default=2)
  args = parser.parse_args()
  pretrained = hf.load(args.model)
  c = pretrained.config
  # the end of each text, as imdb_minilm truncates (truncation "pre")
  ids = np.asarray(pretrained.tokenizer.encode(texts_of(args), args.max_len, "pre"), np.int32)
  model = bert.BertClassifier(c, 2, pooling="mean", attention="softmax", attention_impl="xla")
  params = hf.init_params(model, pretrained, jax.random.key(0), args.max_len)[0]
  real = ids != 0
  inputs = transfer.layer_inputs(c, params, jnp.asarray(ids), jnp.asarray(real))
  attention = attention_lib.get("softmax").build(num_heads=c.num_heads, implementation="xla")
  sinks = np.isin(ids, [pretrained.tokenizer.token_id(t) for t in ("[CLS]", "[SEP]")])
  names = ("on itself", f"within 1..{args.radius}", "on [CLS]/[SEP]", "query dependence (TV)")
  per_layer = []
  for layer in range(c.num_layers):
    _, taught = attention.apply({"params": params["encoder"][f"block_{layer}"]["attention"]},
                                inputs[layer], jnp.asarray(real), mutable=["intermediates"])
    [(query, key)] = taught["intermediates"]["query_key"]
    scores = jnp.einsum("bthd,bihd->bhti", query, key) * query.shape[-1] ** -0.5
    scores = jnp.where(jnp.asarray(real)[:, None, None, :], scores, -jnp.inf)
    weights = np.asarray(jax.nn.softmax(scores, axis=-1), np.float64)
    stats = np.mean([head_statistics(weights[b], real[b], sinks[b], args.radius)
                     for b in range(len(ids))], axis=0)  # [4, heads]
    per_layer.append(stats)
    print(f"layer {layer}: " + "; ".join(
        f"{name} median {np.median(s):.2f} [{s.min():.2f}, {s.max():.2f}]"
        for name, s in zip(names, stats)))
  stats = np.concatenate(per_layer, axis=1)
  print(f"heads with most weight on their own token: {int((stats[0] > 0.5).sum())} of "
        f"{stats.shape[1]}, on their neighbours within 1..{args.radius}: "
        f"{int((stats[1] > 0.5).sum())}; {args.texts} {args.tfds} {args.split} texts, "
        f"{args.max_len} tokens")


if __name__ == "__main__":
  main()
