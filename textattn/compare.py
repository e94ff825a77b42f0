"""Paired comparison of two finished runs on the same test examples.

    python -m textattn.compare runs/softmax runs/fastformer

Reads each workdir's `test_predictions.npz` (written at the end of every run: per test
example its label and predicted class probabilities, from the parameters the test report used)
and prints both accuracies, their difference with a 95% confidence interval for the paired
difference (normal approximation over examples: each example contributes +1, 0 or -1), and
McNemar's exact test (two-sided binomial test on the examples exactly one run gets right).
The runs must have evaluated the same examples in the same order: same count, same labels.

This measures how sure a difference is *for these two trained models* on this test set; it
says nothing about seed-to-seed variation, which needs several seeds per configuration.
"""

from __future__ import annotations

import os
import sys

from textattn.data.file_source import is_local_file
from textattn.run import read_workdir_config
from textattn.tasks.classification.predictions import (  # noqa: F401 -- the library's names
  PREDICTIONS_FILE,
  CompareError,
  Comparison,
  compare,
  load_predictions,
  load_run,
  mcnemar_exact_p,
  write_predictions,
)


def check_same_test_split(workdir_a: str, workdir_b: str) -> None:
  """CompareError when the two runs' configs (where both have one: an ensemble's output has
  none) say their test splits differ: another dataset or test file, or, for a local file whose
  test split is carved from it, another val_fraction or data_seed. Equal labels (what
  `compare` checks) do not prove the same examples: a carve of a file sorted by label gives
  the same label sequence for any seed with the same class counts."""
  if not all(os.path.isfile(os.path.join(w, "config.json")) for w in (workdir_a, workdir_b)):
    return
  identities = []
  for workdir in (workdir_a, workdir_b):
    config = read_workdir_config(workdir)
    identity = {"dataset": config.dataset, "source.test_file": config.source.test_file}
    if not config.source.test_file and is_local_file(config.dataset):
      identity.update(val_fraction=config.val_fraction, data_seed=config.data_seed)
    identities.append(identity)
  a, b = identities
  for field in ("dataset", "source.test_file", "val_fraction", "data_seed"):
    if a.get(field) != b.get(field):
      raise CompareError(f"the runs' test splits differ: config.{field} is {a.get(field)!r} in "
                         f"{workdir_a} and {b.get(field)!r} in {workdir_b}; a paired comparison "
                         f"needs the same test examples.")


def report(a: str, b: str, result: Comparison) -> str:
  low, high = result.ci95
  return "\n".join([
      f"test examples: {result.count:,}",
      f"A {a}: accuracy {result.accuracy_a:.4f}",
      f"B {b}: accuracy {result.accuracy_b:.4f}",
      f"B - A: {100 * result.difference:+.2f} points, 95% CI [{100 * low:+.2f}, {100 * high:+.2f}]",
      (f"only A right: {result.only_a_right:,}; only B right: {result.only_b_right:,}; "
       f"McNemar exact p = {result.mcnemar_p:.3g}"),
  ])


def main(argv: list[str]) -> int:
  if len(argv) != 3:
    print("usage: python -m textattn.compare WORKDIR_A WORKDIR_B", file=sys.stderr)
    return 2
  try:
    labels_a, probabilities_a, names_a = load_run(argv[1])
    labels_b, probabilities_b, names_b = load_run(argv[2])
    check_same_test_split(argv[1], argv[2])
    if names_a is not None and names_b is not None and names_a != names_b and len(
        names_a) == len(names_b):
      raise CompareError(f"the runs have different classes ({names_a} and {names_b}); a "
                         f"paired comparison needs runs of the same dataset and label set.")
    result = compare(labels_a, probabilities_a, labels_b, probabilities_b)
  except CompareError as error:  # the user's input: one line, exit 2 (as a usage error)
    print(f"error: {error}", file=sys.stderr)
    return 2
  print(report(argv[1], argv[2], result))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
