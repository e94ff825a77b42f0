"""The language model's test report: its test metrics and two reference rows on the same test
bytes, written to the workdir's lm_report.json.

- xz: `xz -9e` (Python's lzma, preset 9 | EXTREME) compressed bits per byte of the test
  documents (ngram.xz_bits_per_byte).
- kn<order>: a byte n-gram model with interpolated Kneser-Ney smoothing trained on the training
  documents' bytes (ngram.py): bits per byte = its total -log2 P of the test bytes, [end]
  included, per byte, the model's definition.
"""

from __future__ import annotations

import json
import os
import time

from textattn.data import atomic_write
from textattn.tasks.language_model import ngram

REPORT_FILE = "lm_report.json"

DEFINITION = ("bits_per_byte: total negative log2-likelihood of the test documents' raw UTF-8 "
              "bytes, the end of each document included and its first byte conditioned on "
              "nothing but the start token and each byte by at most max_len tokens (the "
              "documents packed into rows of max_len, context reset at each row), divided by "
              "their byte count; loss: nats per "
              "predicted token ([end] included); perplexity: exp(loss).")


def references(config, documents: dict) -> dict:
  """The reference rows' test metrics: xz and, with config.kn_order > 0, Kneser-Ney."""
  rows = {"test/xz_bits_per_byte": ngram.xz_bits_per_byte(documents["test"])}
  if config.kn_order:
    started = time.perf_counter()
    rows[f"test/kn{config.kn_order}_bits_per_byte"] = ngram.bits_per_byte(
        documents["train"], documents["test"], config.kn_order)
    rows["test/kn_seconds"] = time.perf_counter() - started
  return rows


def write(workdir: str, config, metrics: dict, byte_counts: dict, lossless: bool) -> None:
  model_row = {k.split("/", 1)[1]: v for k, v in metrics.items()
               if not k.startswith(("test/xz", "test/kn"))}
  rows = [{"name": f"{config.model.attention} ({config.tokenizer})", **model_row}]
  rows.append({"name": "xz -9e", "bits_per_byte": metrics["test/xz_bits_per_byte"]})
  if config.kn_order:
    rows.append({"name": f"byte {config.kn_order}-gram, interpolated Kneser-Ney",
                 "bits_per_byte": metrics[f"test/kn{config.kn_order}_bits_per_byte"]})
  report = {
      "definition": DEFINITION if lossless else DEFINITION + " A word tokenizer is lossy: its "
      "row has no bits_per_byte.",
      "test_documents": config.test_documents, "test_bytes": byte_counts["test"],
      "train_bytes": byte_counts["train"], "rows": rows}
  atomic_write(os.path.join(workdir, REPORT_FILE), lambda f: json.dump(report, f, indent=2))
