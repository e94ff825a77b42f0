"""Multi-query associative recall (MQAR) examples: Zoology's generator (Arora et al. 2023,
arXiv 2312.04927, zoology/data/multiquery_ar.py), vectorised in NumPy.

One example of `length` tokens with `pairs` key-value pairs, vocabulary `vocab_size`:
- keys are drawn from 1 .. vocab_size/2 - 1 and values from vocab_size/2 .. vocab_size - 1,
  distinct within the example (each without replacement, in random order);
- the pairs come first, "k1 v1 k2 v2 ...", filling positions 0 .. 2 pairs - 1;
- each key is then queried once, key i at position 2 pairs + 2 gap_i, where the gaps are drawn
  without replacement from 0 .. space - 1 (space = (length - 2 pairs) // 2) with probability
  p(gap) proportional to alpha (gap + 1)^(alpha - 1) (Zoology's power law, `power_a`; small
  alpha puts queries soon after the pairs; alpha = 1: uniform), in Zoology's order (key i's gap
  is the i-th draw of a sequential weighted draw without replacement, here by the Gumbel-top-k
  trick, which has that distribution);
- every other position holds a noise token drawn uniformly from 1 .. vocab_size - 1 (Zoology's
  random_non_queries, which draws from 0 .. vocab_size - 1: id 0 is padding here, so never drawn).
The model reads the tokens causally and is scored only at the query positions, where the next
token it predicts must be the queried key's value (Zoology's labels, shifted to the inputs'
positions: no other position carries a target). An example is `Examples` of one setting: the
tokens, the query positions and the answers.

Training batches (`TrainBatches`) are drawn from NumPy's generator seeded by (config.seed, the
step), so batch n is the same whatever ran before it: a resume and a run on any number of
devices see the same examples. Each batch holds one setting: the training setting, or, with
config.mixed_settings, in turn each of those and then the training setting (Zoology trains on
such a mixture of easier settings and the hard ones, a batch per setting; a model learns the
recall on short sequences with few pairs in a few hundred steps, and long ones then follow).
The validation set (the training setting) and the test sets (one per test setting,
`parse_settings`) are fixed draws seeded by (config.data_seed, the split, the setting), the same
for every run of the same data_seed.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from textattn.errors import UsageError

# The first word of each generator seed: training batches, the validation set, the test sets
# (kept apart so no two streams share a seed).
TRAIN, VALIDATION, TEST = 0, 1, 2
_SETTING = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*$")


@dataclasses.dataclass(frozen=True)
class Setting:
  """A sequence length and a number of key-value pairs."""
  length: int
  pairs: int

  @property
  def name(self) -> str:
    return f"{self.length}x{self.pairs}"


@dataclasses.dataclass
class Examples:
  """MQAR examples of one setting: inputs int32 [N, length]; query_positions int32 [N, pairs]
  (where each key is queried, in the order of the keys' pairs); answers int32 [N, pairs] (the
  value the model must predict at each query position)."""
  setting: Setting
  inputs: np.ndarray
  query_positions: np.ndarray
  answers: np.ndarray

  def __len__(self) -> int:
    return len(self.inputs)

  def batch(self, rows) -> dict:
    return {"inputs": self.inputs[rows], "query_positions": self.query_positions[rows],
            "answers": self.answers[rows]}


def parse_settings(text: str, field: str = "test_settings") -> tuple[Setting, ...]:
  """"256x32,512x64" -> the settings (LENGTHxPAIRS, comma-separated); UsageError naming
  config.<field> on anything else."""
  settings = []
  for part in str(text).split(","):
    match = _SETTING.match(part)
    if not match:
      raise UsageError(f"config.{field}={text!r} must be comma-separated LENGTHxPAIRS settings "
                       f"such as '256x32,512x64'; {part.strip()!r} is not one.")
    settings.append(Setting(int(match.group(1)), int(match.group(2))))
  return tuple(settings)


def check_setting(setting: Setting, vocab_size: int, where: str) -> None:
  """UsageError unless the generator can draw `setting` (Zoology's conditions): an even length
  with room for the pairs and as many queries (4 pairs <= length), and enough keys and values in
  the vocabulary for distinct ones."""
  length, pairs = setting.length, setting.pairs
  if pairs < 1 or length % 2 or 4 * pairs > length:
    raise UsageError(f"{where}: {setting.name} needs pairs >= 1, an even length and "
                     f"4 * pairs <= length (the pairs and as many queries with a gap each).")
  if pairs > vocab_size // 2 - 1:
    raise UsageError(f"{where}: {pairs} distinct keys need config.vocab_size >= {2 * pairs + 2} "
                     f"(keys are drawn from the first half of the vocabulary, id 0 excepted); "
                     f"it is {vocab_size}.")


def gap_log_weights(space: int, alpha: float) -> np.ndarray:
  """log p(gap) up to a constant, gaps 0 .. space - 1: Zoology's alpha (gap + 1)^(alpha - 1)."""
  return (alpha - 1.0) * np.log(np.arange(1, space + 1, dtype=np.float64))


def _distinct(rng: np.random.Generator, rows: int, low: int, high: int, count: int) -> np.ndarray:
  """int [rows, count]: per row `count` distinct integers of low .. high - 1, uniformly among
  the ordered tuples of distinct ones. Rows drawn with replacement and drawn again while they
  repeat one (rejection: the accepted rows are uniform over the distinct tuples), while that is
  likely to succeed (count^2 <= 2 candidates: a row repeats with probability at most ~0.63);
  else the `count` smallest of one uniform score per candidate, in the order of their scores."""
  candidates = high - low
  if count * count > 2 * candidates:
    scores = rng.random((rows, candidates))
    chosen = np.argpartition(scores, count - 1, axis=1)[:, :count]
    order = np.argsort(np.take_along_axis(scores, chosen, axis=1), axis=1)
    return np.take_along_axis(chosen, order, axis=1) + low
  out = rng.integers(low, high, size=(rows, count))
  redraw = np.arange(rows)
  while True:
    ordered = np.sort(out[redraw], axis=1)
    redraw = redraw[np.any(ordered[:, 1:] == ordered[:, :-1], axis=1)]
    if not len(redraw):
      return out
    out[redraw] = rng.integers(low, high, size=(len(redraw), count))


def _ordered_gaps(rng: np.random.Generator, rows: int, space: int, count: int,
                  alpha: float) -> np.ndarray:
  """int [rows, count]: a sequential draw without replacement of gaps from 0 .. space - 1 with
  weights p(gap), the i-th column the i-th draw (Gumbel-top-k: the gaps ordered by log p plus
  Gumbel noise, largest first, are distributed as that sequence)."""
  keys = gap_log_weights(space, alpha)[None, :] + rng.gumbel(size=(rows, space))
  chosen = np.argpartition(-keys, count - 1, axis=1)[:, :count]
  order = np.argsort(-np.take_along_axis(keys, chosen, axis=1), axis=1)
  return np.take_along_axis(chosen, order, axis=1)


def generate(rng: np.random.Generator, rows: int, setting: Setting, vocab_size: int,
             alpha: float) -> Examples:
  """`rows` examples of `setting` drawn from `rng` (the module's docstring)."""
  length, pairs = setting.length, setting.pairs
  context = 2 * pairs
  half = vocab_size // 2
  keys = _distinct(rng, rows, 1, half, pairs)
  values = _distinct(rng, rows, half, vocab_size, pairs)
  gaps = _ordered_gaps(rng, rows, (length - context) // 2, pairs, alpha)
  inputs = rng.integers(1, vocab_size, size=(rows, length))
  inputs[:, 0:context:2] = keys
  inputs[:, 1:context:2] = values
  query_positions = context + 2 * gaps
  np.put_along_axis(inputs, query_positions, keys, axis=1)
  return Examples(setting, inputs.astype(np.int32), query_positions.astype(np.int32),
                  values.astype(np.int32))


def dense_targets(examples: Examples, ignore: int = -1) -> np.ndarray:
  """int32 [N, length]: the answer at each query position, `ignore` everywhere else (Zoology's
  label layout, shifted to the inputs' positions; the loss mask is targets != ignore)."""
  targets = np.full(examples.inputs.shape, ignore, np.int32)
  np.put_along_axis(targets, examples.query_positions, examples.answers, axis=1)
  return targets


def fixed_set(config, split: int, setting: Setting, count: int) -> Examples:
  """The validation or test examples of `setting`: seeded by (data_seed, split, setting)."""
  rng = np.random.default_rng([split, config.data_seed, setting.length, setting.pairs])
  return generate(rng, count, setting, config.vocab_size, config.alpha)


def training_setting(config) -> Setting:
  """The setting trained on (with mixed_settings: the last of the mixture), validated on."""
  return Setting(config.length, config.pairs)


def training_settings(config) -> tuple[Setting, ...]:
  """The settings of the training batches in turn: config.mixed_settings, then the training
  setting."""
  mixed = parse_settings(config.mixed_settings, "mixed_settings") if config.mixed_settings else ()
  return mixed + (training_setting(config),)


def test_settings(config) -> tuple[Setting, ...]:
  return parse_settings(config.test_settings)


def longest(config) -> int:
  """The longest sequence the model reads (training or test): a learned position table's rows."""
  return max(s.length for s in training_settings(config) + test_settings(config))


class TrainBatches:
  """Infinite training batches: batch n (counted from 0) is `generate` of settings[n mod
  len(settings)] from NumPy's generator seeded by (TRAIN, seed, n), whole; this process yields
  its rows [process_index * local, (process_index + 1) * local) of it. The position is
  `get_state()` = {"epoch", "index"} (an "epoch" is `steps_per_epoch` batches, the run's length:
  fresh examples never repeat; the runner's iterator contract, data.TrainIterator's);
  `set_state` resumes there exactly."""

  def __init__(self, settings: tuple[Setting, ...], global_batch_size: int, seed: int,
               vocab_size: int, alpha: float, steps_per_epoch: int, process_index: int = 0,
               process_count: int = 1):
    self.settings, self.vocab_size, self.alpha = tuple(settings), int(vocab_size), float(alpha)
    self.global_batch_size = int(global_batch_size)
    self.local_batch_size = self.global_batch_size // process_count  # (the runner checked it)
    self._offset = process_index * self.local_batch_size
    self.seed = int(seed) % (1 << 63)  # (SeedSequence needs non-negative words)
    self.steps_per_epoch = int(steps_per_epoch)
    self._next = 0

  def get_state(self) -> dict:
    return {"epoch": self._next // self.steps_per_epoch,
            "index": self._next % self.steps_per_epoch}

  def set_state(self, state: dict) -> None:
    epoch, index = int(state["epoch"]), int(state["index"])
    if epoch < 0 or not 0 <= index < self.steps_per_epoch:
      raise UsageError(f"iterator state {state} is invalid for {self.steps_per_epoch} steps per "
                       f"epoch (was num_train_steps changed?).")
    self._next = epoch * self.steps_per_epoch + index

  def draw(self, number: int) -> Examples:
    """Batch `number`, whole (every process's rows)."""
    rng = np.random.default_rng([TRAIN, self.seed, number])
    return generate(rng, self.global_batch_size, self.settings[number % len(self.settings)],
                    self.vocab_size, self.alpha)

  def __iter__(self) -> TrainBatches:
    return self

  def __next__(self) -> dict:
    examples = self.draw(self._next)
    self._next += 1
    return examples.batch(slice(self._offset, self._offset + self.local_batch_size))
