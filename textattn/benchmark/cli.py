"""`python -m textattn.benchmark`: its flags and main (see textattn/benchmark/__init__.py).

main hands the parsed flags to driver.py: the parent checks them, plans one spec per (variant,
length) and runs the sweep (sweep.py); with --point_spec the same command is the child that
measures one point (measure.py). Only options.py is imported here, so `--help` is instant.
"""

from __future__ import annotations

import sys

from absl import app, flags
from ml_collections import config_flags

from textattn.benchmark.options import (
  DTYPES,
  INJECTABLE_FAILURES,
  LENGTHS,
  MODES,
  SYNTHETIC_DEFAULTS,
)

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (configs/*.py). train_step mode: the model, batch, max_len and "
    "optimizer benchmarked (default: textattn.defaults.classification()). Other modes: only the "
    "model fields the flags below do not set.", lock_config=True)
_VARIANTS = flags.DEFINE_string(
    "variants", None, "Comma list of variants: <attention> (its reference implementation) or "
    "<attention>_<implementation>, for any registered attention (softmax, causal, additive, or "
    "one a --plugin registers) and any implementation it accepts, e.g. softmax_dot_product, "
    "softmax_cudnn, softmax_splash, softmax_chunked, softmax_fused, causal_fused, additive_native. Default: the "
    f"config's variant (train_step) or {SYNTHETIC_DEFAULTS['variants']!r}.")
_PLUGINS = flags.DEFINE_multi_string(
    "plugin", [], "Module (dotted name) that registers attention variants; imported here and in "
    "every point's subprocess before the point is built. Repeatable.")
_SEQ_LENS = flags.DEFINE_string(
    "seq_lens", None, "Comma list of sequence lengths. Default: config.max_len (train_step) or "
    f"{SYNTHETIC_DEFAULTS['seq_lens']!r}.")
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", None, "Batch size. Default: config.batch_size (train_step) or "
    f"{SYNTHETIC_DEFAULTS['batch_size']}.")
_EMBED_DIM = flags.DEFINE_integer(
    "embed_dim", None, "Embedding size. Default: the config's (train_step) or "
    f"{SYNTHETIC_DEFAULTS['embed_dim']}.")
_NUM_HEADS = flags.DEFINE_integer(
    "num_heads", None, "Attention heads. Default: the config's (train_step) or "
    f"{SYNTHETIC_DEFAULTS['num_heads']}.")
_NUM_LAYERS = flags.DEFINE_integer(
    "num_layers", None, "Encoder blocks. Default: the config's (train_step) or "
    f"{SYNTHETIC_DEFAULTS['num_layers']}.")
_DTYPE = flags.DEFINE_enum(
    "dtype", None, DTYPES, "Compute dtype. Default: the config's (train_step) or "
    f"{SYNTHETIC_DEFAULTS['dtype']}.")
_VOCAB_SIZE = flags.DEFINE_integer(
    "vocab_size", None, "Vocabulary size of the classifier. Default: config.vocab_size "
    f"(train_step) or {SYNTHETIC_DEFAULTS['vocab_size']}.")
_NUM_CLASSES = flags.DEFINE_integer("num_classes", 2, "Output classes of the classifier.")
_MODE = flags.DEFINE_enum("mode", "forward+backward", MODES, "What is timed.")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed calls after compilation.")
_REPEATS = flags.DEFINE_integer("repeats", 10, "Timed calls; median and p90 are over these.")
_OUT_DIR = flags.DEFINE_string(
    "out_dir", "", "Where results.csv, results.md and the plots are written; default "
    "runs/benchmark/<UTC date-time>, new each run. A directory already holding results is "
    "refused unless --overwrite.")
_OVERWRITE = flags.DEFINE_bool(
    "overwrite", False, "Replace the results already in --out_dir (they are rewritten point by "
    "point, so an interrupted sweep leaves a partial table there).")
_POINT_TIME_BUDGET_S = flags.DEFINE_float(
    "point_time_budget_s", 0.0, "If > 0: no further warm-up or timed call starts once a point's "
    "calls have taken this many seconds; at least one call is timed (if the warm-up used the "
    "budget, its last call is the timed one). The row's warmup and repeats say what was done. "
    "0 = always --warmup + --repeats calls.")
_POINT_TIMEOUT_S = flags.DEFINE_float(
    "point_timeout_s", 600.0, "Wall-clock limit (> 0) of one point's subprocess (import, "
    "compile, warm-up, repeats); past it the point is recorded as 'timeout'.")
_POINT_MEMORY_LIMIT_GB = flags.DEFINE_float(
    "point_memory_limit_gb", 8.0, "CPU only: a point whose compiled footprint exceeds this many "
    "GiB is recorded as 'oom' without running, and the point's address space is capped at its "
    "size at start plus this. 0 = no limit.")
_CHECK_AGAINST_REFERENCE = flags.DEFINE_bool(
    "check_against_reference", False, "For variants other than their attention's reference "
    "implementation (the registry's; 'xla' for the built-in ones: the einsum kernel, or "
    "additive attention's XLA function): also run the reference on the same parameters and "
    "inputs, where its footprint fits the memory limit, and record the largest absolute "
    "difference of the outputs (attention output, logits, or loss and every gradient) in "
    "max_abs_diff.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the parameters and the random inputs.")
_LENGTHS = flags.DEFINE_enum(
    "lengths", "half_to_full", LENGTHS, "Lengths of the random examples: half_to_full = uniform "
    "in [L/2, L], the first one full (padding, as real text has); full = all L tokens (no "
    "padding).")
_INJECT_FAILURE = flags.DEFINE_string(
    "inject_failure", "", "For testing this tool: comma list of variant@seq_len=kind, kind one of "
    f"{', '.join(INJECTABLE_FAILURES)}; that point fails that way on purpose.")
_PROFILE_DIR = flags.DEFINE_string(
    "profile_dir", "", "If set: after its timed calls, each point runs a few more under "
    "jax.profiler.trace, each annotated as step 'benchmark_step', into DIR/<variant>_L<length> "
    "(view with TensorBoard's profile plugin or XProf: tensorboard --logdir=DIR).")
_MESH = flags.DEFINE_string(
    "mesh", "", "data:D,sequence:S: run each point on a D x S device mesh, the batch split over "
    "D devices and the length over S (sequence parallelism, textattn/attention/sequence.py; "
    "modes attention, attention+backward, forward, forward+backward; on a CPU the point's "
    "process gets D x S CPU devices). Rows add per-device memory, bytes communicated per "
    "attention layer (compiled HLO and formula) and the causal ring's blocks per device. "
    "Default: no mesh (one device's modules).")
_DRY_RUN = flags.DEFINE_bool(
    "dry_run", False, "Check every flag and plan the points, print one line per point (variant, "
    "length, implementation) and stop without running any.")
_POINT_SPEC = flags.DEFINE_string(
    "point_spec", None, "Internal: run the one point described in this JSON file (the sweep "
    "starts one such subprocess per point).")
_POINT_RESULT = flags.DEFINE_string(
    "point_result", None, "Internal: where the point subprocess writes its result.")


# Every flag above, by name, for driver.main.
_FLAGS = [holder for name, holder in globals().items()
          if name.startswith("_") and isinstance(holder, flags.FlagHolder)]


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
  # (lazy: keeps `--help` instant; the registry, the models and JAX load once flags are parsed)
  from textattn.benchmark import driver
  driver.main({holder.name: holder.value for holder in _FLAGS}, sys.argv)
