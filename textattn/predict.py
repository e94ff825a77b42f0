"""Use a trained classifier on new text: `python -m textattn.predict`, or `textattn.load(...)`.

    python -m textattn.predict --workdir=runs/imdb_fastformer --text="A gripping film." \
        [--text=...] | --input=reviews.txt|.csv|.tsv|.jsonl [--output=predictions.jsonl] \
        [--checkpoint=best|last|STEP] [--plugin=MODULE] [--explain=DIR]

    from textattn import predict
    model = predict.load("runs/imdb_fastformer")
    model.predict(["A gripping film.", "Dull."])   # [{"text", "label", "probabilities", ...}]
    model.evaluate("labelled.csv")                # accuracy, weighted F1, per class
    model.explain(["A gripping film."])           # + tokens and one weight each

The workdir gives everything: config.json (model, tokenizer settings, text fields), the saved
vocabulary and class names (tokenizer.json, data_info.json) and the checkpoint ("best": the
parameters the run's test report used; "last"; or a step), verified against the checksums
recorded when it was saved. A GPU-trained workdir works on a CPU (attention_impl "auto"
keeps the kernel the run used where it runs here, else resolves to this machine's). Texts are encoded exactly as in training (standardised, or
by a pretrained model's own tokenizer saved in the workdir; truncated to max_len as
config.truncation says) and run in batches of config.eval_batch_size,
padded to full batches so one compilation serves every call.

One JSON line per input: {"text", "label", "probabilities": {class: p}, "tokens": the number
of tokens the model saw, "truncated": whether the text was longer than max_len}. A blank text
(empty or only whitespace, e.g. an empty line of --input) gets no prediction: "label" and
"probabilities" are null and "tokens" is 0, as training skips such texts rather than learning a
class for them; the command says how many there were. Input files must be UTF-8; invalid bytes are replaced
(U+FFFD) with one warning naming how many lines had them.

--explain=DIR also writes DIR/explain.html (a heat map of each text's tokens) and
DIR/explain.jsonl (tokens and one weight each): attention-pooling weights where the model pools
by attention, gradient x input otherwise (textattn/explain.py says which and how).
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

  def __init__(self, workdir: str, checkpoint: str = "best", plugins=(), config=None):
    import jax

    from textattn import data as data_lib
    from textattn import defaults, models
    self.workdir = workdir
    # The recorded config, migrated to today's fields (plugins loaded first, as in training).
    self.config = config if config is not None else defaults.read_workdir_config(workdir, plugins)
    if "max_len" not in self.config or "label_field" not in self.config:  # (no classifier's)
      raise data_lib.DataError(f"{workdir} is a {self.config.task} run, not a classifier's "
                               f"workdir; textattn.load({workdir!r}) gives what its task offers.")
    self.tokenizer, self.class_names = data_lib.load_tokenizer(workdir)
    if self.tokenizer is None:
      raise data_lib.DataError(f"{workdir} has no saved vocabulary ({data_lib.DATA_INFO_FILE}).")
    from textattn.pretrained import finetune
    bert_config = finetune.read_config(workdir) if finetune.enabled(self.config) else None
    if finetune.enabled(self.config) and bert_config is None:
      raise data_lib.DataError(f"{workdir} has no {finetune.WORKDIR_FILE} (the pretrained "
                               f"encoder's configuration its run saved).")
    # The kernel the run used where it runs here ("auto" resolves by measured speed on a CPU,
    # and kernels round differently), so predictions reproduce the run's test report.
    from textattn.tasks import classification
    kernel_config = classification.pinned_kernel(self.config, workdir, is_main=False,
                                                 strict=False, bert_config=bert_config)
    model = models.build_model(kernel_config, len(self.class_names),
                               vocab_size=self.tokenizer.vocab_size, pretrained_config=bert_config)
    from textattn import run
    from textattn.models import baselines
    self.step, self.params = run.restore_params(workdir, checkpoint, self.config, model,
                                                frozen=baselines.has_frozen(self.config))
    self.batch_size = int(self.config.eval_batch_size)
    self.model = model
    self._weights_fn = None

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
    elif self.tokenizer.kind == "ngram":
      lengths = self.tokenizer.feature_counts(texts)
    elif self.tokenizer.kind == "pretrained":
      lengths = self.tokenizer.lengths(texts)
    else:
      lengths = np.array([len(tokenizer_lib.standardize(text).split()) for text in texts],
                         np.int64)
    inputs = self.tokenizer.encode(texts, config.max_len, config.truncation)
    if data_lib.pads_before(config):
      inputs = data_lib.pad_before(inputs)
    return inputs, lengths

  def predict_proba(self, texts: list[str], progress: str | None = None) -> np.ndarray:
    """Class probabilities [N, num_classes], in class_names order. `progress`: a name for the
    progress lines a long pass prints on stderr (loop.Countdown); None: silent."""
    inputs, _ = self.encode(list(texts))
    return self._run(inputs, progress)

  def probabilities(self, inputs: np.ndarray, progress: str | None = None) -> np.ndarray:
    """Class probabilities [N, num_classes] of already encoded inputs (as load_dataset's)."""
    return self._run(np.asarray(inputs, np.int32), progress)

  def _run(self, inputs: np.ndarray, progress: str | None = None) -> np.ndarray:
    from textattn import loop
    countdown = loop.Countdown(progress, len(inputs), progress is not None, file=sys.stderr)
    out = []
    for start in range(0, len(inputs), self.batch_size):
      batch = inputs[start:start + self.batch_size]
      padded = np.zeros((self.batch_size, inputs.shape[1]), np.int32)
      padded[:len(batch)] = batch
      out.append(np.asarray(self._probabilities(self.params, padded))[:len(batch)])
      countdown.update(start + len(batch))
    return np.concatenate(out) if out else np.zeros((0, len(self.class_names)), np.float32)

  def predict(self, texts: list[str], progress: str | None = None) -> list[dict]:
    texts = list(texts)
    inputs, lengths = self.encode(texts)
    probabilities = self._run(inputs, progress)
    return [{"text": text, "label": None, "probabilities": None, "tokens": 0, "truncated": False}
            if is_blank(text) else
            {"text": text, "label": self.class_names[int(np.argmax(p))],
             "probabilities": {name: float(v) for name, v in zip(self.class_names, p)},
             "tokens": int(min(n, self.config.max_len)),
             "truncated": bool(n > self.config.max_len)}
            for text, p, n in zip(texts, probabilities, lengths)]

  def weights_fn(self):
    """The jitted (params, tokens) -> (probabilities, per-token weights) of textattn.explain."""
    if self._weights_fn is None:
      from textattn import explain
      self._weights_fn = explain.make_weights_fn(self.model, self.config)
    return self._weights_fn

  def explain(self, texts: list[str]) -> list[dict]:
    """Per text: label, probabilities, method, tokens, weights (one per token, None where not
    seen: beyond max_len), seen, truncated, oov (textattn/explain.py)."""
    from textattn import explain
    return explain.explain_rows(self, list(texts))

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


def is_blank(text: str) -> bool:
  """A text with nothing to classify (empty or only whitespace): no prediction is made for it."""
  return not text.strip()


def load(workdir: str, checkpoint: str = "best", plugins=()) -> Classifier:
  """The classifier of a training workdir (see the module docstring); `plugins`: the modules
  the run was trained with --plugin (attention variants registered outside textattn)."""
  return Classifier(workdir, checkpoint, plugins)


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
  records = _records(path, text, extension, str(config.columns))
  wanted = fields + ([config.label_field] if with_labels else [])
  for number, record in records:
    missing = [f for f in wanted if f not in record]
    if missing:
      raise DataError(f"{path}, line {number}: field(s) {missing} not found (the training run's "
                      f"text_fields / label_field); it has {sorted(record)}.")
  texts = [" ".join(str(r[f] or "") for f in fields) for _, r in records]
  if not with_labels:
    return texts
  from textattn.data import raw as raw_lib
  return texts, [raw_lib.label_string(r[config.label_field]) or "" for _, r in records]


def _records(path: str, text: str, extension: str, columns: str = "") -> list[tuple[int, dict]]:
  """(line number, {field: value}) per record of a .csv/.tsv (a header row, names stripped as in
  training, unless the run named headerless `columns`) or .jsonl file; malformed input is one
  DataError naming the line."""
  from textattn.data import DataError
  if extension in (".csv", ".tsv"):
    csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))
    reader = csv.reader(io.StringIO(text, newline=""),
                        delimiter="," if extension == ".csv" else "\t")
    try:
      names = [name.strip() for name in columns.split(",") if name.strip()]
      header = names or [name.strip() for name in next(reader, [])]
      rows = []
      for values in reader:
        if not values:
          continue
        if names and reader.line_num == 1 and [v.strip() for v in values] == names:
          continue  # a header row in a file of a headerless run: not a text
        if names and len(values) != len(names):
          raise DataError(f"{path}, line {reader.line_num}: expected {len(names)} fields (the "
                          f"run's columns {','.join(names)}), found {len(values)}.")
        rows.append((reader.line_num, dict(zip(header, values))))
    except csv.Error as e:
      raise DataError(f"{path}, line {reader.line_num}: malformed CSV ({e}).") from None
    return rows
  if extension in (".jsonl", ".json"):
    from textattn.data import raw as raw_lib
    return list(raw_lib.json_records(path, text))
  raise DataError(f"--input={path}: unsupported file type {extension!r}; allowed: .txt (one "
                  f"text per line), .csv, .tsv, .jsonl.")

