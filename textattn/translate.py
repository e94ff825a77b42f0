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


class Translator:
  def __init__(self, workdir: str, checkpoint: str = "best"):
    import ml_collections

    from textattn import predict, translation
    from textattn.data import DataError
    path = os.path.join(workdir, "config.json")
    if not os.path.isfile(path):
      raise DataError(f"{workdir} has no config.json: it is not a textattn training workdir.")
    with open(path) as f:
      self.config = ml_collections.ConfigDict(json.load(f))
    if self.config.get("task") != "translation":
      raise DataError(f"{workdir} is not a translation run (its config has no "
                      f"task='translation'); use python -m textattn.predict for classifiers.")
    self.source_tokenizer, self.target_tokenizer = translation.load_tokenizers(workdir)
    self.model = translation.build_model(self.config, self.source_tokenizer.vocab_size,
                                         self.target_tokenizer.vocab_size)
    length = self.config.source_len + self.config.target_len + 1
    self.step, params = predict.restore_params(
        workdir, checkpoint, self.config, translation.Packed(self.model), length)
    self.params = params["model"]

  def translate(self, texts: list[str], beam: int = 0) -> list[str]:
    from textattn import translation
    from textattn.data import pairs
    sources = self.source_tokenizer.encode([pairs.standardize_source(t) for t in texts],
                                           self.config.source_len, "post", standardized=True)
    return translation.translate_ids(self.model, self.params, sources, self.target_tokenizer,
                                     int(self.config.eval_batch_size), beam,
                                     float(self.config.length_penalty))


def load(workdir: str, checkpoint: str = "best") -> Translator:
  return Translator(workdir, checkpoint)


def main(argv) -> None:
  from absl import flags, logging
  del argv
  values = flags.FLAGS
  if not values["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  from textattn.data import DataError
  from textattn.errors import RunError
  if bool(values.text) == bool(values.input):
    print("error: give the texts with --text=STR (repeatable) or --input=FILE (one per line), "
          "not both and not neither.", file=sys.stderr)
    sys.exit(2)
  if values.beam < 0:
    print(f"error: --beam={values.beam} must be >= 0 (0 = greedy search).", file=sys.stderr)
    sys.exit(2)
  try:
    texts = values.text
    if values.input:
      try:
        with open(values.input, encoding="utf-8") as f:
          texts = [line.rstrip("\n") for line in f if line.strip()]
      except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"--input={values.input}: cannot be read as UTF-8 text ({e}).") from None
    translator = load(values.workdir, values.checkpoint)
    outputs = translator.translate(texts, values.beam)
  except (DataError, RunError) as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(1)
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
