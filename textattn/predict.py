"""Use a trained classifier on new text: `python -m textattn.predict`, or `textattn.load(...)`.

    python -m textattn.predict --workdir=runs/imdb_fastformer --text="A gripping film." \
        [--text=...] | --input=reviews.txt|.csv|.tsv|.jsonl [--output=predictions.jsonl] \
        [--checkpoint=best|last|STEP]

    from textattn import predict
    model = predict.load("runs/imdb_fastformer")
    model.predict(["A gripping film.", "Dull."])   # [{"text", "label", "probabilities", ...}]
    model.evaluate("labelled.csv")                # accuracy, weighted F1, per class

The workdir gives everything: config.json (model, tokenizer settings, text fields), the saved
vocabulary and class names (tokenizer.json, data_info.json) and the checkpoint ("best": the
parameters the run's test report used; "last"; or a step), verified against the checksums
recorded when it was saved. A GPU-trained workdir works on a CPU (attention_impl "auto"
resolves to this machine's kernel). Texts are encoded exactly as in training (standardised,
truncated to max_len as config.truncation says) and run in batches of config.eval_batch_size,
padded to full batches so one compilation serves every call.

One JSON line per input: {"text", "label", "probabilities": {class: p}, "tokens": the number
of tokens the model saw, "truncated": whether the text was longer than max_len}. An empty text
is predicted from no tokens ("tokens": 0). Input files must be UTF-8; invalid bytes are replaced
(U+FFFD) with one warning naming how many lines had them.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys

import numpy as np


class Classifier:
  """A trained workdir's classifier: encode, predict, evaluate (see the module docstring)."""

  def __init__(self, workdir: str, checkpoint: str = "best"):
    import jax
    import ml_collections

    from textattn import data as data_lib
    from textattn import models
    self.workdir = workdir
    config_path = os.path.join(workdir, "config.json")
    if not os.path.isfile(config_path):
      raise data_lib.DataError(f"{workdir} has no config.json: it is not a textattn training "
                               f"workdir (or its run has not started).")
    with open(config_path) as f:
      self.config = ml_collections.ConfigDict(json.load(f))
    self.tokenizer, self.class_names = data_lib.load_tokenizer(workdir)
    if self.tokenizer is None:
      raise data_lib.DataError(f"{workdir} has no saved vocabulary ({data_lib.DATA_INFO_FILE}).")
    model = models.build_model(self.config, len(self.class_names),
                               vocab_size=self.tokenizer.vocab_size)
    self.step, self.params = _restore_params(workdir, checkpoint, self.config)
    self.batch_size = int(self.config.eval_batch_size)

    def probabilities(params, tokens):
      logits = model.apply({"params": params}, tokens, train=False)
      return jax.nn.softmax(logits.astype("float32"), axis=-1)

    self._probabilities = jax.jit(probabilities)

  def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(int32 [N, max_len] as the model trained on them, tokens before truncation [N])."""
    from textattn import data as data_lib
    from textattn.data import tokenizer as tokenizer_lib
    config = self.config
    if self.tokenizer.kind == "byte":
      lengths = np.array([len(text.encode("utf-8")) for text in texts], np.int64)
    else:
      lengths = np.array([len(tokenizer_lib.standardize(text).split()) for text in texts],
                         np.int64)
    inputs = self.tokenizer.encode(texts, config.max_len, config.truncation)
    if data_lib.pads_before(config):
      inputs = data_lib.pad_before(inputs)
    return inputs, lengths

  def predict_proba(self, texts: list[str]) -> np.ndarray:
    """Class probabilities [N, num_classes], in class_names order."""
    inputs, _ = self.encode(list(texts))
    return self._run(inputs)

  def _run(self, inputs: np.ndarray) -> np.ndarray:
    out = []
    for start in range(0, len(inputs), self.batch_size):
      batch = inputs[start:start + self.batch_size]
      padded = np.zeros((self.batch_size, inputs.shape[1]), np.int32)
      padded[:len(batch)] = batch
      out.append(np.asarray(self._probabilities(self.params, padded))[:len(batch)])
    return np.concatenate(out) if out else np.zeros((0, len(self.class_names)), np.float32)

  def predict(self, texts: list[str]) -> list[dict]:
    texts = list(texts)
    inputs, lengths = self.encode(texts)
    probabilities = self._run(inputs)
    return [{"text": text, "label": self.class_names[int(np.argmax(p))],
             "probabilities": {name: float(v) for name, v in zip(self.class_names, p)},
             "tokens": int(min(n, self.config.max_len)),
             "truncated": bool(n > self.config.max_len)}
            for text, p, n in zip(texts, probabilities, lengths)]

  def evaluate(self, path: str) -> dict:
    """Accuracy, weighted F1 and per-class precision/recall on a labelled file (the training
    run's text_fields / label_field); labels outside the workdir's classes are an error."""
    from textattn import data as data_lib
    from textattn.metrics import summarize_eval
    texts, labels = read_texts(path, self.config, with_labels=True)
    index = {name: i for i, name in enumerate(self.class_names)}
    unknown = sorted({label for label in labels if label not in index})
    if unknown:
      raise data_lib.DataError(f"{path}: label(s) {unknown[:5]} are not classes of "
                               f"{self.workdir} ({', '.join(self.class_names)}).")
    truth = np.array([index[label] for label in labels])
    predicted = self.predict_proba(texts).argmax(-1)
    confusion = np.zeros((len(index), len(index)))
    np.add.at(confusion, (truth, predicted), 1)
    sums = {"count": len(truth), "loss_sum": float("nan"),
            "correct": float(np.sum(truth == predicted)), "confusion": confusion}
    metrics = summarize_eval(sums, self.class_names, "eval")
    metrics.pop("eval/loss")
    return metrics


def load(workdir: str, checkpoint: str = "best") -> Classifier:
  """The classifier of a training workdir (see the module docstring)."""
  return Classifier(workdir, checkpoint)


def _restore_params(workdir: str, checkpoint: str, config):
  """(step, parameters) of the chosen checkpoint, verified against its recorded checksums."""
  import orbax.checkpoint as ocp

  from textattn import checkpointing
  from textattn.errors import RunError
  manager = checkpointing.open_manager(workdir, int(config.keep_checkpoints))
  steps = sorted(manager.all_steps())
  if not steps:
    raise RunError(f"{workdir} has no checkpoint yet; train first (or wait for the first "
                   f"checkpoint).")
  if checkpoint == "best":
    best = manager.best_step() if config.final_params == "best" else None
    step = best if best is not None else steps[-1]
  elif checkpoint == "last":
    step = steps[-1]
  elif checkpoint.isdigit() and int(checkpoint) in steps:
    step = int(checkpoint)
  else:
    raise RunError(f"--checkpoint={checkpoint!r} is not available in {workdir}; allowed: best, "
                   f"last, or a step of {', '.join(map(str, steps))}.")
  try:
    restored = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()))
  except Exception as e:
    raise RunError(f"The checkpoint at step {step} in {manager.directory} cannot be read "
                   f"({type(e).__name__}: {checkpointing.one_line(e)}).") from None
  problem = checkpointing.verify(restored, restored["meta"])
  if problem not in (None, "unverified"):
    raise RunError(f"The checkpoint at step {step} in {manager.directory} failed verification "
                   f"({problem} changed since it was saved); choose another with --checkpoint.")
  manager.close()
  return step, restored["state"]["params"]


def read_texts(path: str, config, with_labels: bool = False):
  """Texts (and label strings) of a .txt (one text per line), .csv, .tsv or .jsonl file, the
  latter with the training run's text_fields (joined by a space) and label_field."""
  from textattn.data import DataError
  extension = os.path.splitext(path)[1].lower()
  try:
    with open(path, "rb") as f:
      raw = f.read()
  except OSError as e:
    raise DataError(f"--input={path}: cannot be read ({e.strerror}).") from None
  text = raw.decode("utf-8-sig", errors="replace")
  if "\ufffd" in text and b"\xef\xbf\xbd" not in raw:
    bad = sum("\ufffd" in line for line in text.splitlines())
    print(f"Warning: {path}: {bad} line(s) are not valid UTF-8; the invalid bytes were "
          f"replaced by U+FFFD.", file=sys.stderr)
  fields = [f.strip() for f in str(config.text_fields).split(",") if f.strip()]
  if extension == ".txt":
    if with_labels:
      raise DataError(f"{path}: a .txt file has no labels; evaluate a .csv/.tsv/.jsonl file.")
    return [line.rstrip("\r") for line in text.split("\n")[:-1 if text.endswith("\n") else None]]
  if extension in (".csv", ".tsv"):
    reader = csv.DictReader(io.StringIO(text, newline=""),
                            delimiter="," if extension == ".csv" else "\t")
    records = list(reader)
  elif extension in (".jsonl", ".json"):
    records = [json.loads(line) for line in text.split("\n") if line.strip()]
  else:
    raise DataError(f"--input={path}: unsupported file type {extension!r}; allowed: .txt (one "
                    f"text per line), .csv, .tsv, .jsonl.")
  wanted = fields + ([config.label_field] if with_labels else [])
  missing = [f for f in wanted if records and f not in records[0]]
  if missing:
    raise DataError(f"{path}: field(s) {missing} not found (the training run's text_fields / "
                    f"label_field); it has {sorted(records[0])}.")
  texts = [" ".join(str(r[f] or "") for f in fields) for r in records]
  if not with_labels:
    return texts
  from textattn.data import raw as raw_lib
  return texts, [raw_lib.label_string(r[config.label_field]) or "" for r in records]


def main(argv) -> None:
  from absl import flags
  del argv
  values = flags.FLAGS
  from textattn import data as data_lib
  from textattn.errors import RunError
  if bool(values.text) == bool(values.input):
    print("error: give the texts with --text=STR (repeatable) or --input=FILE, not both and not "
          "neither.", file=sys.stderr)
    sys.exit(2)
  try:
    model = load(values.workdir, values.checkpoint)
    texts = values.text or read_texts(values.input, model.config)
    rows = model.predict(texts)
  except (data_lib.DataError, RunError) as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(1)
  lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
  if values.output:
    data_lib.atomic_write(values.output, lambda f: f.write(lines))
    print(f"Wrote {len(rows)} predictions to {values.output} (checkpoint step {model.step}).",
          file=sys.stderr)
  else:
    sys.stdout.write(lines)


if __name__ == "__main__":
  from absl import app, flags
  flags.DEFINE_string("workdir", None, "A training workdir (python -m textattn.main --workdir).")
  flags.DEFINE_multi_string("text", [], "A text to classify; repeatable.")
  flags.DEFINE_string("input", None, "A file of texts: .txt (one per line), .csv, .tsv, .jsonl "
                      "(the training run's text_fields).")
  flags.DEFINE_string("output", None, "Where the JSON lines go (default: standard output).")
  flags.DEFINE_string("checkpoint", "best", "best (the parameters the test report used), last, "
                      "or a step.")
  flags.mark_flag_as_required("workdir")
  app.run(main)
