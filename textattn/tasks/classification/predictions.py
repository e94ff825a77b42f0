"""A classification run's test predictions (test_predictions.npz) and the paired comparison of
two runs on the same test examples (textattn.compare's and textattn.ensemble's library).

The comparison gives both accuracies, their difference with a 95% confidence interval for the
paired difference (normal approximation over examples: each example contributes +1, 0 or -1),
and McNemar's exact test (two-sided binomial test on the examples exactly one run gets right).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import numpy as np

from textattn.data.cache import atomic_write

PREDICTIONS_FILE = "test_predictions.npz"


class CompareError(ValueError):
  """A workdir without predictions, or two runs not evaluated on the same examples."""


@dataclasses.dataclass(frozen=True)
class Comparison:
  count: int
  accuracy_a: float
  accuracy_b: float
  difference: float  # accuracy_b - accuracy_a
  ci95: tuple[float, float]
  only_a_right: int
  only_b_right: int
  mcnemar_p: float


def write_predictions(workdir: str, labels: np.ndarray, probabilities: np.ndarray,
                      class_names: list[str], params_from_step: int) -> None:
  """DIR/test_predictions.npz, written by training at the end of every run: for every test
  example, in the split's order, its label and the class probabilities the reported
  parameters predict."""
  if probabilities.shape != (len(labels), len(class_names)):
    raise ValueError(f"probabilities {probabilities.shape} do not match {len(labels)} labels "
                     f"and {len(class_names)} classes.")
  arrays = {"labels": np.asarray(labels, np.int32),
            "probabilities": np.asarray(probabilities, np.float32),
            "class_names": np.array(class_names), "params_from_step": np.int64(params_from_step)}
  atomic_write(os.path.join(workdir, PREDICTIONS_FILE), lambda f: np.savez(f, **arrays), "wb")


def load_predictions(workdir: str) -> tuple[np.ndarray, np.ndarray]:
  """(labels [N], probabilities [N, C]) of a finished run; CompareError (one sentence) for a
  missing, unreadable or truncated file, or contents that are not predictions: labels outside
  0..C-1, probabilities that are not finite numbers."""
  labels, probabilities, _ = load_run(workdir)
  return labels, probabilities


def load_run(workdir: str) -> tuple[np.ndarray, np.ndarray, list[str] | None]:
  """load_predictions plus the run's class names (None in a file written without them)."""
  path = os.path.join(workdir, PREDICTIONS_FILE)
  if not os.path.isfile(path):
    try:  # (a finished run of another task has none: say so, not "unfinished")
      with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
        task = str(json.load(f).get("task", ""))
    except (OSError, ValueError, AttributeError):
      task = ""
    raise CompareError(
        f"{workdir} is a {task} run: compare pairs classifiers' test predictions (language "
        f"models: experiments/language_model/compare.py)." if task not in ("", "classification")
        else f"{path} does not exist: give the workdir of a run that finished (runs write their "
        f"test predictions there at the end).")
  try:
    with np.load(path, allow_pickle=False) as archive:
      labels, probabilities = archive["labels"], archive["probabilities"]
      class_names = ([str(name) for name in archive["class_names"].tolist()]
                     if "class_names" in archive.files else None)
  except Exception as error:  # noqa: BLE001 -- truncated zip (BadZipFile, EOFError), a missing
    # array (KeyError), a pickled object (ValueError), an I/O error: all one sentence.
    raise CompareError(f"{path} is not a readable predictions file ({type(error).__name__}: "
                       f"{' '.join(str(error).split())}); rerun the evaluation or give another "
                       f"workdir.") from None
  if (labels.ndim != 1 or probabilities.ndim != 2 or probabilities.shape[:1] != labels.shape
      or not np.issubdtype(labels.dtype, np.integer)
      or not np.issubdtype(probabilities.dtype, np.floating)):
    raise CompareError(f"{path} holds labels {labels.shape} {labels.dtype} and probabilities "
                       f"{probabilities.shape} {probabilities.dtype}; expected integer labels "
                       f"[N] and float probabilities [N, classes].")
  classes = probabilities.shape[1]
  if class_names is not None and len(class_names) != classes:
    raise CompareError(f"{path} names {len(class_names)} classes but holds probabilities for "
                       f"{classes}; the file is damaged.")
  bad = np.flatnonzero((labels < 0) | (labels >= classes))
  if bad.size:
    raise CompareError(f"{path}: label {labels[bad[0]]} of test example {bad[0]} (and "
                       f"{bad.size - 1} more) is outside the classes 0..{classes - 1}; the file "
                       f"is damaged.")
  finite = np.isfinite(probabilities).all(axis=1)
  if not finite.all():
    first = int(np.flatnonzero(~finite)[0])
    raise CompareError(f"{path}: the probabilities of {int((~finite).sum())} test example(s) "
                       f"(first: example {first}) are not finite (NaN or infinity); they must be "
                       f"finite numbers: compare runs whose test reports are finite.")
  return labels, probabilities, class_names


def mcnemar_exact_p(only_a: int, only_b: int) -> float:
  """Two-sided exact McNemar p-value: 2 P(X <= min) for X ~ Binomial(only_a + only_b, 1/2),
  its terms summed in log space (integer binomial coefficients took minutes past ~20,000
  discordant examples); relative error ~1e-10, 0.0 below float's range (~1e-308)."""
  n = only_a + only_b
  if n == 0:
    return 1.0
  log_terms = np.array([math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                        for k in range(min(only_a, only_b) + 1)]) - n * math.log(2)
  top = log_terms.max()
  return min(1.0, 2 * math.exp(top) * float(np.exp(log_terms - top).sum()))


def compare(labels_a: np.ndarray, probabilities_a: np.ndarray, labels_b: np.ndarray,
            probabilities_b: np.ndarray) -> Comparison:
  if probabilities_a.shape[1:] != probabilities_b.shape[1:]:
    raise CompareError(f"the runs have different class counts ({probabilities_a.shape[1]} and "
                       f"{probabilities_b.shape[1]}); a paired comparison needs runs of the same "
                       f"dataset and label set.")
  if labels_a.shape != labels_b.shape or not np.array_equal(labels_a, labels_b):
    raise CompareError(
        f"the runs were not evaluated on the same test examples ({len(labels_a)} and "
        f"{len(labels_b)} examples{', labels differ' if len(labels_a) == len(labels_b) else ''}); "
        f"a paired comparison needs the same dataset, test split and order.")
  right_a = probabilities_a.argmax(-1) == labels_a
  right_b = probabilities_b.argmax(-1) == labels_b
  n = len(labels_a)
  per_example = right_b.astype(np.float64) - right_a
  difference = float(per_example.mean())
  stderr = float(per_example.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
  only_a = int(np.sum(right_a & ~right_b))
  only_b = int(np.sum(right_b & ~right_a))
  return Comparison(count=n, accuracy_a=float(right_a.mean()), accuracy_b=float(right_b.mean()),
                    difference=difference,
                    ci95=(difference - 1.96 * stderr, difference + 1.96 * stderr),
                    only_a_right=only_a, only_b_right=only_b,
                    mcnemar_p=mcnemar_exact_p(only_a, only_b))
