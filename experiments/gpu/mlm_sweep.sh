#!/usr/bin/env bash
# Masked-language-model pretraining for several epochs, then a validation-only fine-tuning sweep,
# on a lent GPU (experiments/RESULTS.md, section 8). Never sees the test split.
#
# Here, first (the exports are gitignored; .gpu/ is listed in .git/info/exclude):
#   TFDS_DATA_DIR=../shared/tensorflow_datasets python -m textattn.sweep export-corpus \
#     --config=configs/imdb_fastformer.py --out=.gpu/corpus_800.npz
#   cp .sweep/imdb_800.npz .gpu/   # (python -m textattn.sweep export --config=configs/imdb_fastformer.py)
# Device tool: carry [".whl", ".gpu"], command "bash experiments/gpu/mlm_sweep.sh".
# PHASE=pretrain or PHASE=finetune runs one half (encoders are kept in .gpu/ on the machine).
source experiments/gpu/setup.sh
PHASE=${PHASE:-all}
S="-m textattn.sweep"   # python3 $S ... (was experiments/val_sweep.py)

# Pretraining settings: batch 256, lr 1e-3, 15% of the tokens (at most 128 / 64 per text). The
# configs then had the random start, 3 epochs, word dropout 0.2 and no bigram embeddings; the
# overrides pin them (MLM pretraining trains the token table itself and refuses the word2vec
# start and the hashed bigram embeddings the configs now use).
P20='"model.embedding_init":"random","model.bigram_buckets":0,"pretrain.unlabeled_split":"unsupervised","pretrain.batch_size":256,"pretrain.num_steps":5664,"pretrain.warmup_steps":500'
P5='"model.embedding_init":"random","model.bigram_buckets":0,"pretrain.unlabeled_split":"unsupervised","pretrain.batch_size":256,"pretrain.num_steps":1416,"pretrain.warmup_steps":200'
FF="pretrain.max_predictions=128"; SM="pretrain.max_predictions=64"
V20="model.embedding_init=random,model.bigram_buckets=0,num_epochs=3,model.token_dropout_rate=0.2,pretrain.objective=mlm,pretrain.unlabeled_split=unsupervised,pretrain.batch_size=256,pretrain.num_steps=5664,pretrain.warmup_steps=500"
V5="model.embedding_init=random,model.bigram_buckets=0,num_epochs=3,model.token_dropout_rate=0.2,pretrain.objective=mlm,pretrain.unlabeled_split=unsupervised,pretrain.batch_size=256,pretrain.num_steps=1416,pretrain.warmup_steps=200"

if [ "$PHASE" != finetune ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  for job in "ff20 configs/imdb_fastformer.py {$P20,\"pretrain.max_predictions\":128,\"log_every_steps\":472}" \
             "ff5 configs/imdb_fastformer.py {$P5,\"pretrain.max_predictions\":128,\"log_every_steps\":118}" \
             "sm20 configs/imdb_softmax.py {$P20,\"pretrain.max_predictions\":64,\"log_every_steps\":472}"; do
    set -- $job
    wired $S pretrain --corpus=.gpu/corpus_800.npz --config=$2 --overrides="$3" \
      --out=.gpu/enc_$1.npz > "$OUT/pretrain_$1.log" 2>&1 &
  done
  wait
  tail -n 2 "$OUT"/pretrain_*.log
  cp .gpu/enc_*.npz "$OUT"/ 2>/dev/null
fi

if [ "$PHASE" != pretrain ]; then
  wired $S sweep --data=.gpu/imdb_800.npz --config=configs/imdb_fastformer.py --seeds=0,1,2 \
    --jobs=12 --encoder=.gpu/enc_ff20.npz --out="$OUT/ff_mlm20.jsonl" \
    --variant="mlm20:$V20,$FF" --variant="mlm20_lr3e-4:$V20,$FF,optimizer.learning_rate=3e-4" \
    > "$OUT/ff_mlm20.log" 2>&1 &
  wired $S sweep --data=.gpu/imdb_800.npz --config=configs/imdb_fastformer.py --seeds=0,1,2 \
    --jobs=6 --encoder=.gpu/enc_ff5.npz --out="$OUT/ff_mlm5.jsonl" \
    --variant="mlm5:$V5,$FF" --variant="mlm5_lr3e-4:$V5,$FF,optimizer.learning_rate=3e-4" \
    > "$OUT/ff_mlm5.log" 2>&1 &
  wired $S sweep --data=.gpu/imdb_800.npz --config=configs/imdb_softmax.py --seeds=0,1,2 \
    --jobs=6 --encoder=.gpu/enc_sm20.npz --out="$OUT/sm_mlm20.jsonl" \
    --variant="mlm20:$V20,$SM" --variant="mlm20_lr3e-4:$V20,$SM,optimizer.learning_rate=3e-4" \
    > "$OUT/sm_mlm20.log" 2>&1 &
  wait
  grep -h -A4 "^variant" "$OUT"/*_mlm*.log; grep -h '"error"' "$OUT"/*.jsonl | cut -c1-600 | head -3
fi
