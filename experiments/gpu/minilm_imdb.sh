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
# and $OUT/minilm_runs.tgz (each workdir's logs, metrics and test predictions, no checkpoints;
# refreshed every minute, so a call cut short still returns what had finished). Copy both into
# experiments/gpu/logs/ and write the RESULTS section with the card's name. Plan it as one shot:
# a start, call 1 and call 2 take ~13 of a session's 15 device minutes. The GPU computes float32
# products in TF32, so its seeds are a set of their own: never pool them with the CPU's.
# The script exits 1 unless every run wrote its test report.
# ROWS (default "softmax additive", issue 44's): the MiniLM rows, each seed's at once. Issue 55's
# attention transfer at the full recipe (256 tokens, one epoch; 200 stage steps on top):
#   ROWS="softmax linear_transfer additive_transfer" NBSVM=0 (9 runs at once; no ensembles).
# Each non-softmax row is compared with softmax, seed by seed (textattn.compare).
# Rehearsal on a CPU (tests/test_gpu_scripts.py): REHEARSE=1 bash experiments/gpu/minilm_imdb.sh
# The staged halves first: a missed warm window (a fresh machine has neither) fails at once.
if [ "${REHEARSE:-0}" != 1 ]; then
  for part in .gpu/minilm_a .gpu/minilm_b; do
    [ -f $part/model.safetensors.part ] || { echo "$part/model.safetensors.part is missing:" \
      "stage it (experiments/pretrained/stage_gpu.sh) and make call 1 just before call 2"; exit 1; }
  done
fi
source experiments/gpu/setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$PYTHON" -c "import jax; print('jax', jax.__version__, jax.devices()[0].device_kind)"

# LIMIT: each MiniLM run's seconds (the six share the card); NBSVM's and the ensembles' own below.
MODEL=/tmp/minilm/all-MiniLM-L6-v2; DATA=/tmp/imdb; RUNS=$PWD/.gpu/runs; LIMIT=${LIMIT:-420}
if [ "$REHEARSE" = 1 ]; then
  SEEDS=${SEEDS:-0}; RUNS=$OUT/runs
