"""A trained workdir's classifier: encode texts as in training, predict, evaluate, explain.

What `textattn.load(workdir)` returns for a classification run, and what `python -m
textattn.predict` (its command) uses. The workdir gives everything: config.json (model,
tokenizer settings, text fields), the saved vocabulary and class names (tokenizer.json,
data_info.json) and the checkpoint ("best": the parameters the run's test report used; "last";
or a step), verified against the checksums recorded when it was saved. A GPU-trained workdir
works on a CPU (attention_impl "auto" keeps the kernel the run used where it runs here, else
resolves to this machine's). Texts are encoded exactly as in training and run in batches of
config.platform.eval_batch_size, padded to full batches so one compilation serves every call.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import jax
import ml_collections
import numpy as np

from textattn import config as config_lib
from textattn import data as data_lib
from textattn import models, restore
from textattn import progress as progress_lib
from textattn.data import raw as raw_lib
from textattn.data import tokenizer as tokenizer_lib
from textattn.data.splits import DataError
from textattn.errors import UsageError
from textattn.metrics import summarize_eval
from textattn.models import baselines
from textattn.pretrained import finetune
from textattn.tasks.classification import explain, kernels, predictions
from textattn.tasks.classification.explain import is_blank


class Classifier:
  """A trained workdir's classifier: encode, predict, evaluate (see the module docstring)."""

  def __init__(self, workdir: str, checkpoint: str, config):
    """`config`: the workdir's recorded config, migrated to today's fields (the runner's
    read_workdir_config; textattn.load passes it, plugins loaded first as in training)."""
    self.workdir = workdir
    self.config = config
    if self.config.task != "classification":
      raise data_lib.DataError(f"{workdir} is a {self.config.task} run, not a classifier's "
                               f"workdir; textattn.load({workdir!r}) gives what its task offers.")
    self.tokenizer, self.class_names = data_lib.load_tokenizer(workdir)
    if self.tokenizer is None:
      raise data_lib.DataError(f"{workdir} has no saved vocabulary ({data_lib.DATA_INFO_FILE}).")
    bert_config = finetune.read_config(workdir) if finetune.enabled(self.config) else None
    if finetune.enabled(self.config) and bert_config is None:
      raise data_lib.DataError(f"{workdir} has no {finetune.WORKDIR_FILE} (the pretrained "
                               f"encoder's configuration its run saved).")
    # The kernel the run used where it runs here ("auto" resolves by measured speed on a CPU,
    # and kernels round differently), so predictions reproduce the run's test report.
    kernel_config = kernels.pinned_kernel(self.config, workdir, is_main=False,
                                                 strict=False, bert_config=bert_config)
    model = models.build_model(kernel_config, len(self.class_names),
                               vocab_size=self.tokenizer.vocab_size, pretrained_config=bert_config)
    self.step, self.params = restore.restore_params(workdir, checkpoint, self.config, model,
                                                    trainable=baselines.trainable(self.config))
    self.batch_size = int(self.config.platform.eval_batch_size)
    self.model = model
    self._weights_fn = None

    def probabilities(params, tokens):
      logits = model.apply({"params": params}, tokens, train=False)
      return jax.nn.softmax(logits.astype("float32"), axis=-1)

    self._probabilities = jax.jit(probabilities)

  def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(int32 [N, max_len] as the model trained on them, tokens before truncation [N])."""
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
    inputs = self.tokenizer.encode(texts, config.max_len, config.layout.truncation)
    if data_lib.pads_before(config):
      inputs = data_lib.pad_before(inputs)
    return inputs, lengths

  def predict_proba(self, texts: list[str], progress: str | None = None) -> np.ndarray:
    """Class probabilities [N, num_classes], in class_names order. `progress`: a name for the
    progress lines a long pass prints on stderr (progress.Countdown); None: silent."""
    inputs, _ = self.encode(list(texts))
    return self._run(inputs, progress)

  def probabilities(self, inputs: np.ndarray, progress: str | None = None) -> np.ndarray:
    """Class probabilities [N, num_classes] of already encoded inputs (as load_dataset's)."""
    return self._run(np.asarray(inputs, np.int32), progress)

  def _run(self, inputs: np.ndarray, progress: str | None = None) -> np.ndarray:
    countdown = progress_lib.Countdown(progress, len(inputs), progress is not None, file=sys.stderr)
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
    """The jitted (params, tokens) -> (probabilities, per-token weights) of explain.py."""
    if self._weights_fn is None:
      self._weights_fn = explain.make_weights_fn(self.model, self.config)
    return self._weights_fn

  def explain(self, texts: list[str]) -> list[dict]:
    """Per text: label, probabilities, method, tokens, weights (one per token, None where not
    seen: beyond max_len), seen, truncated, oov (explain.py)."""
    return explain.explain_rows(self, list(texts))

  def write_explanations(self, directory: str, rows: list[dict], title: str = "") -> tuple:
    """DIR/explain.html and DIR/explain.jsonl of `explain`'s rows (their paths)."""
    return explain.write(directory, rows, title=title,
                         separator="" if self.tokenizer.kind == "byte" else " ")

  def explanation_method(self) -> str:
    """What the explanations' weights are, in words."""
    return explain.METHOD_DESCRIPTIONS[explain.method_for(self.config)]

  def read_texts(self, path: str, with_labels: bool = False):
    """The texts (and labels) of a file, read with the training run's fields (read_texts)."""
    return read_texts(path, self.config, with_labels)

  def evaluate(self, path: str) -> dict:
    """Accuracy, weighted F1 and per-class precision/recall on a labelled file (the training
    run's text_fields / label_field); labels outside the workdir's classes are an error. Blank
    texts are left out, as training leaves them out (predict gives them no label), and counted
    in "eval/skipped_blank"."""
    texts, labels = read_texts(path, self.config, with_labels=True)
    kept = [i for i, text in enumerate(texts) if not is_blank(text)]
    skipped = len(texts) - len(kept)
    texts, labels = [texts[i] for i in kept], [labels[i] for i in kept]
    if not texts:
      raise data_lib.DataError(f"{path}: no text to evaluate ({skipped} blank).")
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
    return {**metrics, "eval/skipped_blank": skipped}



def read_texts(path: str, config, with_labels: bool = False):
  """Texts (and label strings) of a .txt (one text per line), .csv, .tsv or .jsonl file, the
  latter with the training run's text_fields (joined by a space) and label_field."""
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
  fields = [f.strip() for f in str(config.source.text_fields).split(",") if f.strip()]
  if extension == ".txt":
    if with_labels:
      raise DataError(f"{path}: a .txt file has no labels; evaluate a .csv/.tsv/.jsonl file.")
    lines = text.split("\n")[:-1 if text.endswith("\n") else None] if text else []
    return [line.rstrip("\r") for line in lines]  # (an empty file: no line, not one blank)
  wanted = fields + ([config.source.label_field] if with_labels else [])
  records = _records(path, text, extension, str(config.source.columns), wanted)
  for number, record in records:
    missing = [f for f in wanted if f not in record]
    if missing:
      raise DataError(f"{path}, line {number}: field(s) {missing} not found (the training run's "
                      f"text_fields / label_field); it has {sorted(record)}.")
  texts = [" ".join(raw_lib.text_value(r[f], f"{path}, line {number}", f) for f in fields)
           for number, r in records]
  if not with_labels:
    return texts
  return texts, [raw_lib.label_string(r[config.source.label_field]) or "" for _, r in records]


def _records(path: str, text: str, extension: str, columns: str = "",
             used: Sequence[str] = ()) -> list[tuple[int, dict]]:
  """(line number, {field: value}) per record of a .csv/.tsv (read as training reads it:
  raw.delimited_records, with the run's headerless `columns` if it named them) or .jsonl file.
  In a headerless run's file a first row that repeats the column names is a header, not a text."""
  if extension in (".csv", ".tsv"):
    names = [name.strip() for name in columns.split(",") if name.strip()]
    return [(line, record) for line, record in raw_lib.delimited_records(
                path, text, "," if extension == ".csv" else "\t", names, used,
                "the training run's text_fields / label_field")
            if not (names and line == 1 and [v.strip() for v in record.values()] == names)]
  if extension in (".jsonl", ".json"):
    return list(raw_lib.json_records(path, text))
  raise DataError(f"--input={path}: unsupported file type {extension!r}; allowed: .txt (one "
                  f"text per line), .csv, .tsv, .jsonl.")


def softmax_teacher(workdir: str, config, bert_config, class_names) -> Classifier:
  """`workdir`'s classifier at its best checkpoint (its .params), for attention transfer's
  teacher (config.attention_transfer.teacher): it must be a classification run with softmax
  attention, fine-tuned from the same pretrained encoder (same config.json) on the same classes."""
  field = f"config.attention_transfer.teacher={workdir!r}"
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise UsageError(f"{field} has no config.json; give the workdir of a finished softmax "
                     f"classification run fine-tuned from {config.model.pretrained!r}.")
  if not os.path.isfile(os.path.join(workdir, predictions.PREDICTIONS_FILE)):
    raise UsageError(f"{field} has not finished (no {predictions.PREDICTIONS_FILE}: its test "
                     f"report); let it finish first, so the teacher is its final one.")
  saved = config_lib.read_saved(path)
  if saved.get("config_version") != config_lib.CONFIG_VERSION:
    raise UsageError(f"{field} was written by another textattn (config version "
                     f"{saved.get('config_version', 1)}, this one writes "
                     f"{config_lib.CONFIG_VERSION}); fine-tune the teacher with this one.")
  teacher = ml_collections.ConfigDict(saved)
  if teacher.get("task") != "classification" or not finetune.enabled(teacher):
    raise UsageError(f"{field} is not the workdir of a pretrained encoder fine-tuned as a "
                     f"classifier.")
  if teacher.model.attention != "softmax":
    raise UsageError(f"{field} has {teacher.model.attention!r} attention; the teacher must be a "
                     f"softmax run.")
  if teacher.model.pooling != config.model.pooling:
    raise UsageError(f"{field} pools with {teacher.model.pooling!r}, this run with "
                     f"{config.model.pooling!r}; its head fits only the same pooling.")
  for name in ("dataset", "val_fraction", "data_seed", "max_len", "layout"):
    # (the teacher reads the student's encoded training rows, and trained on the same carve-out:
    # it never saw the student's validation rows)
    mine, theirs = config[name], teacher.get(name)  # (the teacher's saved config.json)
    if name == "dataset" and os.path.isfile(str(mine)) and os.path.isfile(str(theirs)):
      mine, theirs = os.path.realpath(mine), os.path.realpath(theirs)
    if hasattr(mine, "to_dict"):
      mine, theirs = mine.to_dict(), theirs.to_dict() if hasattr(theirs, "to_dict") else theirs
    if mine != theirs:
      raise UsageError(f"{field} has {name}={theirs!r}, this run {mine!r}; the teacher must be "
                       f"fine-tuned on the same data, split and encoding.")
  if finetune.read_config(workdir) != bert_config:
    raise UsageError(f"{field} was fine-tuned from another encoder than "
                     f"{config.model.pretrained!r} (its {finetune.WORKDIR_FILE} differs).")
  loaded = Classifier(workdir, "best", teacher)
  if list(loaded.class_names) != list(class_names):
    raise UsageError(f"{field} has classes {list(loaded.class_names)}; this run's are "
                     f"{list(class_names)}.")
  return loaded
