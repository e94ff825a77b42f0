"""Use a trained classifier on new text: `python -m textattn.predict`, or `textattn.load(...)`.

    python -m textattn.predict --workdir=runs/imdb_fastformer --text="A gripping film." \
        [--text=...] | --input=reviews.txt|.csv|.tsv|.jsonl [--output=predictions.jsonl] \
        [--checkpoint=best|last|STEP] [--plugin=MODULE] [--explain=DIR]

    import textattn
    model = textattn.load("runs/imdb_fastformer")
    model.predict(["A gripping film.", "Dull."])   # [{"text", "label", "probabilities", ...}]
    model.evaluate("labelled.csv")                # accuracy, weighted F1, per class
    model.explain(["A gripping film."])           # + tokens and one weight each

The library side (what the workdir gives, how texts are encoded) is the classification task's
Classifier: textattn/tasks/classification/classifier.py.

One JSON line per input: {"text", "label", "probabilities": {class: p}, "tokens": the number
of tokens the model saw, "truncated": whether the text was longer than max_len}. A blank text
(empty or only whitespace, e.g. an empty line of --input) gets no prediction: "label" and
"probabilities" are null and "tokens" is 0, as training skips such texts rather than learning a
class for them; the command says how many there were. Input files must be UTF-8; invalid bytes are replaced
(U+FFFD) with one warning naming how many lines had them.

--explain=DIR also writes DIR/explain.html (a heat map of each text's tokens) and
DIR/explain.jsonl (tokens and one weight each): attention-pooling weights where the model pools
by attention, gradient x input otherwise (textattn/tasks/classification/explain.py).
"""

from __future__ import annotations

import json
import os
import sys

from textattn.data.cache import atomic_write
from textattn.errors import DataError, user_errors


def check_output(path: str, workdir: str = "", keep: tuple[str, ...] = (),
                 flag: str = "--output") -> None:
  """A DataError unless `path` can be a file written by atomic_write (which makes its folders):
  not a directory, not one of the files `keep` (the --input), not inside the `workdir` (its
  config, checkpoints, report), and its nearest existing ancestor a writable directory."""
  if path.endswith(("/", os.sep)) or os.path.isdir(path):
    raise DataError(f"{flag}={path} is a directory; give a file name, e.g. "
                    f"{os.path.join(path, 'predictions.jsonl')}.")
  def replaced(file):  # (what os.replace replaces: a symlink itself, not what it points to)
    return os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(file))),
                        os.path.basename(file))
  real = replaced(path)
  if any(k and (replaced(k) == real or os.path.realpath(k) == real) for k in keep):
    raise DataError(f"{flag}={path} is the --input file; give another file (nothing written).")
  if workdir and os.path.commonpath([real, os.path.realpath(workdir)]) == os.path.realpath(workdir):
    raise DataError(f"{flag}={path} is inside the --workdir, whose files belong to its run; "
                    f"give a file elsewhere.")
  ancestor = os.path.dirname(os.path.abspath(path))
  while not os.path.exists(ancestor):
    ancestor = os.path.dirname(ancestor)
  if not os.path.isdir(ancestor):
    raise DataError(f"{flag}={path}: {ancestor} is a file, not a folder.")
  if not os.access(ancestor, os.W_OK):
    raise DataError(f"{flag}={path}: the folder {ancestor} is not writable.")


def main(argv) -> None:
  from absl import flags, logging
  del argv
  values = flags.FLAGS
  if not values["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # the libraries' INFO logs only with --verbosity
  if bool(values.text) == bool(values.input):
    print("error: give the texts with --text=STR (repeatable) or --input=FILE, not both and not "
          "neither.", file=sys.stderr)
    sys.exit(2)
  with user_errors():
    if values.output:  # (before the work, not after it)
      check_output(values.output, values.workdir, (values.input,))
    if values.explain and os.path.exists(values.explain) and not os.path.isdir(values.explain):
      raise DataError(f"--explain={values.explain} is a file; give a folder (it gets "
                      f"explain.html and explain.jsonl).")
    import textattn  # (lazy: `python -m textattn.predict --help` stays instant)
    model = textattn.load(values.workdir, values.checkpoint, values.plugin)
    if not hasattr(model, "predict"):
      raise DataError(f"{values.workdir} is a {model.config.task} run, whose model "
                               f"offers no predict; python -m textattn.predict needs a "
                               f"classifier's workdir.")
    texts = values.text or model.read_texts(values.input)
    if not any(text.strip() for text in texts):
      raise DataError(f"{f'--input={values.input}' if values.input else '--text'} holds no "
                      f"text to predict (empty or blank).")
    rows = model.predict(texts, progress="predict")
    if values.explain:
      explained = model.explain(texts)
      try:
        paths = model.write_explanations(
            values.explain, explained,
            title=f"{os.path.basename(os.path.normpath(values.workdir))} (checkpoint step "
                  f"{model.step})")
      except OSError as error:
        raise DataError(f"--explain={values.explain}: cannot be written "
                                 f"({error.strerror}).") from None
  blank = sum(row["label"] is None for row in rows)
  if blank:
    print(f"Note: {blank} blank text(s) (empty or only whitespace) have no prediction: their "
          f"label and probabilities are null.", file=sys.stderr)
  lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
  if values.output:
    with user_errors():
      try:
        atomic_write(values.output, lambda f: f.write(lines))
      except OSError as error:
        raise DataError(f"--output={values.output}: cannot be written ({error.strerror}).") from None
    print(f"Wrote {len(rows)} predictions to {values.output} (checkpoint step {model.step}).",
          file=sys.stderr)
  else:
    sys.stdout.write(lines)
  if values.explain:
    method = model.explanation_method()
    print(f"Wrote explanations of {len(rows)} texts ({method}) to {paths[1]} and {paths[0]}.",
          file=sys.stderr)


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  from absl import app, flags
  flags.DEFINE_string("workdir", None, "A training workdir (python -m textattn.main --workdir).")
  flags.DEFINE_multi_string("text", [], "A text to classify; repeatable.")
  flags.DEFINE_string("input", None, "A file of texts: .txt (one per line), .csv, .tsv, .jsonl "
                      "(the training run's text_fields).")
  flags.DEFINE_string("output", None, "Where the JSON lines go (default: standard output).")
  flags.DEFINE_string("checkpoint", "best", "best (the parameters the test report used), last, "
                      "or a step.")
  flags.DEFINE_multi_string("plugin", [], "A module to import first that registers the "
                            "attention variant the run used (as textattn.main --plugin).")
  flags.DEFINE_string("explain", None, "Also write DIR/explain.html and DIR/explain.jsonl: each "
                      "text's tokens with one weight each (attention-pooling weights, or "
                      "gradient x input).")
  flags.mark_flag_as_required("workdir")
  from textattn.command_line import flags_parser
  app.run(main, flags_parser=flags_parser(None))