else
  SEEDS=${SEEDS:-0 1 2}
  b=.gpu/minilm_b
  mkdir -p $MODEL $DATA
  cp $b/model/* $MODEL/
  cat .gpu/minilm_a/model.safetensors.part $b/model.safetensors.part > $MODEL/model.safetensors
  (cd $MODEL && sha256sum -c --quiet "$OLDPWD/$b/model.safetensors.sha256") || exit 1
  for split in train test; do xz -dc $b/$split.jsonl.xz > $DATA/$split.jsonl; done
fi
mkdir -p "$RUNS"
snapshot() {  # the small files of every workdir into $OUT, replaced whole (8 files at most)
  tar czf "$OUT/.minilm_runs.tgz" -C "$RUNS" --exclude=checkpoints --exclude=tokenizer.json . \
    2> /dev/null && mv "$OUT/.minilm_runs.tgz" "$OUT/minilm_runs.tgz"
}
timed() {  # NAME COMMAND...: the command's log in $RUNS/NAME.log, its seconds in times.tsv if it
  local name=$1 start=$SECONDS; shift  # succeeded (summarize_runs.py averages them)
  "$@" >> "$RUNS/$name.log" 2>&1 && echo "$name $((SECONDS - start))" >> "$RUNS/times.tsv"
}

# The MiniLM runs at once, and beside them NBSVM's three seeds one after another (their
# n-gram features are CPU work). One command at a time in a rehearsal (`wired` checks each, every
# row's).
declare -A row_args=(
  [softmax]=""
  [additive]="--config.model.attention=additive"
  [additive_transfer]="--config.model.attention=additive --config.attention_transfer.num_steps=200
                       --config.attention_transfer.train=new+out+qk"
  [linear_transfer]="--config.model.attention=linear --config.model.linear.feature_map=hedgehog
                     --config.attention_transfer.num_steps=200"
)
if [ "$REHEARSE" = 1 ]; then ROWS=${ROWS:-${!row_args[*]}}; else ROWS=${ROWS:-softmax additive}; fi
NBSVM=${NBSVM:-1}
pids=()
for seed in $SEEDS; do
  for row in $ROWS; do
    [ -n "${row_args[$row]+set}" ] || { echo "ROWS: unknown row $row (${!row_args[*]})"; exit 2; }
    # shellcheck disable=SC2086
    run=(wired --timeout=$LIMIT -m textattn.main --config=configs/imdb_minilm.py
         --workdir=$RUNS/${row}_s$seed ${row_args[$row]}
         --config.model.pretrained=$MODEL --config.dataset=$DATA/train.jsonl
         --config.source.test_file=$DATA/test.jsonl --config.evals_per_epoch=4 --config.seed=$seed)
    if [ "$REHEARSE" = 1 ]; then "${run[@]}"; continue; fi
    timed ${row}_s$seed "${run[@]}" & pids+=($!)
  done
done
nbsvm() {
  for seed in $SEEDS; do
    timed nbsvm_s$seed wired --timeout=150 -m textattn.main --config=configs/imdb_nbsvm.py \
      --workdir=$RUNS/nbsvm_s$seed --config.dataset=$DATA/train.jsonl \
      --config.source.test_file=$DATA/test.jsonl --config.seed=$seed
  done
}
if [ "$NBSVM" = 1 ]; then
  if [ "$REHEARSE" = 1 ]; then nbsvm; else nbsvm & pids+=($!); fi
fi
running() {  # any of the pids
  local pid; for pid in "$@"; do kill -0 "$pid" 2> /dev/null && return 0; done; return 1
}
while [ "$REHEARSE" != 1 ] && running "${pids[@]}"; do snapshot; sleep 60; done
wait

# The NBSVM + MiniLM ensemble of each seed whose two members finished (weights chosen on
# validation; textattn.ensemble), the three at once.
for seed in $SEEDS; do
  [ "$NBSVM" = 1 ] || break
  ens=(wired --timeout=90 -m textattn.ensemble --workdir=$RUNS/nbsvm_s$seed
       --workdir=$RUNS/softmax_s$seed --out=$RUNS/nbsvm_minilm_s$seed)
  if [ "$REHEARSE" = 1 ]; then "${ens[@]}"; continue; fi
  finished() { [ -f $RUNS/$1/test_predictions.npz ]; }
  finished nbsvm_s$seed && finished softmax_s$seed && { timed nbsvm_minilm_s$seed "${ens[@]}" & }
done
wait
[ "$REHEARSE" = 1 ] && exit 0

{
  for log in "$RUNS"/*.log; do
    echo "== $(basename "$log" .log)"
    grep -E "^step [0-9]+/[0-9]+:.*examples/s" "$log" | tail -1
    grep -E "^Test report|^Ensemble|rror" "$log" | tail -2
  done
  echo "wall seconds (times.tsv) are each run's alone with the others sharing the card and CPU"
  "$PYTHON" experiments/summarize_runs.py "$RUNS"
  for seed in $SEEDS; do
    for other in $ROWS $([ "$NBSVM" = 1 ] && echo nbsvm_minilm); do
      [ "$other" = softmax ] && continue
      "$PYTHON" -m textattn.compare "$RUNS/softmax_s$seed" "$RUNS/${other}_s$seed" 2>&1 | tail -4
    done
  done
  echo "done in ${SECONDS} s"
} 2>&1 | tee "$OUT/summary.txt"
snapshot
expected=$(( $(echo $SEEDS | wc -w) * ($(echo $ROWS | wc -w) + 2 * NBSVM) ))  # (+ NBSVM, ensemble)
found=$(ls "$RUNS"/*/test_predictions.npz 2> /dev/null | wc -l)
echo "$found of $expected runs wrote their test report"
[ "$found" = "$expected" ]
