# Sourced by the scripts in this folder on a lent GPU machine: installs the wheels carried in
# .whl/ (see check.sh) into /tmp/site and sets the environment; OUT defaults to /tmp/gpu_out.
#
# REHEARSE=1 (tests/test_gpu_scripts.py runs every script so): a CPU rehearsal with this
# checkout's own environment, JAX_PLATFORMS=cpu (Pallas kernels in interpret mode), toy sizes
# where a script runs something (each script sets them when $REHEARSE is 1), a stand-in for
# nvidia-smi, and `wired` commands only checked, not run (experiments/gpu/rehearse.py).
#
# PYTHON: the interpreter every script runs (default python3 from PATH); tests/test_gpu_scripts.py
# passes its own (sys.executable), so an unactivated venv's suite rehearses with that venv.
set -u
export PYTHON=${PYTHON:-python3}
REHEARSE=${REHEARSE:-0}
if [ "$REHEARSE" = 1 ]; then
  export PYTHONPATH=$PWD JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=3 PYTHONUNBUFFERED=1
  OUT=${OUT:-$(mktemp -d /tmp/gpu_rehearsal.XXXXXX)}; mkdir -p "$OUT"
  nvidia-smi() { echo "rehearsal (no GPU): nvidia-smi $*"; }
  # wired [--timeout=S] ARGS: the wiring of `$PYTHON ARGS` (module, flags, files), not the run.
  # Each check is recorded in $OUT/rehearsal.log (background jobs included); at exit the script
  # says how many held and fails if one did not.
  wired() {
    [[ "$1" == --timeout=* ]] && shift
    if "$PYTHON" experiments/gpu/rehearse.py "$@" > "$OUT/rehearse_last.log" 2>&1; then
      echo "ok python3 $*" >> "$OUT/rehearsal.log"
    else
      echo "FAILED python3 $*" >> "$OUT/rehearsal.log"; cat "$OUT/rehearse_last.log" >&2
      return 1
    fi
  }
  rehearsal_summary() {
    local ok failed
    ok=$(grep -c "^ok " "$OUT/rehearsal.log" 2>/dev/null); failed=$(grep -c "^FAILED " "$OUT/rehearsal.log" 2>/dev/null)
    echo "rehearsal: ${ok:-0} wired commands held, ${failed:-0} failed (OUT=$OUT)"
    [ "${failed:-0}" = 0 ] || exit 1
  }
  trap rehearsal_summary EXIT
else
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
    .whl/*.whl .whl/pinned/*.whl 2>&1 | grep -v "^WARNING: Target directory" | tail -2
  export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false TF_CPP_MIN_LOG_LEVEL=3 \
    PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
  OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
  # wired [--timeout=S] ARGS: `$PYTHON ARGS`, under `timeout S` if given (SIGTERM, which a
  # training run answers by saving a checkpoint; SIGKILL 30 s later if it has not ended).
  wired() {
    if [[ "$1" == --timeout=* ]]; then local t=${1#--timeout=}; shift; timeout -k 30 "$t" "$PYTHON" "$@"
    else "$PYTHON" "$@"; fi
  }
fi
