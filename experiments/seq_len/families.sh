#!/usr/bin/env bash
# Issue 54: every attention family against length on this CPU, forward+backward of one layer and
# one decoding step, the shapes of experiments/seq_len/run.sh (batch 4, embed 256, 4 heads,
# float32). Run from the repository root with nothing else running (a background job paused).
# The tables land in experiments/seq_len/families_<cpu>/ (results.md, results.jsonl).
set -euo pipefail
out=${1:-experiments/seq_len/families_cpu}
# --lengths=full (2026-12-02): every kernel computes all B x L positions (at the default
# half_to_full the native softmax kernels skip all-padding key blocks the others compute).
common=(--batch_size=4 --embed_dim=256 --num_heads=4 --num_layers=1 --dtype=float32
        --point_memory_limit_gb=8 --warmup=1 --repeats=5 --point_time_budget_s=15
        --point_timeout_s=150 --overwrite --lengths=full)
# Each family's fastest exact kernel here ("auto" where it chooses by measurement: softmax and
# additive; the chunked forms of the causal linear-time families, which "auto" picks from 256).
python -m textattn.benchmark --mode=forward+backward \
  --variants=softmax_auto,causal_auto,additive_auto,causal_additive_recurrent_chunked,linear_xla,causal_linear_chunked,local_chunked,sliding_window_chunked,performer_xla,causal_performer_chunked \
  --seq_lens=256,1024,4096,16384 "${common[@]}" --out_dir="$out/forward_backward"
# One decoding step with L - 1 positions already cached (softmax: keys and values, O(L); the
# recurrent forms: a constant-size state; the sliding window: a ring of `window` keys).
python -m textattn.benchmark --mode=decode_step \
  --variants=causal_auto,causal_additive_recurrent_auto,causal_linear_auto,sliding_window_auto,causal_performer_auto \
  --seq_lens=256,4096,16384 "${common[@]}" --out_dir="$out/decode_step"
