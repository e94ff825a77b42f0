"""Cached against uncached greedy decoding (issue 29): seconds to decode L tokens for a batch,
for each causal decoder variant, in a decoder where attention dominates (small vocabulary, two
layers). Uncached re-runs the whole decoder on the prefix for every token (Deep Learning with
Python's `decode_sequence`); cached feeds one position a step (a key/value cache for softmax,
the running sums for causal additive attention).

    python experiments/translation/greedy_cache.py --out_dir=experiments/translation/greedy_cpu

Untrained parameters and an [end] id that never wins (-1), so every row decodes exactly L tokens.
Writes results.csv, results.md and time_vs_length.png.
"""

import argparse
import csv
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp

from textattn import decoding
from textattn.models import seq2seq

VARIANTS = ("causal", "causal_additive", "causal_additive_recurrent")


def measure(variant, cached, length, args):
  model = seq2seq.Seq2Seq(source_vocab=args.vocab, target_vocab=args.vocab, source_len=16,
                          target_len=length + 1, embed_dim=args.embed, num_heads=args.heads,
                          ffn_dim=2 * args.embed, encoder_layers=1,
                          decoder_layers=args.layers, decoder_attention=variant)
  sources = jax.random.randint(jax.random.key(1), (args.batch, 16), 2, args.vocab)
  params = jax.jit(model.init)(jax.random.key(0), sources,
                               jnp.ones((args.batch, length + 1), jnp.int32))["params"]
  decode = jax.jit(lambda p, s: decoding.greedy_decode(model, p, s, start_id=2, end_id=-1,
                                                       max_len=length, cached=cached))
  started = time.perf_counter()
  out = decode(params, sources).block_until_ready()
  compile_s = time.perf_counter() - started
  assert out.shape == (args.batch, length) and bool((out != 0).all())  # L tokens, every row
  times = []
  for _ in range(args.repeats):
    started = time.perf_counter()
    decode(params, sources).block_until_ready()
    times.append(time.perf_counter() - started)
  return compile_s, statistics.median(times)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out_dir", required=True)
  parser.add_argument("--lengths", default="16,32,64,128,256")
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--embed", type=int, default=256)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--layers", type=int, default=2)
  parser.add_argument("--vocab", type=int, default=1000)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  os.makedirs(args.out_dir, exist_ok=True)
  rows = []
  for length in map(int, args.lengths.split(",")):
    for variant in VARIANTS:
      for cached in (True, False):
        compile_s, median = measure(variant, cached, length, args)
        rows.append({"variant": variant, "cached": cached, "L": length,
                     "median_s": median, "ms_per_token": 1e3 * median / length,
                     "compile_s": compile_s})
        print(f"{variant:27s} {'cached' if cached else 'uncached':8s} L={length:4d}: "
              f"{median * 1e3:9.2f} ms ({1e3 * median / length:.3f} ms/token)", flush=True)
  with open(os.path.join(args.out_dir, "results.csv"), "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  lengths = sorted({r["L"] for r in rows})
  table = {(r["variant"], r["cached"], r["L"]): r["median_s"] for r in rows}
  lines = ["# Greedy decoding, cached vs uncached\n",
           f"`python experiments/translation/greedy_cache.py --out_dir={args.out_dir}`\n",
           (f"batch {args.batch}, embed {args.embed}, {args.heads} heads, {args.layers} decoder "
           f"layers, vocabulary {args.vocab}, float32, median of {args.repeats} after a "
           f"compiling call; {platform.processor() or platform.machine()}, "
           f"jax {jax.__version__}, {jax.devices()[0].platform}.\n"),
           "| L | " + " | ".join(f"{v} cached | {v} uncached | speed-up" for v in VARIANTS)
           + " |", "|---:|" + "---:|---:|---:|" * len(VARIANTS)]
  for length in lengths:
    cells = []
    for v in VARIANTS:
      c, u = table[(v, True, length)], table[(v, False, length)]
      cells += [f"{c * 1e3:.1f} ms", f"{u * 1e3:.1f} ms", f"{u / c:.1f}x"]
    lines.append(f"| {length} | " + " | ".join(cells) + " |")
  with open(os.path.join(args.out_dir, "results.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  figure, axis = plt.subplots(figsize=(6, 4))
  for v in VARIANTS:
    for cached, style in ((True, "-"), (False, "--")):
      axis.plot(lengths, [table[(v, cached, n)] * 1e3 for n in lengths], style, marker="o",
                label=f"{v} {'cached' if cached else 'uncached'}")
  axis.set(xscale="log", yscale="log", xlabel="tokens decoded (L)", ylabel="ms per batch",
           title=f"Greedy decoding, batch {args.batch}")
  axis.legend(fontsize=7)
  figure.tight_layout()
  figure.savefig(os.path.join(args.out_dir, "time_vs_length.png"), dpi=120)


if __name__ == "__main__":
  main()
