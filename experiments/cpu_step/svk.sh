#!/bin/bash
cd "$(dirname "$0")/../.."
quiet() { grep -v -i "warn\|cpu_feature\|rebuild Tensor\|^I1\|^W1\|fontManager" || true; }
echo "# $(date -u +%FT%TZ) code $(git rev-parse --short HEAD), CPU-4, study SIGSTOPped; Keras jit off and textattn's seed layout (experiments/speed_vs_keras.sh's commands), alternated"
for round in $(seq ${1:-3}); do
  echo "round $round $(date -u +%T)"
  echo "keras jit off: $(python experiments/keras_seed.py speed --jit=off --steps=300 --epochs=4 2>&1 | quiet | tail -1)"
  for attention in softmax additive; do
    python -m textattn.benchmark --mode=train_step --config=configs/imdb_keras_example.py \
      --config.model.attention=$attention --repeats=60 --warmup=10 \
      --out_dir=/tmp/svk --overwrite 2>&1 | grep "^train_step"
  done
done
