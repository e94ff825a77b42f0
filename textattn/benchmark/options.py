"""The benchmark's fixed choices and default sizes: what its flags offer (cli.py) and what the
plan falls back on (plan.py). Imports nothing heavy, so `--help` stays instant."""

from __future__ import annotations

# decode_step: one cached decoding step of a causal attention layer (one new position against a
# cache of seq_len positions), the cost per generated token.
# attention+backward: the attention layer alone, forward and backward (what a kernel is judged by).
MODES = ("attention", "attention+backward", "forward", "forward+backward", "train_step",
         "decode_step")
DTYPES = ("float32", "bfloat16")
INJECTABLE_FAILURES = ("error", "oom", "timeout")
# How long the random examples of a batch are: "half_to_full" = uniform in [L/2, L] with the
# first example full (padding, as real text has); "full" = every example L tokens (no padding:
# the work of a model that ignores the mask, such as the seed Keras model).
LENGTHS = ("half_to_full", "full")
# The modes --mesh applies to.
MESH_MODES = ("attention", "attention+backward", "forward", "forward+backward")

# Sizes benchmarked in the attention / forward / forward+backward modes when no flag is given.
# Additive attention against the best softmax kernel the platform has ("auto": on a CPU native or
# fused, whichever was timed faster at that length; cuDNN flash on a GPU in bfloat16) and the
# naive reference.
SYNTHETIC_DEFAULTS = {"variants": "softmax_auto,softmax,additive_auto",
                      "seq_lens": "256,512,1024,2048,4096",
                      "batch_size": 4, "embed_dim": 256, "num_heads": 4, "num_layers": 1,
                      "dtype": "float32", "vocab_size": 1000}

# decode_step's defaults: the causal variants, cache lengths 16 to 8,192, one sentence at a time.
DECODE_DEFAULTS = {**SYNTHETIC_DEFAULTS, "batch_size": 1,
                   "variants": "causal,causal_additive,causal_additive_recurrent",
                   "seq_lens": "16,64,256,1024,4096,8192"}
