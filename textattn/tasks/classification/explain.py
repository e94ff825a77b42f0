"""Which tokens a trained classifier's prediction rests on: one weight per token, as a
self-contained HTML heat map and JSON lines (`python -m textattn.predict --explain=DIR`,
`textattn.load(workdir).explain(texts)`).

The method depends on the model:
- "attention_pooling" (config.model.pooling == "attention"): the pooling's own softmax weights
  over the tokens, alpha = softmax(w2 . tanh(W1 h)) -- the share each token's final hidden state
  has in the vector the head classifies. Non-negative, summing to 1 over the tokens seen (with
  padding="before_as_token" the softmax also covers the padding positions, shown as 0).
- "gradient_x_input" (every other pooling): the gradient of the predicted class's logit with
  respect to each token's embedding row, dotted with that row. The logit is taken centred (minus
  the mean of all classes' logits), the part of it the softmax sees: a shift shared by all
  logits changes no probability. Signed: positive weights push towards the predicted class,
  negative ones away from it. (With bigram_buckets > 0 the hashed bigram rows are not included:
  only the word's own embedding.) On IMDB the uncentred logit ranked tokens almost as well but
  gave some "against" weights to tokens that in fact supported a borderline prediction
  (experiments/RESULTS.md section 21).

Tokens are the ones the model sees (the word tokenizer's standardised words, or bytes); a text
longer than max_len keeps its weights for the max_len tokens the model saw (its end with
truncation "pre", its start with "post") and marks the others "not seen" (weight None).
experiments/explain_deletion.py checks the weights are the model's own: deleting the
highest-weight tokens changes predictions more than deleting as many random ones
(experiments/RESULTS.md section 21).
"""

from __future__ import annotations

import html
import json
import os

import numpy as np

from textattn import data as data_lib
from textattn import train_state
from textattn.data import tokenizer as tokenizer_lib
from textattn.errors import UsageError
from textattn.models import bert

ATTENTION_POOLING = "attention_pooling"
GRADIENT_X_INPUT = "gradient_x_input"
METHOD_DESCRIPTIONS = {
    ATTENTION_POOLING: "attention-pooling weights (the model's softmax over tokens)",
    GRADIENT_X_INPUT: "gradient x input (d centred predicted-class logit / d token embedding, "
                      "dotted with the embedding)",
}


def is_blank(text: str) -> bool:
  """A text with nothing to classify (empty or only whitespace): no prediction is made for it."""
  return not text.strip()


def method_for(config) -> str:
  """The config's explanation method; a ValueError for a model whose inputs are not tokens."""
  architecture = config.model.architecture
  if architecture == "bag":
    raise UsageError("--explain needs a model over tokens (transformer or bilstm); a bag model's "
                     "inputs are n-gram features, not the text's tokens.")
  if architecture == "transformer" and config.model.pooling == "attention":
    return ATTENTION_POOLING
  return GRADIENT_X_INPUT


def make_weights_fn(model, config, centred: bool = True):
  """jit(params, tokens int32 [B, L]) -> (probabilities float32 [B, C], weights float32 [B, L]);
  weights are 0 at padding positions. centred=False: gradient x input of the raw predicted
  logit (kept for experiments/explain_deletion.py's comparison)."""
  import jax
  import jax.numpy as jnp

  method = method_for(config)

  def real_tokens(tokens):
    # The positions that are text: with padding "before_as_token" the model treats id 0 as a
    # token, but it is no word of the text, so it gets no weight here either.
    return tokens != 0

  def attention_pooling(params, tokens):
    logits, state = model.apply(
        {"params": params}, tokens, train=False,
        capture_intermediates=lambda module, method_name: (
            method_name == "__call__" and module.name == "score"
            and module.parent is not None and module.parent.name == "attention_pooling"))
    scores = state["intermediates"]["attention_pooling"]["score"]["__call__"][0][..., 0]
    # The same weights AttentionPooling computes (textattn/models/layers.py), over the positions the
    # model's padding mask lets it pool.
    pooled = real_tokens(tokens) if model.mask_padding else jnp.ones(tokens.shape, bool)
    scores = jnp.where(pooled, scores.astype(jnp.float32), -1e30)
    weights = jax.nn.softmax(scores, axis=1) * pooled
    return logits, weights

  def gradient_x_input(params, tokens):
    table = token_table(params)
    embeddings = jnp.take(table, tokens, axis=0).astype(jnp.float32)
    logits_of = lambda rows: model.apply({"params": params}, tokens, train=False,
                                         token_embeddings=rows)
    logits, pullback = jax.vjp(logits_of, embeddings)
    # Each row's own predicted logit: rows are independent at inference, so one pullback of the
    # one-hot cotangent gives every row's gradient at once.
    classes = logits.shape[-1]
    target = jax.nn.one_hot(jnp.argmax(logits, axis=-1), classes, dtype=logits.dtype)
    if centred:  # d(l_pred - mean(l)) = d l_pred - mean over classes of d l
      target = target - 1.0 / classes
    (gradient,) = pullback(target)
    return logits, jnp.sum(gradient * embeddings, axis=-1)

  compute = attention_pooling if method == ATTENTION_POOLING else gradient_x_input

  def weights_fn(params, tokens):
    logits, weights = compute(params, tokens)
    weights = jnp.where(real_tokens(tokens), weights.astype(jnp.float32), 0.0)
    return jax.nn.softmax(logits.astype(jnp.float32), axis=-1), weights

  return jax.jit(weights_fn)


