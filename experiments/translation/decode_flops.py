"""FLOP-bound estimate of a finished run's test decoding (greedy and beam), beside its measured
seconds: the steps each length-sorted batch really ran (until its last row ended, from
test_translations.jsonl) times the decoder's per-row-step FLOPs, plus the encoder.

    python experiments/translation/decode_flops.py runs/spa_eng --matmul_tflops=0.21

Per row and step (one decoder layer each): self-attention projections 4 d^2, cross-attention
query/output 2 d^2, feed-forward 2 d f, output layer d V; the key/value projections of the S
source positions, 2 S d^2, once per sentence (every step with --recompute_cross_kv, as the code
before the cross-attention cache did); 2 FLOPs a multiply-add. Attention scores
are ignored (< 1%). Beam search may run past its best hypothesis's length (until no row can
change), so its steps are a lower bound. --matmul_tflops: the CPU's measured float32 matmul rate (RESULTS §19).
"""

import argparse
import json
import pathlib

import numpy as np

from textattn.data import pairs as pairs_lib


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("workdir")
  parser.add_argument("--matmul_tflops", type=float, default=0.21)
  parser.add_argument("--recompute_cross_kv", action="store_true")
  args = parser.parse_args()
  config = json.loads(pathlib.Path(args.workdir, "config.json").read_text())
  m = config["model"]
  d, f, layers = m["embed_dim"], m["ffn_dim"], m["decoder_layers"]
  rows = [json.loads(line) for line in pathlib.Path(
      args.workdir, "test_translations.jsonl").read_text(encoding="utf-8").splitlines()]
  metrics = pathlib.Path(args.workdir, "metrics.jsonl").read_text().splitlines()
  report = [json.loads(line) for line in metrics if "test/accuracy" in line][-1]
  tokenizer = json.loads(pathlib.Path(args.workdir, "target_tokenizer.json").read_text())
  vocab = len(tokenizer["model"]["vocab"])
  s, t = config["source_len"], config["target_len"]
  head = (m.get("head_dim") or d // m["num_heads"]) * m["num_heads"]
  cross_kv = 2 * layers * 2 * s * d * head
  per_step = 2 * layers * (4 * d * head + 2 * d * head + 2 * d * f) + 2 * d * vocab
  encoder = 2 * m["encoder_layers"] * s * (4 * d * head + 2 * d * f)
  if args.recompute_cross_kv:
    per_step += cross_kv
  else:
    encoder += cross_kv
  pairs = pairs_lib.read_pairs(config["dataset"], config["source_field"], config["target_field"])
  test = pairs_lib.split_indices(pairs, config["data_seed"], config["split_by"] == "source")["test"]
  source_lengths = np.array([min(len(pairs_lib.standardize_source(pairs.sources[i]).split()), s)
                             for i in test])
  order = np.argsort(source_lengths, kind="stable")
  batch = config["eval_batch_size"]
  for name in [k for k in rows[0] if k != "reference"]:
    beam = 1 if name == "greedy" else int(name[4:])
    lengths = np.array([min(len(r[name].split()) + 1, t - 1) for r in rows])  # + [end]
    steps = sum(lengths[order[i:i + batch]].max() * batch for i in range(0, len(rows), batch))
    flops = steps * beam * per_step + len(rows) * encoder
    if not args.recompute_cross_kv:  # (projected for each of the beam's copies of the memory)
      flops += len(rows) * (beam - 1) * cross_kv
    seconds = report.get(f"test/decode_seconds_{name}")
    bound = flops / (args.matmul_tflops * 1e12)
    print(f"{name}: {len(rows):,} sentences, {steps:,} row-steps x beam {beam}, "
          f"{flops / 1e12:.2f} TFLOP -> FLOP bound {bound:.1f} s at {args.matmul_tflops} TFLOP/s; "
          f"measured {seconds:.1f} s ({len(rows) / seconds:,.0f} sentences/s, "
          f"{100 * bound / seconds:.0f}% of the bound, compilation included)")


if __name__ == "__main__":
  main()
