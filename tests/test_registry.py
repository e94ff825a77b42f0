"""A new attention variant is one new module: tests/toy_attention.py registers "toy_mean" from
outside textattn, and with no edit under textattn/ it trains (in-process and through
textattn.main) and is benchmarked (through textattn.benchmark, whose per-point subprocess must
import the plugin too).

The benchmark and main runs start at once (module fixture) so their start-ups overlap.
"""

import csv
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from textattn import attention, defaults, models, optim, train_state
from textattn.benchmark import plan, sweep
from textattn.tasks.classification import step as step_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN = "tests.toy_attention"
ENV = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
TINY_MODEL = {"model.embed_dim": 8, "model.num_heads": 2, "model.ffn_dim": 8,
              "model.mlp_dim": 4}


def write_sentiment_csv(path, n=64, seed=0):
  """A tiny learnable task: the label is whether the text holds a positive or a negative word."""
  rng = np.random.default_rng(seed)
  filler = ["the", "a", "film", "plot", "was", "and"]
  with open(path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["text", "label"])
    for _ in range(n):
      label = int(rng.integers(2))
      words = list(rng.choice(filler, size=5)) + [["bad", "good"][label]]
      writer.writerow([" ".join(words), ["neg", "pos"][label]])
  return str(path)


def benchmark_command(out_dir, *extra):
  return [sys.executable, "-m", "textattn.benchmark", f"--plugin={PLUGIN}",
          "--variants=toy_mean", "--mode=forward+backward", "--seq_lens=16", "--batch_size=2",
          "--embed_dim=8", "--num_heads=2", "--warmup=0", "--repeats=1", f"--out_dir={out_dir}",
          *extra]


def main_command(tmp_path, workdir):
  values = {"dataset": write_sentiment_csv(tmp_path / "sentiment.csv"),
            "cache_dir": str(tmp_path / "cache"), "vocab_size": 32, "max_len": 8,
            "batch_size": 8, "platform.eval_batch_size": 16, "num_train_steps": 2, "log_every_steps": 1,
            "eval_every_steps": 2, "checkpoint_every_steps": 2, "model.attention": "toy_mean",
            **TINY_MODEL}
  return [sys.executable, "-m", "textattn.main", f"--plugin={PLUGIN}",
          f"--config={os.path.join(ROOT, 'tests', 'recipes_config.py')}",
          f"--workdir={workdir}"] + [f"--config.{k}={v}" for k, v in values.items()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  tmp_path = tmp_path_factory.mktemp("registry")
  commands = {"benchmark": benchmark_command(tmp_path / "benchmark"),
              "main": main_command(tmp_path, tmp_path / "workdir")}
  started = {name: subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
             for name, command in commands.items()}
  finished = {}

  def finish(name):
    if name not in finished:
      stdout, stderr = started[name].communicate(timeout=300)
      finished[name] = (started[name].returncode, stdout, stderr, tmp_path)
    return finished[name]

  yield finish
  for process in started.values():
    if process.poll() is None:
      process.kill()
      process.communicate()


def test_toy_variant_is_the_masked_mean_of_the_values(toy):
  module = attention.get("toy_mean").build(num_heads=2, implementation="auto",
                                           dtype=jnp.float32, name="attention")
  x = jax.random.normal(jax.random.key(0), (3, 5, 4))
  padding_mask = jnp.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]], bool)
  params = module.init(jax.random.key(1), x, padding_mask)
  out = np.asarray(module.apply(params, x, padding_mask))
  value = np.asarray(x @ params["params"]["value"]["kernel"] + params["params"]["value"]["bias"])
  np.testing.assert_allclose(out[0], np.broadcast_to(value[0].mean(0), (5, 4)), rtol=1e-5)
  np.testing.assert_allclose(out[1], np.broadcast_to(value[1, :2].mean(0), (5, 4)), rtol=1e-5)
  assert (out[2] == 0).all()  # no real token: zeros, not NaN


