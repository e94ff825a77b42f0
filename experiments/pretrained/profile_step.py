"""Where a MiniLM fine-tuning step's time goes on a CPU: one jit-compiled training step (the
throughput script's: batch 32, 256 tokens, AdamW, dropout on) traced with jax.profiler, its XLA
operations summed by kind (ynn_fusion: YNNPACK's matmuls and the elementwise work fused into
them; ffi_call: textattn's native attention kernel; the rest: XLA's own fusions).

    XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true \
        python experiments/pretrained/profile_step.py --model DIR/all-MiniLM-L6-v2
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import batches, training_step


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", required=True)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--max_len", type=int, default=256)
  parser.add_argument("--attention_impl", default="auto")
  args = parser.parse_args()
  from textattn.pretrained import hf
  vocab_size = hf.read_config(hf.resolve(args.model)).vocab_size
  tokens, labels = batches(vocab_size, args.batch, args.max_len, 3)
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
  [trace] = glob.glob(os.path.join(directory, "**", "perfetto_trace.json.gz"), recursive=True)
  with gzip.open(trace) as f:
    events = json.load(f)
  events = events["traceEvents"] if isinstance(events, dict) else events
  total, count = collections.Counter(), collections.Counter()
  for event in events:
    if event.get("ph") == "X" and not event["name"].startswith(("ThunkExecutor", "$", "Slinky",
                                                                "PjitFunction")):
      kind = re.sub(r"[.\d]+$", "", event["name"])
      total[kind] += event["dur"] / 1e3
      count[kind] += 1
  if not total:
    sys.exit("no XLA operations in the trace: set XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true")
  print(f"step: {wall * 1e3:.0f} ms wall; operations: {sum(total.values()):.0f} ms summed "
        f"(some run side by side)")
  for kind, ms in total.most_common(12):
    print(f"{ms:8.1f} ms  {count[kind]:4d}x  {kind}")


if __name__ == "__main__":
  main()
