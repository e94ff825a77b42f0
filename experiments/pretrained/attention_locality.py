"""Where a pretrained encoder's softmax heads put their weight (issue 55: why additive attention
cannot imitate them). For each layer and head, on N texts, the mean over real query tokens of the
attention weight on keys within +-RADIUS positions (itself included), on [CLS] and [SEP] (the
"no-op" sinks), and how query-dependent the weights are: the mean total-variation distance
between a query's weights and the head's mean weights over the queries of that text (0: every
query weighs the keys alike, a single pooled vector, what Fastformer's global key gives; 1:
disjoint). Fastformer's output for token t is W_o(g * x_t) with one pooled g per head and text:
no head whose weight sits on t's neighbours, or differs from query to query, can be matched.

    python experiments/pretrained/attention_locality.py --model DIR/all-MiniLM-L6-v2 \
        [--tfds imdb_reviews --split test --max_len 128] [--texts 64] [--radius 2]

Prints one row per layer (heads' median and range) and the whole encoder's share of heads with
most of their weight local (> 0.5). A description of the checkpoint, not a result of ours.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from textattn.attention import softmax as softmax_lib  # noqa: F401 -- registers "softmax"
from textattn.models import bert
from textattn.pretrained import hf
from textattn.recipes import attention_transfer as transfer


def texts_of(args) -> list[str]:
  import tensorflow_datasets as tfds
  rows = tfds.load(args.tfds, split=f"{args.split}[:{args.texts}]", shuffle_files=False)
  return [row["text"].decode() for row in tfds.as_numpy(rows)]


def head_statistics(weights: np.ndarray, real: np.ndarray, sinks: np.ndarray, radius: int):
  """weights [h, t, i] of one text, real [l] bool, sinks [l] bool -> (local, sink, spread) [h]."""
  length = weights.shape[-1]
  offsets = np.abs(np.arange(length)[:, None] - np.arange(length)[None, :])
  queries = real.astype(np.float64)
  count = queries.sum()
  local = ((weights * (offsets <= radius)).sum(-1) * queries).sum(-1) / count
  sink = ((weights * sinks[None, None, :]).sum(-1) * queries).sum(-1) / count
  mean = (weights * queries[None, :, None]).sum(1, keepdims=True) / count
  spread = ((0.5 * np.abs(weights - mean).sum(-1)) * queries).sum(-1) / count
  return local, sink, spread


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
  attention = transfer._attention(c, "softmax", "xla")
  sinks = np.isin(ids, [pretrained.tokenizer.token_id(t) for t in ("[CLS]", "[SEP]")])
  shares = []
  for layer in range(c.num_layers):
    _, taught = attention.apply({"params": params["encoder"][f"block_{layer}"]["attention"]},
                                inputs[layer], jnp.asarray(real), mutable=["intermediates"])
    [(query, key)] = taught["intermediates"]["query_key"]
    scores = jnp.einsum("bthd,bihd->bhti", query, key) * query.shape[-1] ** -0.5
    scores = jnp.where(jnp.asarray(real)[:, None, None, :], scores, -jnp.inf)
    weights = np.asarray(jax.nn.softmax(scores, axis=-1), np.float64)
    stats = np.mean([head_statistics(weights[b], real[b], sinks[b], args.radius)
                     for b in range(len(ids))], axis=0)  # [3, heads]
    shares.append(stats[0])
    print(f"layer {layer}: " + "; ".join(
        f"{name} median {np.median(s):.2f} [{s.min():.2f}, {s.max():.2f}]"
        for name, s in zip((f"weight within +-{args.radius}", "on [CLS]/[SEP]",
                            "query dependence (TV)"), stats)))
  local = np.concatenate(shares)
  print(f"heads with most weight within +-{args.radius}: {int((local > 0.5).sum())} of "
        f"{local.size}; {args.texts} {args.tfds} {args.split} texts, {args.max_len} tokens")


if __name__ == "__main__":
  main()
