"""Are `predict --explain`'s token weights the model's own? A deletion curve (issue 26).

    TFDS_DATA_DIR=../shared/tensorflow_datasets python experiments/explain_deletion.py \
        runs/keras_fast [--reviews=2000] [--seed=0] [--random_seeds=5] [--uncentred]

Takes a seeded sample of IMDB's test reviews (TFDS, file order, then numpy's permutation with
--seed), encodes them as the workdir's model does (max_len, truncation, padding layout), and
computes each review's token weights with textattn.explain (the method the model's pooling
calls for). For k = 1, 2, 5, 10, 20 it deletes, among the tokens the model sees, the k
highest-weight tokens, the k lowest-weight tokens, and k random tokens (one run per random
seed 0..random_seeds-1) -- a deleted token is replaced by padding id 0, which the model masks
out (with padding "before_as_token" the model's learned padding token) -- and reports how often
the predicted label flips and the mean drop in the originally predicted class's probability.
Random rows are mean +- sd over the random seeds. A review with fewer than k tokens loses all.
"""

import argparse
import datetime
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout

KS = (1, 2, 5, 10, 20)


def imdb_test_sample(count: int, seed: int) -> list[str]:
  import tensorflow_datasets as tfds
  texts = [example["text"].decode("utf-8") for example in
           tfds.as_numpy(tfds.load("imdb_reviews", split="test", shuffle_files=False))]
  order = np.random.default_rng(seed).permutation(len(texts))[:count]
  return [texts[i] for i in order]


def delete(inputs: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
  """`inputs` with each row's k highest-`scores` real tokens (id != 0) replaced by 0."""
  scores = np.where(inputs != 0, scores, -np.inf)
  top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
  rows = np.arange(len(inputs))[:, None]
  chosen = np.isfinite(scores[rows, top])  # a row with fewer than k tokens loses them all
  out = inputs.copy()
  out[rows.repeat(k, axis=1)[chosen], top[chosen]] = 0
  return out


def effect(model, original: np.ndarray, inputs: np.ndarray) -> tuple[float, float]:
  """(fraction of predictions flipped, mean drop of the originally predicted class's p)."""
  predicted = original.argmax(-1)
  after = model._run(inputs)
  rows = np.arange(len(inputs))
  return (float(np.mean(after.argmax(-1) != predicted)),
          float(np.mean(original[rows, predicted] - after[rows, predicted])))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("workdir")
  parser.add_argument("--reviews", type=int, default=2000)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--random_seeds", type=int, default=5)
  parser.add_argument("--checkpoint", default="best")
  parser.add_argument("--uncentred", action="store_true",
                      help="gradient x input of the raw predicted logit (textattn.explain's "
                           "centred=False), for comparison")
  args = parser.parse_args()

  import textattn
  from textattn import explain
  start = time.perf_counter()
  model = textattn.load(args.workdir, args.checkpoint)
  texts = imdb_test_sample(args.reviews, args.seed)
  inputs, lengths = model.encode(texts)
  weights_fn = (explain.make_weights_fn(model.model, model.config, centred=False)
                if args.uncentred else model.weights_fn())
  original, weights = explain.run_batched(weights_fn, model.params, inputs, model.batch_size)
  seen = np.count_nonzero(inputs, axis=1)
  method = explain.method_for(model.config) + (" (uncentred logit)" if args.uncentred else "")
  print(f"{args.workdir} (checkpoint step {model.step}), {len(texts)} IMDB test reviews "
        f"(sample seed {args.seed}), method {method}; tokens seen per review: median "
        f"{np.median(seen):.0f}, min {seen.min()} (max_len {model.config.max_len}, "
        f"{np.mean(lengths > model.config.max_len):.0%} truncated)")
  print(f"{'deleted':<18}" + "".join(f"{f'k={k}':>22}" for k in KS))
  table = {}
  for name, scores in (("highest weight", weights), ("lowest weight", -weights)):
    table[name] = [effect(model, original, delete(inputs, scores, k)) for k in KS]
  randoms = []
  for seed in range(args.random_seeds):
    noise = np.random.default_rng(1000 + seed).random(inputs.shape)
    randoms.append([effect(model, original, delete(inputs, noise, k)) for k in KS])
  randoms = np.array(randoms)  # [seed, k, (flip, drop)]
  for column, title in ((0, "predictions flipped"), (1, "mean drop of p(predicted)")):
    print(f"-- {title}")
    for name in ("highest weight", "lowest weight"):
      print(f"{name:<18}" + "".join(f"{100 * table[name][i][column]:>21.1f}%"
                                    for i in range(len(KS))))
    means = 100 * randoms[:, :, column].mean(0)
    sds = 100 * randoms[:, :, column].std(0, ddof=1) if args.random_seeds > 1 else 0 * means
    print(f"{f'random ({args.random_seeds} seeds)':<18}" + "".join(
        f"{f'{m:.1f} ± {s:.1f}%':>22}" for m, s in zip(means, sds)))
  print(f"({time.perf_counter() - start:.0f} s, {datetime.date.today()}, "
        f"{os.cpu_count()} CPUs)")


if __name__ == "__main__":
  main()
