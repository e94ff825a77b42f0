#!/usr/bin/env bash
# Issue 44's IMDB seeds on a lent GPU: all-MiniLM-L6-v2 fine-tuned with its softmax attention
# (configs/imdb_minilm.py) and with additive attention swapped in (imdb_minilm_additive.py),
# seeds 0-2, the same commands as experiments/pretrained/imdb.sh on the CPU (256 tokens, 1 epoch,
# 4 evaluations, float32: TF32 matrix products, JAX's GPU default). The six runs go at once: a
# 22.7 M-parameter model at batch 32 leaves most of the card idle. Then NBSVM and the
# NBSVM + MiniLM ensemble per seed.
#
# A call carries at most 64 MiB; the weights (87 MiB) and IMDB (18 MiB as xz) go over two calls
# on one warm machine (it stays warm 30 s: make the second call at once):
#   here, once: TFDS_DATA_DIR=... bash experiments/pretrained/stage_gpu.sh DIR/all-MiniLM-L6-v2
#   call 1:     carry [".whl", ".gpu/minilm_a"], command "ls -l .gpu/minilm_a", timeout_s 60
#   call 2:     carry [".gpu/minilm_b"], command "bash experiments/gpu/minilm_imdb.sh",
#               timeout_s 600 (.gpu/minilm_a and .whl stay from call 1: ignored paths are kept)
# Results: $OUT/summary.txt (per-run test accuracy and time, mean +- sd, paired differences)
# and $OUT/minilm_runs.tgz (each workdir's logs, metrics and test predictions, no checkpoints).
# Copy both into experiments/gpu/logs/ and write the RESULTS section with the card's name.
# A run stopped by its time limit keeps its checkpoint in .gpu/runs: call 2 again resumes it.
# Rehearsal on a CPU (tests/test_gpu_scripts.py): REHEARSE=1 bash experiments/gpu/minilm_imdb.sh
source experiments/gpu/setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import jax; print('jax', jax.__version__, jax.devices()[0].device_kind)"

MODEL=/tmp/minilm/all-MiniLM-L6-v2; DATA=/tmp/imdb; RUNS=$PWD/.gpu/runs; LIMIT=${LIMIT:-500}
if [ "$REHEARSE" = 1 ]; then
  SEEDS=${SEEDS:-0}; RUNS=$OUT/runs
else
  SEEDS=${SEEDS:-0 1 2}
  a=.gpu/minilm_a; b=.gpu/minilm_b
  for part in $a $b; do
    [ -f $part/model.safetensors.part ] || { echo "$part/model.safetensors.part is missing:" \
      "stage it (experiments/pretrained/stage_gpu.sh) and make call 1 just before call 2"; exit 1; }
  done
  mkdir -p $MODEL $DATA
  cp $b/model/* $MODEL/
  cat $a/model.safetensors.part $b/model.safetensors.part > $MODEL/model.safetensors
  (cd $MODEL && sha256sum -c --quiet "$OLDPWD/$b/model.safetensors.sha256") || exit 1
  for split in train test; do xz -dc $b/$split.jsonl.xz > $DATA/$split.jsonl; done
fi
mkdir -p "$RUNS"

# The six runs at once (one at a time in a rehearsal: `wired` checks one command after another).
for seed in $SEEDS; do
  for variant in softmax additive; do
    config=configs/imdb_minilm.py; [ $variant = additive ] && config=configs/imdb_minilm_additive.py
    run=(wired --timeout=$LIMIT -m textattn.main --config=$config --workdir=$RUNS/${variant}_s$seed
         --config.model.pretrained=$MODEL --config.dataset=$DATA/train.jsonl
         --config.test_file=$DATA/test.jsonl --config.evals_per_epoch=4 --config.seed=$seed)
    if [ "$REHEARSE" = 1 ]; then "${run[@]}"; continue; fi
    (start=$SECONDS; "${run[@]}" >> "$RUNS/${variant}_s$seed.log" 2>&1
     echo "${variant}_s$seed $((SECONDS - start))" >> "$RUNS/times.tsv") &
  done
done
wait

# Then, per seed, NBSVM (its n-gram features are built on the CPU, ~1 min cold) and the
# NBSVM + MiniLM ensemble (weights chosen on validation; textattn.ensemble), as imdb.sh does.
for seed in $SEEDS; do
  wired --timeout=120 -m textattn.main --config=configs/imdb_nbsvm.py \
    --workdir=$RUNS/nbsvm_s$seed --config.dataset=$DATA/train.jsonl \
    --config.test_file=$DATA/test.jsonl --config.seed=$seed >> "$RUNS/nbsvm_s$seed.log" 2>&1
  wired --timeout=120 -m textattn.ensemble --workdir=$RUNS/nbsvm_s$seed \
    --workdir=$RUNS/softmax_s$seed --out=$RUNS/nbsvm_minilm_s$seed \
    >> "$RUNS/nbsvm_minilm_s$seed.log" 2>&1
done
[ "$REHEARSE" = 1 ] && exit 0

{
  for log in "$RUNS"/*.log; do
    echo "== $(basename "$log" .log): $(grep -c "examples/s" "$log") progress lines"
    grep -E "^step [0-9]+/[0-9]+:.*examples/s" "$log" | tail -1
    grep -E "^Test report|rror" "$log" | tail -2
  done
  python3 experiments/summarize_runs.py "$RUNS"
  for seed in $SEEDS; do
    python3 -m textattn.compare "$RUNS/softmax_s$seed" "$RUNS/additive_s$seed" 2>&1 | tail -4
  done
  echo "done in ${SECONDS} s"
} 2>&1 | tee "$OUT/summary.txt"
tar czf "$OUT/minilm_runs.tgz" -C "$RUNS" --exclude=checkpoints --exclude=tokenizer.json .