def token_table(params):
  """The token-embedding table of a transformer, a pretrained encoder or a BiLSTM."""
  from collections.abc import Mapping

  for path in (train_state.TOKEN_TABLE_PATH, bert.TOKEN_TABLE_PATH, ("embedding", "embedding")):
    node = params
    for name in path:
      node = node.get(name) if isinstance(node, Mapping) else None
    if node is not None:
      return node
  raise ValueError(f"No token-embedding table among the parameters {sorted(params)}.")


def run_batched(fn, params, inputs: np.ndarray, batch_size: int) -> tuple[np.ndarray, ...]:
  """fn(params, batch) over `inputs` in full batches (the last one zero-padded, so one
  compilation serves every call); each output cut back to len(inputs) rows."""
  outputs = []
  for start in range(0, len(inputs), batch_size):
    batch = inputs[start:start + batch_size]
    padded = np.zeros((batch_size,) + inputs.shape[1:], inputs.dtype)
    padded[:len(batch)] = batch
    outputs.append([np.asarray(out)[:len(batch)] for out in fn(params, padded)])
  if not outputs:  # no inputs: the outputs' shapes from one zero batch, cut to 0 rows
    zeros = np.zeros((batch_size,) + inputs.shape[1:], inputs.dtype)
    return tuple(np.asarray(out)[:0] for out in fn(params, zeros))
  return tuple(np.concatenate(parts) for parts in zip(*outputs))


def text_tokens(tokenizer, text: str) -> list[str]:
  """The tokens of `text` as the tokenizer splits it (words, or one string per UTF-8 byte)."""
  if tokenizer.kind == "byte":
    return [chr(b) if b < 128 else f"\\x{b:02x}" for b in text.encode("utf-8")]
  return tokenizer_lib.standardize(text).split()


def seen_span(count: int, max_len: int, truncation: str) -> tuple[int, int]:
  """[start, end) of the tokens the model sees out of `count` ("pre" keeps the end)."""
  if count <= max_len:
    return 0, count
  return (count - max_len, count) if truncation == "pre" else (0, max_len)


def explain_rows(classifier, texts: list[str]) -> list[dict]:
  """One dict per text: text, label, probabilities, method, tokens (strings), weights (one per
  token; None where the token was not seen), seen (how many were), truncated, oov (indices of
  out-of-vocabulary words)."""
  config = classifier.config
  texts = list(texts)
  inputs, lengths = classifier.encode(texts)
  probabilities, weights = run_batched(classifier.weights_fn(), classifier.params, inputs,
                                       classifier.batch_size)
  max_len, method = int(config.max_len), method_for(config)
  rows = []
  for text, row_inputs, row_probabilities, row_weights, length in zip(
      texts, inputs, probabilities, weights, lengths):
    if classifier.tokenizer.kind == "pretrained":
      # A pretrained model's subword tokens, the special ones included, as the model saw them;
      # the tokens truncation dropped (`length` counts them) are not listed.
      tokens = classifier.tokenizer.tokens(row_inputs)
      rows.append(_row(classifier, text, row_probabilities, method, tokens,
                       [float(w) for w in row_weights[:len(tokens)]], len(tokens),
                       length > len(tokens), []))
      continue
    tokens = text_tokens(classifier.tokenizer, text)
    start, end = seen_span(len(tokens), max_len, config.layout.truncation)
    seen = end - start
    # Tokens are left-aligned in the model's input, or right-aligned with padding before them.
    offset = max_len - seen if _pads_before(config) else 0
    seen_weights = row_weights[offset:offset + seen]
    token_weights = [None] * len(tokens)
    for i in range(seen):
      token_weights[start + i] = float(seen_weights[i])
    oov = [start + i for i in range(seen) if int(row_inputs[offset + i]) == 1
           and classifier.tokenizer.kind == "word"]
    rows.append(_row(classifier, text, row_probabilities, method, tokens, token_weights, seen,
                     seen < len(tokens), oov))
  return rows


def _row(classifier, text, probabilities, method, tokens, weights, seen, truncated, oov) -> dict:
  if is_blank(text):  # no prediction, as predict() says (label and probabilities null)
    return {"text": text, "label": None, "probabilities": None, "method": method, "tokens": [],
            "weights": [], "seen": 0, "truncated": False, "oov": []}
  return {"text": text, "label": classifier.class_names[int(np.argmax(probabilities))],
          "probabilities": {name: float(p) for name, p in zip(classifier.class_names,
                                                               probabilities)},
          "method": method, "tokens": tokens, "weights": weights, "seen": seen,
          "truncated": bool(truncated), "oov": oov}


