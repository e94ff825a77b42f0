#!/usr/bin/env bash
# Issue 41's (and 52's) behaviour check: trains four configs for a short budget with the textattn found in
# CHECKOUT (a git worktree of the code to test) and leaves their workdirs in OUT.
#   git worktree add /tmp/old 4f22bde && bash experiments/runner_equivalence/run.sh /tmp/old OUT_OLD
#   bash experiments/runner_equivalence/run.sh . OUT_NEW
#   python experiments/runner_equivalence/compare.py OUT_OLD OUT_NEW
# Needs IMDB in TFDS format ($TFDS_DATA_DIR, default ../shared/tensorflow_datasets) and the
# English-Spanish pairs ($SPA_TXT, default ../shared/data/spa-eng/spa.txt).
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
checkout="$(cd "$1" && pwd)"; out="$(mkdir -p "$2" && cd "$2" && pwd)"
export TFDS_DATA_DIR="${TFDS_DATA_DIR:-$here/../shared/tensorflow_datasets}"
spa="${SPA_TXT:-$here/../shared/data/spa-eng/spa.txt}"
cd "$checkout"  # python -m puts the checkout first on sys.path: its textattn is the one run
config() {  # old checkouts take a path, new ones a path or a name
  echo "$checkout/configs/$1.py"
}
python -m textattn.main --config="$(config imdb_keras_example)" --workdir="$out/imdb_keras_example" \
  --config.num_train_steps=300
python -m textattn.main --config="$(config imdb_bow_bigram)" --workdir="$out/imdb_bow_bigram" \
  --config.num_train_steps=300 --config.eval_every_steps=100 --config.checkpoint_every_steps=100
# A pretrained encoder's fine-tune: the tests' tiny BERT (tests/fixtures/tiny_bert) on IMDB.
python -m textattn.main --config="$(config imdb_minilm)" --workdir="$out/imdb_tiny_bert" \
  --config.model.pretrained="$here/tests/fixtures/tiny_bert" --config.max_len=32 \
  --config.num_train_steps=60 --config.eval_every_steps=30 --config.checkpoint_every_steps=30 \
  --config.optimizer.warmup_steps=6
python -m textattn.main --config="$(config spa_eng_transformer)" --workdir="$out/spa_eng_transformer" \
  --config.dataset="$spa" --config.num_train_steps=200 --config.eval_every_steps=100 \
  --config.checkpoint_every_steps=100 --config.beam_size=2
