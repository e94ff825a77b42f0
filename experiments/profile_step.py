"""Profile the seed model's default train step: ms/step, then the ops of a 20-step jax.profiler
trace by total time; the trace and the optimised HLO (to name the fusions) go to /tmp/prof.

    taskset -c 0 python experiments/profile_step.py softmax [dense|lazy] [fused|native|xla]
    # or additive
"""

import collections
import glob
import gzip
import json
import shutil
import sys

import jax
from speed_ab import random_batch, run_steps, seed_step


def profile_and_summarize(step, state, batch, trace_dir, steps=20, top=45):
  """A jax.profiler trace of `steps` calls; prints the ops by total time per step."""
  shutil.rmtree(trace_dir, ignore_errors=True)
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    for _ in range(steps):
      state, _ = step(state, batch)
    jax.block_until_ready(state)
  path = glob.glob(trace_dir + "/**/*.trace.json.gz", recursive=True)[0]
  totals = collections.Counter()
  with gzip.open(path) as f:
    for event in json.load(f)["traceEvents"]:
      if event.get("ph") == "X":
        totals[event["name"]] += event["dur"]
  for name, microseconds in totals.most_common(top):
    print(f"{microseconds / steps / 1e3:8.3f} ms  {name[:100]}")
  return state


def main():
  attention = sys.argv[1] if len(sys.argv) > 1 else "softmax"
  update = sys.argv[2] if len(sys.argv) > 2 else "dense"
  kernel = sys.argv[3] if len(sys.argv) > 3 else "fused"
  step, state = seed_step(attention, kernel=kernel, embedding_update=update)
  batch = random_batch()
  state, _ = run_steps(step, state, batch, 20)  # warm-up
  state, seconds = run_steps(step, state, batch, 50)
  print(f"{seconds * 1e3:.1f} ms/step, {32 / seconds:.0f} examples/s")
  state = profile_and_summarize(step, state, batch, f"/tmp/prof/trace_{attention}_{update}_{kernel}")
  with open(f"/tmp/prof/hlo_{attention}_{update}.txt", "w") as f:
    f.write(step.lower(state, batch).compile().as_text())


if __name__ == "__main__":
  main()
