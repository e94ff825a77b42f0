#!/bin/bash
# One round of issue 6's comparison on this CPU, every job on both cores, one after another:
# the seed Keras model (experiments/keras_seed.py, without and with XLA), then textattn's seed
# train step (softmax and additive attention) through the target command: the config as shipped
# (the seed's computation: no padding mask, Keras 3's Adam), then textattn's masked layout with
# optax Adam on the benchmark's padded batches (lengths uniform in [100, 200]) and on
# full-length ones. Run it a few times; compare within a round.
#
#     bash experiments/speed_vs_keras.sh [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
quiet() { grep -v -i "warn\|cpu_feature\|rebuild Tensor\|^I1\|^W1\|fontManager" || true; }
for round in $(seq "${1:-1}"); do
  echo "round $round, $(date -u +%H:%M:%S) UTC, load $(cut -d' ' -f1 /proc/loadavg)"
  echo "keras jit off: $(python experiments/keras_seed.py speed --jit=off --steps=300 --epochs=4 2>&1 | quiet | tail -1)"
  echo "keras jit auto: $(python experiments/keras_seed.py speed --jit=auto --steps=150 --epochs=3 2>&1 | quiet | tail -1)"
  for attention in softmax additive; do
    # The config as shipped: the seed's computation (padding before the tokens and unmasked,
    # so every example costs all 200 positions, as in Keras; Keras 3's Adam).
    python -m textattn.benchmark --mode=train_step --config=configs/imdb_keras_example.py \
      --config.model.attention=$attention --repeats=60 --warmup=10 \
      --out_dir=runs/speed_vs_keras --overwrite 2>&1 | grep "^train_step" | sed "s/^/seed layout: /"
    # textattn's own layout (padding after the tokens, masked; optax Adam), with the benchmark's
    # padded batches and with full-length ones.
    for lengths in half_to_full full; do
      python -m textattn.benchmark --mode=train_step --config=configs/imdb_keras_example.py \
        --config.model.attention=$attention --repeats=60 --warmup=10 --lengths=$lengths \
        --config.layout.padding=after_masked --config.optimizer.name=adam \
        --out_dir=runs/speed_vs_keras --overwrite 2>&1 | grep "^train_step" | sed "s/^/masked, $lengths: /"
    done
  done
done
