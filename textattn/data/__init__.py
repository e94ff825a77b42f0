"""Data: TFDS or a local file → vocabulary → int32 arrays → deterministic, resumable batches.

`load_dataset(config, workdir)` returns train / validation / test `Split`s:
- TFDS (`config.dataset`, e.g. "imdb_reviews"): validation is carved from TFDS train
  (`val_fraction`, permutation from `data_seed`; 0 leaves it empty); test is TFDS test.
- A local .csv / .tsv / .jsonl (or .json holding JSON lines) training file, plus optional
  `validation_file` / `test_file`; a split without its own file is carved from the training
  file (`val_fraction` each). CSV/TSV files have a header row unless `columns` names their
  columns. Text = the `text_fields` joined with " "; label ids follow the sorted distinct label
  values (as strings).

The word vocabulary is counted on the train part only. The tokenizer (`tokenizer.json`) and the
label names (`data_info.json`) are saved in the workdir and reused from it, so ids never
change between runs of a workdir. Encoded arrays are cached in `cache_dir`, keyed by
everything that affects them; a second run of the same config reads neither TFDS nor the
text. Cache and workdir files are written atomically; an unreadable cache entry is rebuilt.
TFDS data read from anywhere but the data dir (`tfds.testing.mock_data`) is never cached.

Bad input policy: a text that is empty or only whitespace is skipped, counted and logged
(`Dataset.skipped`). Everything else — a file that does not exist, a missing column or field,
invalid UTF-8, a missing label or one outside the workdir's label set, an empty split —
raises `DataError` naming the file (or TFDS split), the row and the problem.

Batches: `TrainIterator` (a permutation per (seed, epoch), full batches only, resumable from
`get_state()`) and `eval_batches` (every example exactly once, the last batch padded with
weight-0 copies of the split's first example so model outputs stay finite). Both yield this
process's slice of every global batch.

Modules, each named after its concern: `splits` (Split, Dataset, DataError, padding layouts),
`tokenizer`, `raw` (what a source reads, label ids, the carve), `tfds_source`, `file_source`,
`sources` (picks one; the text pretraining recipes read), `cache`, `dataset` (load_dataset,
config checks, workdir files) and `batches`.
"""

from textattn.data.batches import TrainIterator, eval_batches
from textattn.data.cache import atomic_write, content_digest, read_cache
from textattn.data.dataset import (
  DATA_INFO_FILE,
  TOKENIZER_FILE,
  describe,
  load_dataset,
  load_tokenizer,
  refuse_other_training_data,
  validate_config,
)
from textattn.data.file_source import is_local_file
from textattn.data.raw import source_config
from textattn.data.sources import (
  check_unlabeled_split,
  pretraining_texts,
  source_cache_path,
  word2vec_texts,
)
from textattn.data.splits import (
  PADDINGS,
  SPLITS,
  DataError,
  Dataset,
  Split,
  layout_config,
  pad_before,
  pads_before,
)

__all__ = ["DATA_INFO_FILE", "PADDINGS", "SPLITS", "TOKENIZER_FILE", "DataError", "Dataset",
           "Split", "TrainIterator", "atomic_write", "check_unlabeled_split", "content_digest", "describe",
           "eval_batches", "is_local_file", "layout_config", "load_dataset", "load_tokenizer", "pad_before",
           "pads_before", "pretraining_texts", "read_cache", "refuse_other_training_data", "source_cache_path",
           "source_config", "validate_config", "word2vec_texts"]
