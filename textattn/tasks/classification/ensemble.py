"""Weighted ensembles of trained classifiers, the weights chosen on the validation split only
(the command: textattn/ensemble.py, which loads the members).

The ensemble's probabilities are the weighted mean of the members' probabilities; the weights
are the point of a grid over the simplex (steps of `step`) with the highest validation
accuracy, ties going to the lower validation log-loss and then to the more even weights. The
test split is read once, after the weights are fixed.
"""

from __future__ import annotations

import itertools
import os

import numpy as np

from textattn.data import DataError
from textattn.metrics import summarize_eval, write_json_atomic
from textattn.tasks.classification import predictions

ENSEMBLE_FILE = "ensemble.json"


def simplex_grid(members: int, step: float) -> np.ndarray:
  """All weight vectors with entries in multiples of `step` summing to 1: [points, members]."""
  units = round(1 / step)
  if members == 1:
    return np.ones((1, 1))
  points = [c + (units - sum(c),) for c in itertools.product(range(units + 1), repeat=members - 1)
            if sum(c) <= units]
  return np.array(points, np.float64) / units


def choose_weights(probabilities: list[np.ndarray], labels: np.ndarray,
                   step: float = 0.05) -> tuple[np.ndarray, float, float]:
  """(weights, validation accuracy, validation log-loss) of the best grid point."""
  stacked = np.stack(probabilities)  # [members, N, classes]
  best = None
  for weights in simplex_grid(len(probabilities), step):
    mixed = np.einsum("m,mnc->nc", weights, stacked)
    accuracy = float(np.mean(mixed.argmax(-1) == labels))
    loss = float(-np.mean(np.log(np.maximum(mixed[np.arange(len(labels)), labels], 1e-12))))
    key = (-accuracy, round(loss, 9), float(np.abs(weights - 1 / len(weights)).sum()))
    if best is None or key < best[0]:
      best = (key, weights, accuracy, loss)
  return best[1], best[2], best[3]


def _same_examples(members, workdirs) -> None:
  first_config, first_data = members[0][0].config, members[0][1]
  for (classifier, data), workdir in zip(members[1:], workdirs[1:]):
    for field in ("dataset", "val_fraction", "data_seed"):
      if classifier.config[field] != first_config[field]:
        raise DataError(f"{workdir} has config.{field}={classifier.config[field]!r} but "
                        f"{workdirs[0]} has {first_config[field]!r}; ensemble members must share "
                        f"the data set and its validation carve.")
    if data.class_names != first_data.class_names:
      raise DataError(f"{workdir} has classes {data.class_names}, {workdirs[0]} "
                      f"{first_data.class_names}; ensemble members must share them.")
    for split in ("validation", "test"):
      if not np.array_equal(getattr(data, split).labels, getattr(first_data, split).labels):
        raise DataError(f"{workdir} and {workdirs[0]} do not hold the same {split} examples "
                        f"(labels differ); ensemble members must share the data set and carve.")


def combine(members: list, workdirs: list[str], out: str, step: float = 0.05) -> dict:
  """Chooses the weights of `members` ([(classifier, its Dataset)], loaded from `workdirs`) on
  validation, mixes their test probabilities, writes OUT/ensemble.json and
  OUT/test_predictions.npz (atomically), and returns the ensemble.json record."""
  _same_examples(members, workdirs)
  data = members[0][1]
  if len(data.validation) == 0:
    raise DataError("the members have no validation split to choose weights on.")
  names = [os.path.basename(os.path.normpath(w)) for w in workdirs]
  val = [c.probabilities(d.validation.inputs, progress=f"{name} validation")
         for (c, d), name in zip(members, names)]
  weights, val_accuracy, val_loss = choose_weights(val, data.validation.labels, step)
  # The test split, once the weights are fixed.
  tests, sources = zip(*(_test_probabilities(c, d, w, f"{name} test")
                         for (c, d), w, name in zip(members, workdirs, names)))
  test = np.einsum("m,mnc->nc", weights, np.stack(tests))
  labels = data.test.labels
  result = {
      "members": [{"workdir": w, "checkpoint_step": int(c.step), "weight": float(x),
                   "val_accuracy": float(np.mean(v.argmax(-1) == data.validation.labels)),
                   "test_accuracy": float(np.mean(t.argmax(-1) == labels)),
                   "test_probabilities": source}
                  for w, (c, _), x, v, t, source in zip(workdirs, members, weights, val, tests,
                                                        sources)],
      "val_accuracy": val_accuracy, "val_loss": val_loss,
      **_test_metrics(labels, test, data.class_names), "grid_step": step,
  }
  os.makedirs(out, exist_ok=True)
  predictions.write_predictions(out, labels, test.astype(np.float32), data.class_names,
                            params_from_step=-1)
  write_json_atomic(os.path.join(out, ENSEMBLE_FILE), result)
  return result


def _test_probabilities(classifier, data, workdir: str, progress: str) -> tuple[np.ndarray, str]:
  """A member's test probabilities and where they came from: its run's own test report
  ("test report": test_predictions.npz) where that used the parameters loaded here (the same
  step) on the same test examples, which saves a second pass over the test split (25,000 IMDB
  reviews through a pretrained encoder are ~20 minutes on a 2-core CPU); else "computed" now.
  The two agree to float rounding (predict reproduces a run's test report)."""
  try:
    labels, probabilities, class_names = predictions.load_run(workdir)
    with np.load(os.path.join(workdir, predictions.PREDICTIONS_FILE)) as archive:
      step = int(archive["params_from_step"])
  except (predictions.CompareError, KeyError, OSError, ValueError):
    step = None
  if (step == int(classifier.step) and class_names == list(data.class_names)
      and np.array_equal(labels, data.test.labels)):
    return probabilities, "test report"
  return classifier.probabilities(data.test.inputs, progress=progress), "computed"


def _test_metrics(labels: np.ndarray, probabilities: np.ndarray, class_names) -> dict:
  """The classifier's test metrics (metrics.summarize_eval) of the mixed probabilities."""
  classes = len(class_names)
  predicted = probabilities.argmax(-1)
  confusion = np.zeros((classes, classes))
  np.add.at(confusion, (labels, predicted), 1)
  chosen = np.maximum(probabilities[np.arange(len(labels)), labels], 1e-12)
  metrics = summarize_eval({"loss_sum": float(-np.log(chosen).sum()), "count": len(labels),
                            "correct": float((predicted == labels).sum()),
                            "confusion": confusion}, class_names, "test")
  return {key.replace("/", "_"): value for key, value in metrics.items()}


