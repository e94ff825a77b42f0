"""Translate with a trained translation workdir.

    python -m textattn.translate --workdir=runs/spa_eng --text="How are you?" [--beam=4]
    python -m textattn.translate --workdir=runs/spa_eng --input=sentences.txt --json \
        [--plugin=MODULE]

One translation per input line (standardised words, as the model was trained: lower case, no
punctuation), or with --json one JSON line {"text", "translation"}; a text with no word
translates to "", and one longer than the model's source_len words is translated from its first
source_len (the command says how many). --beam=0 is greedy search; N > 0 beam search with the
workdir's length penalty. From Python:
`textattn.translate.load(workdir).translate(texts, beam=4)`.
"""

from __future__ import annotations

import json
import os
import sys

from textattn.command_line import text_lines
from textattn.errors import DataError, user_errors


def load(workdir: str, checkpoint: str = "best", plugins=()):
  """The translator of a translation workdir (textattn/tasks/translation.py's Translator);
  `plugins`: the modules the run was trained with --plugin."""
  from textattn import run  # (lazy: `python -m textattn.translate --help` stays instant)
  translator = run.load(workdir, checkpoint, plugins)
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
  if values.beam < 0:
    print(f"error: --beam={values.beam} must be >= 0 (0 = greedy search).", file=sys.stderr)
    sys.exit(2)
  with user_errors():
    texts = text_lines(values.text, values.input)
    translator = load(values.workdir, values.checkpoint, values.plugin)
    outputs = translator.translate(texts, values.beam)
  cut = translator.cut(texts)
  if cut:
    print(f"Note: {cut} text(s) have more than source_len={translator.config.source_len} words; "
          f"each was translated from its first {translator.config.source_len}.", file=sys.stderr)
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
  flags.DEFINE_multi_string("plugin", [], "A module to import first that registers the "
                            "attention variant the run used (as textattn.main --plugin).")
  flags.mark_flag_as_required("workdir")
  from textattn.command_line import flags_parser
  app.run(main, flags_parser=flags_parser(None))
