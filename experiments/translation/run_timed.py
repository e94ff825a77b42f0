"""Runs a command and prefixes each output line with the seconds since launch; then reports the
first validation line at or above a threshold (time to accuracy).

    python experiments/translation/run_timed.py --threshold=0.67 --log=LOG -- \
      python -m textattn.main --config=configs/spa_eng_transformer.py --workdir=DIR ...
"""

import argparse
import re
import subprocess
import sys
import time


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--threshold", type=float, default=0.67)
  parser.add_argument("--log", required=True)
  parser.add_argument("command", nargs=argparse.REMAINDER)
  args = parser.parse_args()
  command = args.command[1:] if args.command[:1] == ["--"] else args.command
  start = time.time()
  reached = None
  with open(args.log, "a", encoding="utf-8") as log:
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, bufsize=1)
    for line in process.stdout:
      stamped = f"[{time.time() - start:8.1f}s] {line}"
      log.write(stamped)
      log.flush()
      sys.stdout.write(stamped)
      match = re.search(r"step (\d+): val accuracy ([0-9.]+)", line)
      if match and reached is None and float(match.group(2)) >= args.threshold:
        reached = (time.time() - start, int(match.group(1)), float(match.group(2)))
    code = process.wait()
    summary = (f"time to val accuracy >= {args.threshold}: {reached[0]:.0f} s (step {reached[1]}, "
               f"{reached[2]:.4f})" if reached else
               f"val accuracy never reached {args.threshold}")
    log.write(f"{summary}; exit {code}; total {time.time() - start:.0f} s\n")
    print(summary)
  sys.exit(code)


if __name__ == "__main__":
  main()
