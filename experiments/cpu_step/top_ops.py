"""The operations of a traced benchmark step, slowest first: microseconds per step and calls per
step of each XLA operation (by its HLO name, e.g. copy_bitcast_fusion.4; look it up in an
--xla_dump_to dump of the same program to see what it computes). Issue 56.

    XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true python -m textattn.benchmark \
        --mode=train_step --config=configs/imdb_keras_example.py \
        --config.model.attention=additive --repeats=60 --warmup=10 --profile_dir=/tmp/prof
    python experiments/cpu_step/top_ops.py /tmp/prof [rows]
"""

import collections
import glob
import gzip
import json
import sys

# Trace events that are not XLA operations (as experiments/pretrained/profile_step.py).
NOT_OPERATIONS = ("ThunkExecutor", "$", "Slinky", "PjitFunction", "ThreadpoolListener",
                  "Wait for", "end:", "Common", "DevicePut", "ParseArguments")


def main() -> None:
  path = glob.glob(sys.argv[1] + "/**/perfetto_trace.json.gz", recursive=True)[0]
  with gzip.open(path) as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
  steps = sum("benchmark_step" in e["name"] for e in spans)
  total, calls = collections.defaultdict(float), collections.Counter()
  for e in spans:
    if not e["name"].startswith(NOT_OPERATIONS) and "benchmark_step" not in e["name"]:
      total[e["name"]] += e["dur"]
      calls[e["name"]] += 1
  print(f"{steps} traced steps; operations {sum(total.values()) / steps:.0f} us a step (summed)")
  rows = int(sys.argv[2]) if len(sys.argv) > 2 else 30
  for name, us in sorted(total.items(), key=lambda kv: -kv[1])[:rows]:
    print(f"{us / steps:8.1f} us/step  {calls[name] / steps:4.1f} calls/step  {name}")


if __name__ == "__main__":
  main()
