#!/usr/bin/env bash
# Run HERE (a machine with a package index), not on the GPU machine, which has none: brings the
# GPU script's peer package (experiments/gpu/peer.py) as a wheel, without its dependencies, for
# the GPU machine's Python (3.12), into .peer/ (gitignored, never committed); the device call
# then carries it: carry [".whl", ".peer"], command "bash experiments/gpu/accelerators.sh".
#   bash experiments/gpu/prepare_peer.sh        # PEER_VERSION=0.1.0 by default
# jax-linear-attention 0.1.0 is a pure-Python wheel (0.9 MB) that pins jax==0.11.2 (the H200's
# JAX in RESULTS section 28); peer.py says so and skips where the machine's JAX differs.
set -euo pipefail
cd "$(dirname "$0")/../.."
"${PYTHON:-python3}" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
  -d .peer "jax-linear-attention==${PEER_VERSION:-0.1.0}"
ls -l .peer
