"""Where a MiniLM fine-tuning step's time goes on a CPU: one training step of the throughput
script (batch 32, 256 tokens, AdamW, dropout on), textattn's (jit-compiled, traced with
jax.profiler) or transformers' (eager, torch.profiler).

textattn: XLA's operations by kind (ynn_fusion: YNNPACK's matmuls and the elementwise work
fused into them; ffi_call: textattn's native attention kernel; the rest: XLA's own fusions),
twice: "wall" shares every instant of the step among the operations running then (XLA runs
independent operations side by side, so their durations overlap), and "(no operation)" is the
time none ran; "summed" adds the durations.

    XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true \
        python experiments/pretrained/profile_step.py --model DIR/all-MiniLM-L6-v2

Any benchmarked step (e.g. the seed model's, issue 56): trace it with the benchmark's
--profile_dir, then split the trace the same way (per step: the benchmark traces several):

    XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true python -m textattn.benchmark --mode=train_step \
        --config=configs/imdb_keras_example.py --repeats=20 --profile_dir=/tmp/seed_profile
    python experiments/pretrained/profile_step.py --trace=/tmp/seed_profile
    PYTHONPATH=<torch, transformers> python experiments/pretrained/profile_step.py \
        --model DIR/all-MiniLM-L6-v2 --framework transformers
"""

import argparse
import collections
import glob
import gzip
import itertools
import json
import os
import re
import sys
import tempfile
import time

import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import batches, training_step, transformers_training_step

# Trace events that are not XLA operations (executor, thread pool and Python frames).
NOT_OPERATIONS = ("ThunkExecutor", "$", "Slinky", "PjitFunction", "ThreadpoolListener",
                  "Wait for", "end:", "Common", "DevicePut", "ParseArguments")


def wall_shares(operations: list[tuple[float, float, str]]) -> collections.Counter:
  """Milliseconds of the span of `operations` ((start, end, kind) in microseconds) per kind,
  each instant divided equally among the operations running then; "(no operation)" the rest."""
  edges = sorted({t for start, end, _ in operations for t in (start, end)})
  starts = collections.defaultdict(list)
  ends = collections.defaultdict(list)
  for start, end, kind in operations:
    starts[start].append(kind)
    ends[end].append(kind)
  running, share = collections.Counter(), collections.Counter()
  for a, b in itertools.pairwise(edges):
    running.update(starts[a])
    running.subtract(ends[a])
    count = sum(running.values())
    if count == 0:
      share["(no operation)"] += (b - a) / 1e3
    for kind, n in running.items():
      if n:
        share[kind] += (b - a) / 1e3 * n / count
  return share


def summarize_trace(directory: str, wall: float | None = None, rows: int = 14) -> None:
  """Print the operations of the perfetto trace under `directory` by kind, per traced step
  (steps: the benchmark's 'benchmark_step' annotations, else one)."""
  [trace] = glob.glob(os.path.join(directory, "**", "perfetto_trace.json.gz"), recursive=True)
  with gzip.open(trace) as f:
    events = json.load(f)
  events = events["traceEvents"] if isinstance(events, dict) else events
  steps = [e for e in events if e.get("ph") == "X" and e["name"].startswith("benchmark_step")]
  operations = [(e["ts"], e["ts"] + e["dur"], re.sub(r"[.\d]+$", "", e["name"]))
                for e in events
                if e.get("ph") == "X" and not e["name"].startswith(NOT_OPERATIONS)
                and not e["name"].startswith("benchmark_step")]
  if not operations:
    sys.exit("no XLA operations in the trace: set XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true")
  n = max(len(steps), 1)
  if steps:
    wall = sum(e["dur"] for e in steps) / 1e6
  total, count = collections.Counter(), collections.Counter()
  for start, end, kind in operations:
    total[kind] += (end - start) / 1e3 / n
    count[kind] += 1
  # Wall shares step by step (the gaps between steps are not a step's).
  share = collections.Counter()
  for e in steps or [None]:
    inside = (operations if e is None else
              [op for op in operations if e["ts"] <= op[0] < e["ts"] + e["dur"]])
    share.update({k: v / n for k, v in wall_shares(inside).items()})
  if steps:  # the time inside a step before its first operation and after its last
    share["(no operation)"] += wall * 1e3 / n - sum(share.values())
  head = f"step: {wall * 1e3 / n:.2f} ms wall, mean of {n}; " if wall is not None else ""
  print(f"{head}operations: {sum(total.values()):.2f} ms summed")
  print("    wall    summed  calls  kind")
  for kind, ms in share.most_common(rows):
    print(f"{ms:8.2f} {total[kind]:9.2f} {count[kind] / n:6.0f}  {kind}")


def profile_textattn(args, tokens, labels) -> None:
  step, params, opt_state = training_step(args.model, args.attention_impl, args.max_len)
  for i in range(2):  # compilation and warm-up
    params, opt_state, loss = step(params, opt_state, tokens[i], labels[i], i)
    loss.block_until_ready()
  directory = tempfile.mkdtemp()
  jax.profiler.start_trace(directory, create_perfetto_trace=True)
  start = time.perf_counter()
  params, opt_state, loss = step(params, opt_state, tokens[2], labels[2], 2)
  loss.block_until_ready()
  wall = time.perf_counter() - start
  jax.profiler.stop_trace()
  summarize_trace(directory, wall)


def profile_transformers(args, tokens, labels) -> None:
  import torch

  from textattn.attention.common import usable_cores
  step, _ = transformers_training_step(args.model, usable_cores(), args.hf_attention_dropout)
  for i in range(2):
    step(tokens[i], labels[i])
  with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
    start = time.perf_counter()
    step(tokens[2], labels[2])
    wall = time.perf_counter() - start
  print(f"step: {wall * 1e3:.0f} ms wall")
  print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", help="the MiniLM directory (or --trace)")
  parser.add_argument("--trace", help="summarise this directory's perfetto trace and stop")
  parser.add_argument("--rows", type=int, default=14)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--max_len", type=int, default=256)
  parser.add_argument("--attention_impl", default="auto")
  parser.add_argument("--framework", choices=("textattn", "transformers"), default="textattn")
  parser.add_argument("--hf_attention_dropout", type=float, default=0.0)
  args = parser.parse_args()
  if args.trace:
    summarize_trace(args.trace, rows=args.rows)
    return
  if not args.model:
    sys.exit("--model (the MiniLM directory) or --trace is needed.")
  from textattn.pretrained import hf
  vocab_size = hf.read_config(hf.resolve(args.model)).vocab_size
  tokens, labels = batches(vocab_size, args.batch, args.max_len, 3)
  if args.framework == "textattn":
    profile_textattn(args, tokens, labels)
  else:
    profile_transformers(args, tokens, labels)


if __name__ == "__main__":
  main()
