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

import os
import sys

from textattn import data as data_lib
from textattn import run as runner
from textattn.errors import RunError
from textattn.tasks.classification import predictions
from textattn.tasks.classification.ensemble import (  # noqa: F401 -- the library's names
  ENSEMBLE_FILE,
  choose_weights,
  combine,
  simplex_grid,
)


def _member(workdir: str, checkpoint: str):
  """(classifier, its Dataset) of one workdir."""
  classifier = runner.load(workdir, checkpoint)
  data = data_lib.load_dataset(classifier.config, workdir, write=False)
  return classifier, data


def run(workdirs: list[str], out: str, checkpoint: str = "best", step: float = 0.05) -> dict:
  if len(workdirs) < 2:
    raise data_lib.DataError("an ensemble needs two or more --workdir.")
  if any(os.path.abspath(out) == os.path.abspath(w) for w in workdirs):
    raise data_lib.DataError(f"--out={out} is one of the members; give a new directory.")
  if os.path.exists(out) and not os.path.isdir(out):
    raise data_lib.DataError(f"--out={out} is a file; give a directory (new, or an earlier "
                             f"ensemble's).")
  if os.path.exists(os.path.join(out, "config.json")) or os.path.isdir(
      os.path.join(out, "checkpoints")):
    raise data_lib.DataError(f"--out={out} is a training run's workdir, whose test report an "
                             f"ensemble would replace; give a new directory.")
  if not (0 < step <= 0.5 and abs(round(1 / step) * step - 1) < 1e-9):
    raise data_lib.DataError(f"--step={step} is invalid; it must divide 1 (e.g. 0.05, 0.1).")
  for workdir in workdirs:  # (a run stopped early has checkpoints but no test report)
    if not os.path.isfile(os.path.join(workdir, predictions.PREDICTIONS_FILE)):
      raise data_lib.DataError(f"{workdir} has no test report ({predictions.PREDICTIONS_FILE}): an "
                               f"ensemble member must be a finished run; finish it by running "
                               f"its command again, or give another workdir.")
  return combine([_member(w, checkpoint) for w in workdirs], workdirs, out, step)


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
  from textattn.command_line import flags_parser
  app.run(main, flags_parser=flags_parser(None))
