"""Shared pytest setup: JAX on the CPU unless JAX_PLATFORMS says otherwise, quiet, and float32
matrix products in full float32 (on GPUs JAX's default is TF32, about 1e-3 relative error,
which the float32 tolerances here are not meant for; on CPUs this changes nothing).

The suite is written for the CPU, which is where CI runs it. On a GPU
(`JAX_PLATFORMS=cuda python -m pytest ...`, see experiments/gpu/check.sh) the tests that need
the CPU -- those marked `cpu_only`, and every case parametrised with the CPU-only `native`
kernel -- are skipped with the reason.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
# "auto" on a CPU picks native or XLA kernels by timing them per shape on first use
# (textattn/attention/calibration.py); the suite must not depend on timings, so it keeps the
# rule that needs none (native wherever it runs). Tests of the calibration set it themselves.
os.environ.setdefault("TEXTATTN_CPU_AUTO", "native")
# The suite's models are tiny, so on the CPU it spends most of its time in XLA's compiler, not
# running code: LLVM at -O0 (with the jitted seq2seq tests, the suite 24 -> 12 min on CPU-5,
# experiments/RESULTS.md section 20), and on the CPU XLA's older loop emitters for fusions
# instead of the MLIR fusion emitters (each of the many small programs a test compiles, eager
# ops included, ~40% faster: test_models.py + test_sequence.py 130 -> 72 s on CPU-7).
# Subprocesses (textattn.main, benchmark points) inherit them. Production runs keep XLA's
# defaults; an explicit level in $XLA_FLAGS keeps $XLA_FLAGS as it is.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  _FAST_COMPILE = ["--xla_backend_optimization_level=0"]
  if os.environ["JAX_PLATFORMS"] == "cpu":  # (a CPU flag; GPU images run other XLA versions)
    _FAST_COMPILE.append("--xla_cpu_use_fusion_emitters=false")
  os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", "")] + _FAST_COMPILE).strip()

# One JAX compilation cache for this test run: its workers and the processes its tests start
# (textattn.main runs, two-process runs) compile the same tiny programs again and again. A size
# limit makes JAX lock the cache files (filelock), so processes compiling the same program at
# once are safe; the cache is new for each run and removed at its end, so nothing is reused from
# an older checkout. A cache given in $JAX_COMPILATION_CACHE_DIR is used as it is.
_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  import tempfile
  _OWN_CACHE = tempfile.mkdtemp(prefix="textattn-tests-jax-cache-")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE
  os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 << 30))
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

import pytest


def pytest_configure(config):
  config.addinivalue_line("markers", "cpu_only: needs JAX's CPU backend (skipped elsewhere)")


def pytest_collection_modifyitems(config, items):
  import jax
  if jax.default_backend() == "cpu":
    return
  skip = pytest.mark.skip(reason=f"needs the CPU backend (this run: {jax.default_backend()})")
  for item in items:
    params = getattr(getattr(item, "callspec", None), "params", {})
    native = any(isinstance(value, str) and value == "native" for value in params.values())
    if item.get_closest_marker("cpu_only") or native:
      item.add_marker(skip)


def pytest_unconfigure(config):
  if _OWN_CACHE:  # (the process that made it; xdist's workers inherit it from the controller)
    import shutil
    shutil.rmtree(_OWN_CACHE, ignore_errors=True)


@pytest.fixture
def toy():
  """tests/toy_attention.py's plugin variant "toy_mean" imported in this process, and
  unregistered afterwards: other tests in the same worker see the built-in variants only."""
  import importlib
  import sys

  from textattn import attention
  module = importlib.import_module("tests.toy_attention")
  yield module
  attention.unregister(module.VARIANT.name)
  sys.modules.pop("tests.toy_attention", None)