def test_toy_variant_trains_in_the_classifier(toy):
  config = defaults.complete(defaults.classification())
  config.update(vocab_size=32, max_len=8, batch_size=4)
  for field, value in TINY_MODEL.items():
    config.model[field.split(".")[1]] = value
  config.model.attention = "toy_mean"
  model = models.build_model(config, num_classes=2)
  tx = optim.make_optimizer(config.optimizer, total_steps=10)
  state = train_state.init_train_state(model, tx, jax.random.key(0), config.max_len,
                                    config.optimizer)
  before = jax.tree.map(np.asarray, state.params)
  tokens = np.array([[3, 4, 5, 6, 0, 0, 0, 0], [7, 8, 9, 0, 0, 0, 0, 0],
                     [1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 0, 0, 0, 0, 0, 0]], np.int32)
  batch = {"inputs": jnp.asarray(tokens), "labels": jnp.array([0, 1, 1, 0], jnp.int32)}
  state, metrics = jax.jit(step_lib.train_step)(state, batch)
  loss = float(metrics["loss_sum"]) / int(metrics["count"])
  assert np.isfinite(loss) and int(metrics["nonfinite"]) == 0
  assert int(state.step) == 1
  # The toy module is in the model and on the gradient path: its own weights moved.
  toy_params = {jax.tree_util.keystr(path): leaf
                for path, leaf in jax.tree_util.tree_leaves_with_path(before)
                if "attention" in [key.key for key in path]}
  assert sorted(toy_params) == ["['block_0']['attention']['value']['bias']",
                                "['block_0']['attention']['value']['kernel']"]
  after = {jax.tree_util.keystr(path): leaf
           for path, leaf in jax.tree_util.tree_leaves_with_path(state.params)}
  for name, leaf in toy_params.items():
    assert not np.allclose(leaf, np.asarray(after[name])), name


def test_toy_variant_is_benchmarked_through_the_plugin_flag(runs):
  returncode, stdout, stderr, tmp_path = runs("benchmark")
  assert returncode == 0, stderr[-2000:]
  with open(tmp_path / "benchmark" / "results.csv", newline="") as f:
    (row,) = list(csv.DictReader(f))
  assert row["status"] == "ok", row["message"]
  assert (row["variant"], row["attention"], row["implementation"]) == (
      "toy_mean", "toy_mean", "xla")
  assert (row["mode"], row["seq_len"], row["batch_size"]) == ("forward+backward", "16", "2")
  assert float(row["median_ms"]) > 0 and "toy_mean" in stdout


def test_toy_variant_trains_through_the_main_cli(runs):
  returncode, stdout, stderr, tmp_path = runs("main")
  assert returncode == 0, (stdout + stderr)[-3000:]
  with open(tmp_path / "workdir" / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f if line.strip()]
  losses = [row["train/loss"] for row in rows if "train/loss" in row]
  assert losses and all(np.isfinite(losses))
  assert max(row.get("step", 0) for row in rows) == 2


def test_the_point_subprocess_needs_the_plugin_it_is_given(toy):
  # Planned in a process that has the plugin, run in one that is not told to import it: the
  # child cannot build the point. (With the plugin in the spec it can: the CLI test above.)
  config = defaults.complete(defaults.classification())
  settings = plan.resolve_settings(config, "attention", {
      "variants": "toy_mean", "seq_lens": "8", "embed_dim": 8, "num_heads": 2, "batch_size": 2})
  (spec,) = plan.plan_points(config, settings, "attention", warmup=0, repeats=1)
  assert spec["plugins"] == []
  result = sweep.run_point_in_subprocess(spec, timeout_s=120)
  assert result["status"] == "error" and "toy_mean" in result["message"], result


@pytest.mark.parametrize("name,expected", [
    ("toy_mean", ("toy_mean", "xla")), ("toy_mean_auto", ("toy_mean", "auto")),
    ("toy_mean_xla", ("toy_mean", "xla"))])
def test_variant_names_with_underscores_match_the_longest_registered_name(toy, name, expected):
  assert plan.parse_variant(name) == expected
  with pytest.raises(ValueError, match="toy_mean_<impl> with <impl> one of auto, xla"):
    plan.parse_variant("toy_mean_chunked")


@pytest.mark.parametrize("command", ["benchmark", "main"])
def test_an_unknown_plugin_is_one_clear_error(tmp_path, command):
  args = (benchmark_command(tmp_path / "out") if command == "benchmark"
          else main_command(tmp_path, tmp_path / "workdir"))
  args = [arg.replace(PLUGIN, "tests.no_such_plugin") for arg in args]
  result = subprocess.run(args, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120,
                          check=False)
  assert result.returncode != 0
  assert "Traceback" not in result.stderr
  lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert len(lines) == 1 and "--plugin='tests.no_such_plugin' cannot be imported" in lines[0]
  assert not (tmp_path / "out").exists()
