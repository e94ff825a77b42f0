"""The language-modelling task: documents -> packed rows -> a decoder-only model -> bits per byte.

For a config from `defaults.for_task("language_model")` (config.py): reads the documents (TFDS
`imdb_reviews` by default: training on its 50,000 unlabelled reviews, validation and test drawn
from its test reviews; or a local .txt/.jsonl), tokenizes them (bytes by default; bpe, word;
tokenizers.py; saved in the workdir), packs them into rows with segment ids (data.py) and trains
model.LanguageModel, the translation decoder's blocks without cross-attention over a causal
variant that declares segment ids, on the runner (textattn/run.py: checkpoints, exact resume,
the report). The best checkpoint is the one of lowest val/bits_per_byte (a word tokenizer's run:
val/loss). The test report adds the xz and Kneser-Ney reference rows (report.py).
`textattn.load(workdir)` gives a Generator (.generate); `python -m textattn.generate` samples.
"""

from __future__ import annotations

import jax
import numpy as np

from textattn import platform, restore, tasks
from textattn.data import TrainIterator
from textattn.tasks.language_model import data as data_lib
from textattn.tasks.language_model import model as model_lib
from textattn.tasks.language_model import report as report_lib
from textattn.tasks.language_model import sampling
from textattn.tasks.language_model import step as step_lib
from textattn.tasks.language_model.config import defaults, validate


def prepare(config, workdir: str, is_main: bool) -> tasks.Job:
  lm = data_lib.load_data(config, workdir, write=is_main)
  mesh = platform.config_mesh(config)
  module = model_lib.build(config, lm.tokenizer.vocab_size, mesh)
  train_iter = TrainIterator(lm.dataset.train, config.batch_size, config.seed,
                             *platform.row_block(mesh))
  evaluator = step_lib.make_evaluator(config.platform.eval_batch_size, mesh,
                                      platform.step_compiler_options(config))

  def evaluate(state, split, prefix):
    name = "validation" if split is lm.dataset.validation else "test"
    return evaluator(state, split, prefix,
                     lm.byte_counts[name] if lm.tokenizer.lossless else None), None

  def report(state, report_step, reused):
    del report_step
    metrics = dict(reused[0]) if reused else evaluate(state, lm.dataset.test, "test")[0]
    metrics.update(report_lib.references(config, lm.documents))
    if is_main:
      report_lib.write(workdir, config, metrics, lm.byte_counts, lm.tokenizer.lossless)
    return metrics

  def describe(params):
    count = sum(int(np.prod(p.shape)) for p in jax.tree_util.tree_leaves(params))
    return (f"Model: {config.model.num_layers}-layer {config.model.attention} decoder, "
            f"{count:,} parameters\n{data_lib.describe(config, lm)}")

  return tasks.Job(
      data=lm.dataset, module=module, init_length=config.max_len, train_iter=train_iter,
      train_step=step_lib.train_step, evaluate=evaluate, report=report, describe=describe,
      metric=metric(lm.tokenizer), higher_is_better=False)


def metric(tokenizer) -> str:
  """What the best checkpoint is chosen by (lower is better)."""
  return "val/bits_per_byte" if tokenizer.lossless else "val/loss"


class Generator:
  """What textattn.load(workdir) gives for a language-model workdir: `.generate(prompts)`."""

  def __init__(self, workdir: str, checkpoint: str, config):
    self.config = config
    self.tokenizer = data_lib.load_tokenizer(workdir)
    if self.tokenizer is None:
      raise data_lib.DataError(f"{workdir} has no {data_lib.tokenizers.FILE}: its run never "
                               f"started training.")
    self.model = model_lib.build(config, self.tokenizer.vocab_size)
    self.step, self.params = restore.restore_params(
        workdir, checkpoint, config, self.model, config.max_len,
        metric=metric(self.tokenizer), higher_is_better=False)

  def generate(self, prompts: list[str], max_tokens: int = 200, temperature: float = 1.0,
               top_k: int = 0, seed: int = 0) -> list[str]:
    """Each prompt's continuation (text after the prompt, to the end of the document or
    max_tokens tokens); deterministic for a seed; temperature 0 is greedy. A word tokenizer's
    continuation starts with the space between the prompt's last word and its first (bytes
    and BPE continuations carry their own)."""
    encoded = self.tokenizer.encode(list(prompts))
    drawn = sampling.sample(self.model, self.params, encoded, max_tokens, temperature, top_k,
                            seed)
    texts = [self.tokenizer.decode(ids) for ids in drawn]
    if self.tokenizer.kind == "word":
      texts = [" " + text if text and prompt and not prompt[-1].isspace() else text
               for prompt, text in zip(prompts, texts)]
    return texts


tasks.register(tasks.Task(
    name="language_model", defaults=defaults, validate=validate, prepare=prepare,
    load=Generator,
    description="decoder-only language modelling (textattn/tasks/language_model/)"))
