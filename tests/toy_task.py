"""A toy task registered from outside textattn: the proof that a new task is one new module
(tests/test_tasks.py trains, stops, resumes and loads it with no edit under textattn/).

"toy_reverse": each example is a random sequence of `length` symbols (ids 2..vocab-1) and its
target is the same sequence reversed; a tiny encoder (token + position embeddings, one attention
layer from the registry, a per-position softmax over the symbols) learns it with a per-symbol
cross-entropy. Its data are made from config.data_seed, so there is nothing to download. The
runner does everything else (checkpoints, resume, signals, NaN recovery, the report).
`textattn.load(workdir)` returns a Reverser whose `.reverse(sequences)` predicts. Load it with
`--plugin=tests.toy_task` (textattn.main) or `plugins=["tests.toy_task"]` (textattn.load).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from textattn import attention, optim, restore, tasks
from textattn.data import Dataset, Split, TrainIterator, eval_batches
from textattn.errors import UsageError


def toy_defaults() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.task = "toy_reverse"
  config.length = 6  # symbols per sequence
  config.vocab = 10  # ids 0..vocab-1; 0 and 1 are never drawn
  config.examples = 256  # train examples (validation and test: a quarter each)
  config.data_seed = 0
  config.model = ml_collections.ConfigDict()
  config.model.attention = "softmax"
  config.model.embed_dim = 16
  config.model.num_heads = 2
  config.optimizer = optim.defaults()
  config.optimizer.learning_rate = 1e-2
  # The runner adds its own fields (seed, epochs, checkpoints, ...) and checks them: a task
  # sets only those it wants otherwise.
  config.batch_size = 16
  return config


def validate(config, device_count):
  """Only the task's own fields: the runner checks its own (batch sizes, epochs, ...)."""
  if device_count is not None:
    return
  if config.vocab < 3 or config.length < 1:
    raise UsageError(f"config.vocab={config.vocab} must be >= 3 and config.length="
                     f"{config.length} >= 1.")
  attention.get(config.model.attention)


class Reverser(nn.Module):
  """inputs [B, 2 * length] (sequence, then its reversal) -> logits [B, length, vocab]."""
  vocab: int
  length: int
  embed_dim: int
  num_heads: int
  attention: str

  @nn.compact
  def __call__(self, inputs, train: bool = False):
    del train
    sequence = inputs[:, :self.length]
    x = nn.Embed(self.vocab, self.embed_dim, name="token")(sequence)
    x = x + nn.Embed(self.length, self.embed_dim, name="position")(jnp.arange(self.length))
    attend = attention.get(self.attention).build(num_heads=self.num_heads, implementation="xla",
                                                 dtype=jnp.float32, name="attention")
    x = x + attend(x, sequence > 0)
    return nn.Dense(self.vocab, name="logits")(nn.relu(nn.Dense(self.embed_dim)(x)))


def _sums(logits, targets, weights):
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  real = jnp.broadcast_to(weights[:, None], targets.shape)
  correct = (jnp.argmax(logits, -1) == targets) * real
  return {"loss_sum": jnp.sum(losses * real), "correct": jnp.sum(correct),
          "count": jnp.sum(real)}


def train_step(state, batch):
  length = batch["inputs"].shape[1] // 2
  targets = batch["inputs"][:, length:]

  def loss_fn(params):
    logits = state.apply_fn({"params": params}, batch["inputs"], train=True)
    sums = _sums(logits, targets, jnp.ones(targets.shape[0]))
    return sums["loss_sum"] / sums["count"], sums

  grads, sums = jax.grad(loss_fn, has_aux=True)(state.params)
  state = state.apply_gradients(grads=grads)
  nonfinite = ~jnp.isfinite(sums["loss_sum"]) + sum(
      jnp.sum(~jnp.isfinite(p)) for p in jax.tree_util.tree_leaves(state.params))
  return state, {**sums, "nonfinite": nonfinite.astype(jnp.int32)}


def make_data(config) -> Dataset:
  rng = np.random.default_rng(config.data_seed)
  splits = []
  for n in (config.examples, config.examples // 4, config.examples // 4):
    sequences = rng.integers(2, config.vocab, size=(n, config.length), dtype=np.int32)
    splits.append(Split(np.concatenate([sequences, sequences[:, ::-1]], axis=1),
                        np.zeros(n, np.int32)))
  return Dataset(train=splits[0], validation=splits[1], test=splits[2], class_names=[],
                 vocab_size=config.vocab)


def build(config) -> Reverser:
  m = config.model
  return Reverser(config.vocab, config.length, m.embed_dim, m.num_heads, m.attention)


def prepare(config, workdir, is_main):
  del workdir, is_main
  data, model = make_data(config), build(config)
  evaluate_batch = jax.jit(lambda state, batch: _sums(
      state.apply_fn({"params": state.params}, batch["inputs"]),
      batch["inputs"][:, config.length:], batch["weights"]))

  def evaluate(state, split, prefix):
    totals = None
    for batch in eval_batches(split, config.platform.eval_batch_size):
      sums = evaluate_batch(state, batch)
      totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    count = float(totals["count"])
    return {f"{prefix}/loss": float(totals["loss_sum"]) / count,
            f"{prefix}/accuracy": float(totals["correct"]) / count}, None

  return tasks.Job(
      data=data, module=model, init_length=2 * config.length,
      train_iter=TrainIterator(data.train, config.batch_size, config.seed),
      train_step=train_step, evaluate=evaluate,
      report=lambda state, report_step, reused: evaluate(state, data.test, "test")[0],
      describe=lambda params: f"Toy reverser of {config.length} symbols")


class ReverserModel:
  """What textattn.load gives for a toy_reverse workdir."""

  def __init__(self, workdir, checkpoint, config):
    self.config, self.model = config, build(config)
    self.step, self.params = restore.restore_params(workdir, checkpoint, config, self.model,
                                                    2 * config.length)

  def reverse(self, sequences) -> np.ndarray:
    sequences = np.asarray(sequences, np.int32)
    inputs = np.concatenate([sequences, np.zeros_like(sequences)], axis=1)
    logits = self.model.apply({"params": self.params}, inputs)
    return np.asarray(jnp.argmax(logits, -1))


tasks.register(tasks.Task(name="toy_reverse", defaults=toy_defaults, validate=validate,
                          prepare=prepare, load=ReverserModel,
                          description="toy: reverse a short sequence (tests/toy_task.py)"))
