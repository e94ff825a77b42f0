"""Sequence-length benchmark: step time, compile time, FLOPs and peak memory per variant x length.

    python -m textattn.benchmark --variants=softmax,softmax_chunked,additive \
        --seq_lens=256,1024,4096 --batch_size=4 --embed_dim=256 --num_heads=4 --num_layers=1 \
        --mode=forward+backward --out_dir=runs/seq_len

    # The real training step of a config (what the speed work measures): examples/s.
    python -m textattn.benchmark --mode=train_step --config=configs/imdb_keras_example.py

Every (variant, length) point runs in its own subprocess, so its peak memory is its own and an
out-of-memory, a crash or a hang costs that point only: it is recorded with status "oom",
"timeout" or "error" and a message, and the sweep goes on. Results go to `out_dir`:
results.csv, results.md, time_vs_length.png and memory_vs_length.png.

Variants are `<attention>[_<implementation>]`, for any attention in the registry
(textattn.attention) and any implementation it accepts; the bare name is its reference
implementation. Built in: softmax (reference einsum, "xla"), softmax_dot_product
(jax.nn.dot_product_attention), softmax_cudnn (the same with implementation="cudnn"; GPU,
bfloat16/float16 only; unverified), softmax_splash (JAX's Pallas TPU splash attention; TPU, or
interpret mode on a CPU, so not a speed there), softmax_chunked (memory-efficient exact softmax),
softmax_fused (CPU layout), causal (and causal_<implementation>), additive (Fastformer, the XLA
function), additive_native (its C++ kernel), additive_pallas (its Pallas kernels; interpret mode on
a CPU, so not a speed there), additive_pallas_tpu (its Pallas TPU kernels, also labelled "pallas";
TPU interpret mode on a CPU), additive_auto (as "auto" in a config: native where it runs and was
timed faster at that length, textattn/attention/calibration.py; each point resolves at its own
length), and
causal_additive_recurrent (the scan) with causal_additive_recurrent_chunked. Each row's `kernel`
column names the kernel that ran (the registry's labels: naive, flash, splash, fused, native,
pallas, scan, chunked, ...; an "auto" row is labelled by what it resolved to). The default
comparison is additive against the platform's best softmax (softmax_auto: cuDNN flash on a GPU in
bfloat16, splash on a TPU) and the naive one (softmax, labelled "naive"). --plugin=MODULE
(repeatable) imports a module that registers more, here and in every point's subprocess:

    python -m textattn.benchmark --plugin=my_pkg.my_attention --variants=softmax,my_attention

What is timed (--mode):
  attention         the attention module alone, projections included, on x ~ N(0, 1) [B, L, E];
  attention+backward  the same, forward and backward: jax.value_and_grad of sum(out * c) (c a
                    fixed random cotangent) with respect to its parameters and x;
  forward           the Classifier (train=False) on random tokens;
  forward+backward  jax.value_and_grad of the mean cross-entropy of that Classifier (train=False,
                    so no dropout) with respect to all parameters;
  train_step        textattn.tasks.classification.step.train_step (forward with dropout,
                    backward, optimizer update, state donated) of the classifier --config
                    describes.
Inputs are right-padded (the model modes: on the side the config's layout pads): example 0 has
all L real tokens, the others a length drawn uniformly from [L/2, L] (seeded; --lengths=full: all
L). Token ids are uniform in [1, vocab_size); labels uniform in [0, num_classes). Tokens/s and
the FLOP figures count all B * L positions, padding included; most kernels cost the same either
way, but the native CPU softmax kernel skips key blocks that are all padding, so it does less
work than the others at half_to_full lengths: compare kernels' speed with --lengths=full.

Where the model's size comes from: in train_step mode from --config
(textattn.defaults.classification() if not given): its model, batch_size, max_len (the length)
and optimizer; any of --variants, --seq_lens, --batch_size, --embed_dim, --num_heads,
--num_layers, --dtype, --vocab_size given explicitly overrides the config. In the other modes
those flags set the benchmarked sizes (defaults below) and the config supplies only the remaining
model fields (ffn_dim, mlp_dim, pooling, norm, ...).

Measurements, per point:
  compile_s   wall time of jit(...).lower(...).compile() (tracing + XLA compilation), apart from
              the step times;
  median_ms, p90_ms, min_ms
              over --repeats calls after --warmup calls, each synchronised with
              jax.block_until_ready;
  flops       compiled.cost_analysis()["flops"]. XLA counts a while loop's body once, not once
              per trip, so kernels built on lax.map/scan (softmax_chunked) are under-counted;
  peak_bytes  on CPU: the compiled program's footprint from compiled.memory_analysis(),
              argument + output + temp - alias bytes (temp is XLA's buffer assignment of every
              intermediate, reuse included; alias is output memory shared with donated inputs).
              It excludes the Python/JAX runtime itself; rss_peak_bytes (the child process's
              ru_maxrss, runtime included) is recorded next to it as a cross-check.
              On GPU: device.memory_stats()["peak_bytes_in_use"] after the timed calls.
  first_call_ms  the first call after compilation (a warm-up call, when there is one).
A point whose memory_analysis footprint exceeds --point_memory_limit_gb (CPU only) is recorded as
"oom" without being run; before it runs, the child's address space is capped at its size after
compilation plus that limit (RLIMIT_AS), so a footprint the analysis underestimated fails as
"oom" too instead of swapping the machine.
--mesh=data:D,sequence:S (modes attention, attention+backward, forward, forward+backward): each
point runs on a D x S device mesh, the batch split over D and the length over S (the variants'
sequence-sharded attention, textattn/attention/sequence.py; the model via models.build_model's
mesh; on a CPU the point's process gets D x S fake devices, whose step times share the machine's
cores and say nothing about real devices). Extra columns: mesh ("DxS"); peak_bytes is per
device; comm_layer_bytes, the collective operand bytes per device of one attention layer's
forward + backward at the point's sizes, read from its compiled HLO, and comm_formula_bytes, the
stated formula's figure (collectives.py; float32 only); comm_step_bytes, the timed program's
collectives; ring_blocks, the chunk-blocks each sequence device computes in softmax's and causal's
ring ("9/9/9/9": balanced).
--profile_dir=DIR: after its timed calls each point runs 10 more under jax.profiler.trace, each
annotated as step "benchmark_step", into DIR/<variant>_L<length> (tensorboard --logdir=DIR, or
XProf, shows where a step's time goes).
--point_time_budget_s bounds the calls of slow points (a 100-s step is not run 12 times); every
row says how many warm-up and timed calls it made.

Modules: cli.py (flags, main; options.py holds their choices and defaults), driver.py (what main
does once the flags are parsed: the sweep, or one point), plan.py (variant names, sizes, one spec
per point), sweep.py (the subprocess per point), measure.py (one point, in its subprocess: compile,
time, record), builders.py (the point's timed function and arguments, per mode), utilization.py
(FLOP and bandwidth figures), report.py (CSV, Markdown, plots), collectives.py (bytes
communicated, from HLO and by formula), layer_cost.py (one layer's compiled memory and
communication on a mesh, also for experiments/seq_parallel).
"""
