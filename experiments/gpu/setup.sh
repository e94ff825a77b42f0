# Sourced by the scripts in this folder on a lent GPU machine: installs the wheels carried in
# .whl/ (see check.sh) into /tmp/site and sets the environment; OUT defaults to /tmp/gpu_out.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
  .whl/*.whl .whl/pinned/*.whl 2>&1 | grep -v "^WARNING: Target directory" | tail -2
export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false TF_CPP_MIN_LOG_LEVEL=3 \
  PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