def _pads_before(config) -> bool:
  return data_lib.pads_before(config)


def write(directory: str, rows: list[dict], title: str = "", separator: str = " "
          ) -> tuple[str, str]:
  """DIR/explain.jsonl and DIR/explain.html of explain_rows' rows; returns both paths."""
  os.makedirs(directory, exist_ok=True)
  jsonl_path = os.path.join(directory, "explain.jsonl")
  html_path = os.path.join(directory, "explain.html")
  lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
  data_lib.atomic_write(jsonl_path, lambda f: f.write(lines))
  page = render_html(rows, title, separator)
  data_lib.atomic_write(html_path, lambda f: f.write(page))
  return jsonl_path, html_path


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px;
       color: #222; max-width: 1100px; }
h1 { font-size: 20px; margin: 0 0 4px 0; }
.note { color: #555; font-size: 13px; margin: 4px 0; }
.legend span { padding: 1px 6px; margin-right: 4px; border-radius: 3px; font-size: 13px; }
.item { border: 1px solid #ddd; border-radius: 6px; padding: 10px 14px; margin: 14px 0; }
.head { font-size: 14px; margin-bottom: 6px; }
.label { font-weight: bold; }
.probs { color: #555; margin-left: 10px; }
.text { line-height: 1.9; font-size: 15px; }
.text span { padding: 1px 2px; border-radius: 3px; }
.text span.unseen { color: #aaa; background: #f2f2f2; }
.text span.oov { text-decoration: underline dotted; }
"""


def _colour(weight: float, scale: float, signed: bool) -> str:
  """Red for weight towards the predicted class, blue against; stronger = more saturated."""
  strength = 0.0 if scale <= 0 else min(1.0, abs(weight) / scale)
  alpha = round(0.85 * strength, 3)
  rgb = "220, 40, 40" if (weight >= 0 or not signed) else "40, 90, 220"
  return f"background: rgba({rgb}, {alpha})"


def render_html(rows: list[dict], title: str = "", separator: str = " ") -> str:
  """One self-contained page (inline CSS, no scripts or external assets); every text escaped.
  separator: between tokens ("" for byte tokens, which include the spaces themselves)."""
  methods = sorted({row["method"] for row in rows})
  signed = GRADIENT_X_INPUT in methods
  described = "; ".join(METHOD_DESCRIPTIONS[m] for m in methods) or "none (no texts)"
  parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{html.escape(title or 'textattn explanations')}</title>",
           f"<style>{_CSS}</style></head><body>",
           f"<h1>{html.escape(title or 'textattn explanations')}</h1>",
           (f'<p class="note">Method: <b>{html.escape(described)}</b>. Each token is shaded by '
            f"its weight, scaled to the text's largest |weight|; hover a token for its value.</p>"),
           '<p class="note legend">'
           + ('<span style="background: rgba(220, 40, 40, 0.6)">towards the predicted label'
              "</span>" if signed else
              '<span style="background: rgba(220, 40, 40, 0.6)">high weight</span>')
           + ('<span style="background: rgba(40, 90, 220, 0.6)">against it</span>'
              if signed else "")
           + '<span class="unseen" style="background: #f2f2f2; color: #aaa">not seen '
             '(beyond max_len)</span><span style="text-decoration: underline dotted">out of '
             "vocabulary</span></p>"]
  for number, row in enumerate(rows, start=1):
    seen_weights = [w for w in row["weights"] if w is not None]
    scale = max((abs(w) for w in seen_weights), default=0.0)
    row_signed = row["method"] == GRADIENT_X_INPUT
    oov = set(row.get("oov", ()))
    probabilities = ", ".join(f"{html.escape(str(name))} {p:.3f}"
                              for name, p in (row["probabilities"] or {}).items())
    prediction = ("no prediction (blank text)" if row["label"] is None else
                  f'predicted <span class="label">{html.escape(str(row["label"]))}</span>'
                  f'<span class="probs">({probabilities})</span>')
    parts.append(f'<div class="item"><div class="head">#{number} &middot; {prediction}'
                 f'<span class="probs">{row["seen"]} of {len(row["tokens"])} tokens seen'
                 f'{" (truncated)" if row["truncated"] else ""}</span></div><div class="text">')
    spans = []
    for index, (token, weight) in enumerate(zip(row["tokens"], row["weights"])):
      if weight is None:
        spans.append(f'<span class="unseen" title="not seen (beyond max_len)">'
                     f"{html.escape(token)}</span>")
      else:
        extra = " oov" if index in oov else ""
        tip = f"{weight:+.4g}" + (" (out of vocabulary)" if index in oov else "")
        spans.append(f'<span class="w{extra}" style="{_colour(weight, scale, row_signed)}" '
                     f'title="{html.escape(tip)}">{html.escape(token)}</span>')
    parts.append(separator.join(spans) if spans else '<span class="unseen">(empty text)</span>')
    parts.append("</div></div>")
  parts.append("</body></html>\n")
  return "\n".join(parts)
