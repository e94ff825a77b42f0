"""How well the attention transfer stage's settings imitate the teacher, before any fine-tuning
(issue 55; how transfer_tweets.sh's stage settings were chosen): the stage alone on the disaster
tweets, printing each layer's relative output error (textattn/recipes/attention_transfer.py:
the loss over the teacher's mean square output; and each block's output error over the
teacher block's change, whole_block's) on 128 held-out tweets every 50 steps (or
`--data`: any CSV with a "text" column, e.g. IMDB reviews at `--max_len 128`).

    python experiments/pretrained/transfer_probe.py --model DIR/all-MiniLM-L6-v2 \
        --attention additive --train new+out+qk --learning_rate 1e-2 --steps 150
    python experiments/pretrained/transfer_probe.py ... --attention linear \
        --options '{"feature_map": "hedgehog"}' --train new+out

One seed and one held-out batch: a guide for choosing settings, not a result.
"""

import argparse
import csv
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from textattn.models import bert
from textattn.pretrained import hf
from textattn.recipes import attention_transfer as transfer


def main():
  here = os.path.dirname(os.path.abspath(__file__))
  parser = argparse.ArgumentParser()
  parser.add_argument("--model", required=True)
  parser.add_argument("--data", default=os.path.join(
      here, "..", "..", "..", "shared", "data", "disaster-tweets", "train.csv"))
  parser.add_argument("--attention", default="additive")
  parser.add_argument("--options", default="{}", help="the variant's options, JSON")
  parser.add_argument("--train", default="new+out", choices=transfer.TRAINS)
  parser.add_argument("--learning_rate", type=float, default=1e-2)
  parser.add_argument("--steps", type=int, default=150)
  parser.add_argument("--max_len", type=int, default=64)
  args = parser.parse_args()
  options = tuple(sorted(json.loads(args.options).items()))
  pretrained = hf.load(args.model)
  c = pretrained.config
  with open(args.data, newline="") as f:
    texts = [row["text"] for row in csv.DictReader(f)]
  ids = np.asarray(pretrained.tokenizer.encode(texts, args.max_len, "post"), np.int32)
  rng = np.random.default_rng(0)
  order = rng.permutation(len(ids))
  held, train = ids[order[:128]], ids[order[256:]]

  def params(name, opts, seed):
    model = bert.BertClassifier(c, 2, pooling="mean", attention=name, attention_impl="xla",
                                attention_options=opts)
    return jax.tree.map(jnp.asarray, hf.init_params(model, pretrained, jax.random.key(seed),
                                                    args.max_len)[0])
  teacher, student = params("softmax", (), 0), params(args.attention, options, 7)
  mask = transfer.trainable(student, teacher, args.train)
  tx, step = transfer.make_step(c, args.attention, teacher, mask, args.learning_rate,
                                options=options, whole_block=args.train == "block")
  step, state = jax.jit(step), tx.init(student)

  @jax.jit
  def relative(p, tokens):  # per layer: the attention outputs', the blocks' (whole_block)
    inputs = transfer.layer_inputs(c, teacher, tokens, tokens != 0)
    return [transfer.transfer_loss(c, args.attention, p, teacher, inputs, tokens != 0,
                                   options=options, whole_block=b)[1]["relative"]
            for b in (False, True)]

  def show(i, p):
    attention, block = (np.round(np.asarray(r), 3) for r in relative(p, held))
    print(f"step {i} ({time.perf_counter() - start:.0f} s): relative error per layer of the "
          f"attention outputs {attention}, of the blocks' outputs {block}", flush=True)
  start = time.perf_counter()
  show(0, student)
  for i in range(1, args.steps + 1):
    batch = train[rng.integers(0, len(train), 32)]
    student, state, _, _ = step(student, state, batch, batch != 0)
    if i % 50 == 0 or i == args.steps:
      show(i, student)


if __name__ == "__main__":
  main()
