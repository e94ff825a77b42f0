"""Weighted ensembles of trained workdirs, weights chosen on the validation split only.

    python -m textattn.ensemble --workdir=runs/nbsvm --workdir=runs/fastformer --out=runs/ens

Every member is a finished classification workdir of the same data set, carve and classes
(same dataset, val_fraction and data_seed: the same validation and test examples, checked).
Each member encodes the text with its own saved tokenizer and predicts with the parameters its
test report used (`--checkpoint`, default best); its test probabilities are the report's own
(test_predictions.npz) where it used those parameters, else computed (ensemble.json says
which). The ensemble's probabilities are the weighted mean of the members' probabilities; the weights are the point of a grid over the simplex (steps
of `--step`) with the highest validation accuracy, ties going to the lower validation log-loss
and then to the more even weights. The test split is read once, after the weights are fixed.

Writes OUT/ensemble.json (members, weights, validation and test accuracy, weighted F1, the
members' own accuracies) and OUT/test_predictions.npz (so `python -m textattn.compare` pairs it
with any run), and prints one line. Written atomically; OUT may not be a member.
"""

from __future__ import annotations

import itertools
import os
import sys

import numpy as np

from textattn import compare
from textattn import data as data_lib
from textattn import run as runner
from textattn.data import DataError
from textattn.errors import RunError
from textattn.metrics import summarize_eval, write_json_atomic

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


def _member(workdir: str, checkpoint: str):
  """(classifier, config, validation split, test split) of one workdir."""
  classifier = runner.load(workdir, checkpoint)
  data = data_lib.load_dataset(classifier.config, workdir, write=False)
  return classifier, data


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


def run(workdirs: list[str], out: str, checkpoint: str = "best", step: float = 0.05) -> dict:
  if len(workdirs) < 2:
    raise data_lib.DataError("an ensemble needs two or more --workdir.")
  if any(os.path.abspath(out) == os.path.abspath(w) for w in workdirs):
    raise data_lib.DataError(f"--out={out} is one of the members; give a new directory.")
  if not (0 < step <= 0.5 and abs(round(1 / step) * step - 1) < 1e-9):
    raise data_lib.DataError(f"--step={step} is invalid; it must divide 1 (e.g. 0.05, 0.1).")
  for workdir in workdirs:  # (a run stopped early has checkpoints but no test report)
    if not os.path.isfile(os.path.join(workdir, compare.PREDICTIONS_FILE)):
      raise data_lib.DataError(f"{workdir} has no test report ({compare.PREDICTIONS_FILE}): an "
                               f"ensemble member must be a finished run; finish it by running "
                               f"its command again, or give another workdir.")
  members = [_member(w, checkpoint) for w in workdirs]
  _same_examples(members, workdirs)
  data = members[0][1]
  if len(data.validation) == 0:
    raise data_lib.DataError("the members have no validation split to choose weights on.")
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
  compare.write_predictions(out, labels, test.astype(np.float32), data.class_names,
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
    labels, probabilities, class_names = compare.load_run(workdir)
    with np.load(os.path.join(workdir, compare.PREDICTIONS_FILE)) as archive:
      step = int(archive["params_from_step"])
  except (compare.CompareError, KeyError, OSError, ValueError):
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


def main(argv) -> None:
  from absl import flags, logging
  del argv
  values = flags.FLAGS
  if not values["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  try:
    result = run(values.workdir, values.out, values.checkpoint, values.step)
  except (data_lib.DataError, RunError) as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(1)
  weights = ", ".join(f"{m['weight']:.2f} {os.path.basename(os.path.normpath(m['workdir']))}"
                      for m in result["members"])
  print(f"Ensemble ({weights}): validation accuracy {result['val_accuracy']:.4f}, test "
        f"accuracy {result['test_accuracy']:.4f} ({result['test_count']} examples); wrote "
        f"{os.path.join(values.out, ENSEMBLE_FILE)}.")


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  from absl import app, flags
  flags.DEFINE_multi_string("workdir", [], "A finished training workdir; give two or more.")
  flags.DEFINE_string("out", None, "Where ensemble.json and test_predictions.npz go.")
  flags.DEFINE_string("checkpoint", "best", "Each member's parameters: best, last or a step.")
  flags.DEFINE_float("step", 0.05, "The weight grid's step (weights are multiples of it).")
  flags.mark_flag_as_required("out")
  app.run(main)