def main(argv) -> None:
  from absl import flags, logging
  del argv
  values = flags.FLAGS
  if not values["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # the libraries' INFO logs only with --verbosity
  from textattn import data as data_lib
  from textattn.errors import user_errors
  if bool(values.text) == bool(values.input):
    print("error: give the texts with --text=STR (repeatable) or --input=FILE, not both and not "
          "neither.", file=sys.stderr)
    sys.exit(2)
  with user_errors():
    import textattn
    model = textattn.load(values.workdir, values.checkpoint, values.plugin)
    if not hasattr(model, "predict"):
      raise data_lib.DataError(f"{values.workdir} is a {model.config.task} run, whose model "
                               f"offers no predict; python -m textattn.predict needs a "
                               f"classifier's workdir.")
    texts = values.text or read_texts(values.input, model.config)
    rows = model.predict(texts, progress="predict")
    if values.explain:
      from textattn import explain
      explained = model.explain(texts)
      try:
        paths = explain.write(values.explain, explained,
                              title=f"{os.path.basename(os.path.normpath(values.workdir))} "
                                    f"(checkpoint step {model.step})",
                              separator="" if model.tokenizer.kind == "byte" else " ")
      except OSError as error:
        raise data_lib.DataError(f"--explain={values.explain}: cannot be written "
                                 f"({error.strerror}).") from None
  blank = sum(row["label"] is None for row in rows)
  if blank:
    print(f"Note: {blank} blank text(s) (empty or only whitespace) have no prediction: their "
          f"label and probabilities are null.", file=sys.stderr)
  lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
  if values.output:
    data_lib.atomic_write(values.output, lambda f: f.write(lines))
    print(f"Wrote {len(rows)} predictions to {values.output} (checkpoint step {model.step}).",
          file=sys.stderr)
  else:
    sys.stdout.write(lines)
  if values.explain:
    method = explain.METHOD_DESCRIPTIONS[explain.method_for(model.config)]
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
  app.run(main)
