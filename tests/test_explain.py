"""textattn.explain / predict --explain: one weight per token, the model's own."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import textattn
from tests.test_train import NEGATIVE, POSITIVE, REPO, tiny_config, write_sentiment_jsonl
from textattn import models
from textattn import run as runner
from textattn.tasks.classification import explain

SENTIMENT = set(POSITIVE + NEGATIVE)


def _train(tmp, name, **overrides):
  data = write_sentiment_jsonl(tmp / "reviews.jsonl")
  config = tiny_config(data, tmp / "cache", num_train_steps=60, eval_every_steps=30,
                       checkpoint_every_steps=30, **overrides)
  runner.train_and_evaluate(config, str(tmp / name))
  return textattn.load(str(tmp / name))


@pytest.fixture(scope="module")
def mean_model(tmp_path_factory):
  # The Keras seed's layout (padding first, as a token): weights must map back past it.
  return _train(tmp_path_factory.mktemp("explain_mean"), "run", padding="before_as_token")




def _texts(count=40, seed=1):
  rng = np.random.default_rng(seed)
  texts = []
  for _ in range(count):
    words = list(rng.choice(["the", "a", "film", "plot", "actor", "scene", "and"], size=6))
    words.insert(int(rng.integers(7)), str(rng.choice(POSITIVE + NEGATIVE)))
    texts.append(" ".join(words))
  return texts


def test_one_weight_per_token_and_truncated_tokens_marked_not_seen(mean_model):
  max_len = mean_model.config.max_len
  long = " ".join(["plot"] * (max_len + 5) + ["awful"])
  short, empty, truncated = mean_model.explain(["A good, fine film!", "", long])
  assert short["tokens"] == ["a", "good", "fine", "film"]
  assert len(short["weights"]) == 4 and None not in short["weights"]
  assert short["method"] == explain.GRADIENT_X_INPUT and not short["truncated"]
  assert short["label"] == mean_model.predict(["A good, fine film!"])[0]["label"]
  assert empty["tokens"] == [] and empty["weights"] == [] and empty["seen"] == 0
  # truncation "pre" keeps the end: the first 6 tokens were not seen
  assert truncated["truncated"] and truncated["seen"] == max_len
  assert truncated["weights"][:6] == [None] * 6 and None not in truncated["weights"][6:]
  assert len(truncated["weights"]) == len(truncated["tokens"]) == max_len + 6


def test_the_deciding_word_gets_the_top_weight(mean_model):
  # One word decides each label; a weight mapped back to the wrong word (e.g. off by the
  # padding in front) would rarely land on it.
  rows = mean_model.explain(_texts())
  top = [row["tokens"][int(np.argmax(row["weights"]))] for row in rows]
  assert np.mean([word in SENTIMENT for word in top]) >= 0.8, top


def test_deleting_the_top_token_moves_the_logit_more_than_the_lowest(mean_model):
  model = mean_model
  inputs, _ = model.encode(_texts())
  probabilities, weights = explain.run_batched(model.weights_fn(), model.params, inputs,
                                               model.batch_size)
  real = inputs != 0
  rows = np.arange(len(inputs))
  predicted = probabilities.argmax(-1)

  def drop(scores):
    position = np.where(real, scores, -np.inf).argmax(1)
    deleted = inputs.copy()
    deleted[rows, position] = 0
    return probabilities[rows, predicted] - model._run(deleted)[rows, predicted]

  top, lowest = drop(weights), drop(-weights)
  assert np.mean(top) > 0 > np.mean(lowest) and np.mean(top > lowest) >= 0.9, (top, lowest)


def test_gradient_x_input_matches_finite_differences(mean_model):
  model = mean_model
  inputs, _ = model.encode(["the plot was good and the actor fine"])
  _, weights = model.weights_fn()(model.params, inputs)
  table = model.params["embedding"]["token"]["embedding"]
  embeddings = table[inputs[0]]
  positions = np.flatnonzero(inputs[0])

  def centred_logit(scale):  # each row: one token's embedding row scaled by `scale`
    rows = jnp.stack([embeddings.at[p].multiply(scale) for p in positions])
    tokens = np.repeat(inputs, len(positions), axis=0)
    logits = model.model.apply({"params": model.params}, tokens, train=False,
                               token_embeddings=rows)
    return logits[:, predicted] - logits.mean(-1)

  predicted = int(np.argmax(model._run(inputs)[0]))
  eps = 1e-2
  numeric = (centred_logit(1 + eps) - centred_logit(1 - eps)) / (2 * eps)
  np.testing.assert_allclose(np.asarray(weights)[0, positions], numeric, rtol=2e-2, atol=2e-3)
  assert np.all(np.asarray(weights)[0, inputs[0] == 0] == 0)  # padding gets no weight


def test_attention_path_uses_the_pooling_weights(mean_model, tmp_path):
  # A freshly initialised attention-pooling model (no training needed for the identity).
  config = tiny_config(str(tmp_path / "unused.jsonl"), tmp_path, **{"model.pooling": "attention"})
  model = models.build_model(config, 2, vocab_size=mean_model.tokenizer.vocab_size)
  inputs = mean_model.tokenizer.encode(["the film was superb", "a dull plot and a dull actor"],
                                       config.max_len, config.layout.truncation)
  params = model.init(jax.random.key(0), inputs)["params"]
  assert explain.method_for(config) == explain.ATTENTION_POOLING
  _, weights = explain.make_weights_fn(model, config)(params, inputs)
  weights = np.asarray(weights)
  assert np.all(weights >= 0) and np.all(weights[inputs == 0] == 0)
  np.testing.assert_allclose(weights.sum(1), 1.0, rtol=1e-5)
  assert np.ptp(weights[0, :4]) > 0  # not uniform: the scores, not a mean
  # The weights are those the pooling averages with: sum_t w_t h_t is the pooled vector.
  _, state = model.apply(
      {"params": params}, inputs, train=False,
      capture_intermediates=lambda m, method: method == "__call__" and m.name in (
          "block_0", "attention_pooling"))
  hidden = state["intermediates"]["block_0"]["__call__"][0]
  pooled = state["intermediates"]["attention_pooling"]["__call__"][0]
  np.testing.assert_allclose(jnp.einsum("bl,bld->bd", weights, hidden), pooled, rtol=1e-5,
                             atol=1e-6)


def test_cli_writes_escaped_html_and_json_lines(mean_model, tmp_path):
  text = "<script>alert(1)</script> a superb film & more"
  out = tmp_path / "explained"
  done = subprocess.run([sys.executable, "-m", "textattn.predict",
                         f"--workdir={mean_model.workdir}", f"--text={text}", "--text=",
                         f"--explain={out}"], cwd=REPO, capture_output=True, text=True,
                        check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "gradient x input" in done.stderr and len(done.stdout.splitlines()) == 2
  rows = [json.loads(line) for line in (out / "explain.jsonl").read_text().splitlines()]
  assert [r["text"] for r in rows] == [text, ""]
  assert rows[0]["method"] == "gradient_x_input"
  assert len(rows[0]["tokens"]) == len(rows[0]["weights"])
  page = (out / "explain.html").read_text()
  assert page.startswith("<!DOCTYPE html>") and "gradient x input" in page
  assert "<script" not in page and "http" not in page  # no scripts, no external assets
  assert "superb" in page and "(empty text)" in page
  # Everything the page shows is escaped (tokens keep markup with a byte tokenizer).
  html = explain.render_html([{"text": "x", "label": "<b>pos</b>", "probabilities": {"<i>": 1.0},
                               "method": explain.ATTENTION_POOLING, "tokens": ["<script>", "&"],
                               "weights": [0.7, None], "seen": 1, "truncated": True}], "<t>")
  assert "<script>" not in html and "&lt;script&gt;" in html and "&amp;" in html
  assert "<b>pos" not in html and "<i>" not in html and "&lt;t&gt;" in html
  assert 'class="unseen"' in html and "attention-pooling" in html
