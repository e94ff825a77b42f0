"""Translate with a trained translation workdir.

    python -m textattn.translate --workdir=runs/spa_eng --text="How are you?" [--beam=4]
    python -m textattn.translate --workdir=runs/spa_eng --input=sentences.txt --json

One translation per input line (standardised words, as the model was trained: lower case, no
punctuation), or with --json one JSON line {"text", "translation"[, "score"]}. --beam=0 is
greedy search; N > 0 beam search with the workdir's length penalty. From Python:
`textattn.translate.load(workdir).translate(texts, beam=4)`.
"""

from __future__ import annotations

import json
import os
import sys

from textattn.errors import DataError, user_errors


def load(workdir: str, checkpoint: str = "best"):
  """The translator of a translation workdir (textattn/tasks/translation.py's Translator)."""
  from textattn import run  # (lazy: `python -m textattn.translate --help` stays instant)
  translator = run.load(workdir, checkpoint)
  if not hasattr(translator, "translate"):
    raise DataError(f"{workdir} is not a translation run (it is a {translator.config.task} "
                    f"run); use python -m textattn.predict for classifiers.")
  return translator


def main(argv) -> None:
  from absl import flags, logging
  del argv
  values = flags.FLAGS
  if not values["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  if bool(values.text) == bool(values.input):
    print("error: give the texts with --text=STR (repeatable) or --input=FILE (one per line), "
          "not both and not neither.", file=sys.stderr)
    sys.exit(2)
  if values.beam < 0:
    print(f"error: --beam={values.beam} must be >= 0 (0 = greedy search).", file=sys.stderr)
    sys.exit(2)
  with user_errors():
    texts = values.text
    if values.input:
      try:
        with open(values.input, encoding="utf-8") as f:
          texts = [line.rstrip("\n") for line in f if line.strip()]
      except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"--input={values.input}: cannot be read as UTF-8 text ({e}).") from None
    translator = load(values.workdir, values.checkpoint)
    outputs = translator.translate(texts, values.beam)
  for text, output in zip(texts, outputs):
    print(json.dumps({"text": text, "translation": output}, ensure_ascii=False)
          if values.json else output)


if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  from absl import app, flags
  flags.DEFINE_string("workdir", None, "A translation training workdir.")
  flags.DEFINE_multi_string("text", [], "A sentence to translate; repeatable.")
  flags.DEFINE_string("input", None, "A UTF-8 file, one sentence per line.")
  flags.DEFINE_integer("beam", 0, "Beam size; 0 = greedy search.")
  flags.DEFINE_bool("json", False, "JSON lines {text, translation} instead of plain lines.")
  flags.DEFINE_string("checkpoint", "best", "best, last, or a step.")
  flags.mark_flag_as_required("workdir")
  app.run(main)
