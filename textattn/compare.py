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

import sys

from textattn.tasks.classification.predictions import (  # noqa: F401 -- the library's names
  PREDICTIONS_FILE,
  CompareError,
  Comparison,
  check_same_test_split,
  compare,
  load_predictions,
  load_run,
  mcnemar_exact_p,
  write_predictions,
)


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
