#!/usr/bin/env bash
# GPU checks on a lent machine (the `device` tool; see experiments/RESULTS.md, section 12).
#
# The machine has JAX with CUDA but none of our pinned flax/optax/orbax, ml_collections or
# tensorboardX, and no package index: those travel as wheels in .whl/ (gitignored):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 -d .whl ml-collections==1.1.0 \
#     tensorboardX==2.6.5
#   ... -d .whl/pinned flax==0.12.8 optax==0.2.8 orbax-checkpoint==0.12.8
# Run (device tool): carry [".whl"], command "bash experiments/gpu/check.sh".
# Rehearsal on a CPU (tests/test_gpu_scripts.py): REHEARSE=1 bash experiments/gpu/check.sh
# It has no TensorFlow/TFDS either, so tests/test_data.py (mock TFDS data) is not run.
source experiments/gpu/setup.sh

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$PYTHON" -c "import jax, flax, optax, orbax.checkpoint as o; \
print('jax', jax.__version__, jax.devices(), 'flax', flax.__version__, 'optax', optax.__version__)"

# 1. The suite's GPU-relevant files on the GPU (the CPU-only tests -- native kernel, fake CPU
#    devices -- are expected to skip or be refused there; the log says which).
wired --timeout=300 -m pytest -q -p no:cacheprovider -n 8 -rfEs --timeout=240 \
  ${TESTS:-tests/test_attention.py tests/test_models.py tests/test_train.py \
  tests/test_benchmark.py tests/test_configs.py tests/test_tokenizer.py} \
  > "$OUT/pytest_gpu.log" 2>&1
echo "pytest exit $?"; tail -30 "$OUT/pytest_gpu.log"

# 2. Run-to-run determinism and exact resume on the GPU, with config.platform.deterministic off and on
#    (experiments/gpu/determinism.py).
wired --timeout=240 experiments/gpu/determinism.py 2>&1 | grep -v "^W0000\|^I0000" | tail -12

# 3. The seed model's full train step (forward, backward, Adam) on the GPU, with the default
#    config.platform.deterministic=True and with it off. float32 matrix products are JAX's GPU default
#    (TF32).
bench() {
  wired -m textattn.benchmark --mode=train_step --config=configs/imdb_keras_example.py \
    --warmup=5 --repeats=50 --out_dir=/tmp/bench --overwrite "$@" 2>&1 | grep -E "^train_step|rror" | head -3
}
# (a rehearsal checks the command once: the loops only change flag values)
[ "$REHEARSE" = 1 ] && BATCHES=${BATCHES:-32} ATTENTIONS=${ATTENTIONS:-additive} DETERMINISTIC=${DETERMINISTIC:-False}
for batch in ${BATCHES:-32 256}; do
  for attention in ${ATTENTIONS:-softmax additive}; do
    for deterministic in ${DETERMINISTIC:-True False}; do
      echo "batch=$batch $attention deterministic=$deterministic"
      bench --batch_size=$batch --config.model.attention=$attention \
        --config.platform.deterministic=$deterministic
    done
  done
done
echo "native off the CPU (must be refused in one sentence):"
bench --config.model.attention_impl=native
