"""Sample translations of a finished translation run: N test pairs drawn with a fixed seed, as a
Markdown table of source, reference, greedy and beam outputs (test_translations.jsonl, with the
sources re-derived from the run's config: same file, same split).

    python experiments/translation/samples.py runs/spa_eng --count=20 --seed=0
"""

import argparse
import json
import pathlib

import numpy as np

from textattn.data import pairs as pairs_lib


def load_test(workdir, dataset=""):
  """(pairs, test pair indices, test_translations.jsonl rows) of a finished run, the sources
  re-derived from its config (same file, same split)."""
  config = json.loads(pathlib.Path(workdir, "config.json").read_text())
  pairs = pairs_lib.read_pairs(dataset or config["dataset"], config["source_field"],
                               config["target_field"])
  test = pairs_lib.split_indices(pairs, config["data_seed"],
                                 config["split_by"] == "source")["test"]
  rows = [json.loads(line) for line in pathlib.Path(
      workdir, "test_translations.jsonl").read_text(encoding="utf-8").splitlines()]
  assert len(rows) == len(test), "test_translations.jsonl does not match the split"
  return pairs, test, rows


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("workdir")
  parser.add_argument("--count", type=int, default=20)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--dataset", default="", help="the pairs file, if it moved")
  args = parser.parse_args()
  pairs, test, rows = load_test(args.workdir, args.dataset)
  outputs = [k for k in rows[0] if k != "reference"]
  print("| source | reference | " + " | ".join(outputs) + " |")
  print("|---|---|" + "---|" * len(outputs))
  for i in sorted(np.random.default_rng(args.seed).choice(len(rows), args.count, replace=False)):
    cells = [pairs.sources[test[i]], rows[i]["reference"]] + [rows[i][k] for k in outputs]
    print("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")


if __name__ == "__main__":
  main()
