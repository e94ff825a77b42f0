"""Training with sequence parallelism (config.mesh.sequence): the runner, loop and models on a
(data, sequence) mesh of 8 fake CPU devices give one device's training, resume exactly after
SIGKILL, resume under another mesh with a note, train translation, and refuse what cannot be
split before anything runs; a sequence axis that spans two processes trains like one device.

The runs are textattn.main subprocesses (config.platform.num_cpu_devices=8: the rest of the suite runs
on one device); the pooling check runs this file as a script on 8 devices
(`python tests/test_sequence_training.py poolings` prints one JSON line).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

TOLERANCE = 1e-5
MESH = ["--config.platform.num_cpu_devices=8", "--config.mesh.sequence=4"]  # data 2 x sequence 4


def _final_loss(workdir):
  from tests.test_train import read_metrics
  return [row for row in read_metrics(workdir) if "train/loss" in row][-1]


def _finish(process, timeout=300):
  try:
    out, _ = process.communicate(timeout=timeout)
  finally:
    if process.poll() is None:
      process.kill()
      process.communicate()
  assert process.returncode == 0, out[-3000:]
  return out


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
  """The one-device run the mesh runs of this file compare with, started at once (so a test's
  own runs overlap it) and shared: .args (ring softmax attention, CLS pooling, hashed bigrams,
  dropout and word dropout; 50 steps, evaluations and checkpoints at 25 and 50), .done() -> its
  workdir once it has finished."""
  from types import SimpleNamespace

  from tests.test_train import cli_args, run_main, write_sentiment_jsonl
  root = tmp_path_factory.mktemp("one_device")
  data = write_sentiment_jsonl(root / "reviews.jsonl")
  args = cli_args(data, root / "cache", num_train_steps=50, eval_every_steps=25,
                  checkpoint_every_steps=25, log_every_steps=25, **{
                      "model.pooling": "cls", "embedding.bigram_buckets": 7,
                      "embedding.token_dropout_rate": 0.1, "model.attention": "softmax"})
  process = run_main(args, root / "one", wait=False)

  def done():
    if process.returncode is None:
      _finish(process)
    return root / "one"

  yield SimpleNamespace(args=args, done=done)
  if process.poll() is None:
    process.kill()
    process.communicate()


@pytest.mark.cpu_only
def test_fifty_steps_on_a_2x4_mesh_match_one_device_and_resume_exactly(tmp_path, one_device):
  """Ring softmax attention, CLS pooling (length 16 + 1 padded to 20: padding inside shards, at
  their ends and filling shard tails), hashed bigrams (each shard's first token reads its left
  neighbour's last), dropout and word dropout on: 50 steps on data 2 x sequence 4 end with the
  loss of one device. A third run on the same mesh, SIGKILLed once its first checkpoint (step
  25) is committed, resumes bit-identical to the uninterrupted one; a copy of what the kill left
  resumes on data 4 x sequence 2 with the machine-change note (rounding may differ) and ends
  close."""
  from tests.test_train import assert_rows_close, eval_rows, final_report, run_main
  args = one_device.args
  mesh = run_main(args + MESH, tmp_path / "mesh", wait=False)
  doomed = run_main(args + MESH, tmp_path / "killed", wait=False)
  try:
    _kill_after_first_checkpoint(doomed, tmp_path / "killed" / "checkpoints")
  finally:
    _finish(mesh)
  one = one_device.done()
  expected, got = _final_loss(one), _final_loss(tmp_path / "mesh")
  assert expected["step"] == got["step"] == 50
  assert abs(got["train/loss"] - expected["train/loss"]) <= TOLERANCE * expected["train/loss"]
  assert_rows_close(eval_rows(one), eval_rows(tmp_path / "mesh"))

  shutil.copytree(tmp_path / "killed", tmp_path / "moved")
  resumed = run_main(args + MESH, tmp_path / "killed", wait=False)
  moved = run_main(args + ["--config.platform.num_cpu_devices=8", "--config.mesh.sequence=2"],
                   tmp_path / "moved", wait=False)
  resumed_out, moved_out = _finish(resumed), _finish(moved)
  assert "Resuming from checkpoint at step 25." in resumed_out, resumed_out[-3000:]
  assert "Warning: resuming with other" not in resumed_out
  # (Compared by the checksums each checkpoint records of every array of the state: the test
  # process, on one device, cannot restore an 8-device checkpoint without its model.)
  assert _state_checksums(tmp_path / "mesh") == _state_checksums(tmp_path / "killed")
  assert final_report(tmp_path / "mesh") == final_report(tmp_path / "killed")
  assert eval_rows(tmp_path / "mesh") == eval_rows(tmp_path / "killed")

  assert "Resuming from checkpoint at step 25." in moved_out
  assert ("mesh: {'data': 2, 'sequence': 4} -> {'data': 4, 'sequence': 2}" in moved_out
          and "float rounding may differ" in moved_out), moved_out[-3000:]
  assert_rows_close(eval_rows(tmp_path / "mesh"), eval_rows(tmp_path / "moved"))


def _kill_after_first_checkpoint(process, checkpoints, timeout=240):
  """SIGKILL `process` as soon as a checkpoint directory is committed (Orbax renames its
  temporary directory to the bare step number then); fails if the run ends or times out first."""
  deadline = time.time() + timeout
  try:
    while time.time() < deadline and process.poll() is None:
      if checkpoints.exists() and any(d.isdigit() for d in os.listdir(checkpoints)):
        break
      time.sleep(0.01)
    assert process.poll() is None, "the run ended before it was killed: nothing was tested"
    process.send_signal(signal.SIGKILL)
  finally:
    if process.poll() is None:
      process.kill()
    process.communicate()
  assert process.returncode == -signal.SIGKILL
  assert sorted(d for d in os.listdir(checkpoints) if d.isdigit()) == ["25"]


def _state_checksums(workdir):
  from textattn import checkpointing
  return checkpointing.read_meta_at(workdir / "checkpoints" / "50")["checksums"]["state"]


@pytest.mark.cpu_only
def test_a_sequence_axis_across_two_processes_trains_like_one_device(tmp_path, one_device):
  """Two processes (jax.distributed over gloo) of 2 CPU devices each, mesh.sequence=4: every
  sequence is split over both processes (data 1), so both read the same rows and each lays out
  its half of the length; ring softmax attention (key/value blocks cross processes), CLS
  pooling, hashed bigrams (a halo across the process boundary) and dropout. After 25 and 50
  steps the logged loss equals one device's to 1e-5 relative, and so do the evaluations and
  the test predictions."""
  from tests.test_train import assert_rows_close, eval_rows, read_metrics, run_two_processes
  from textattn import compare
  procs = tmp_path / "procs"
  processes, outputs = run_two_processes(
      one_device.args + ["--config.platform.num_cpu_devices=2", "--config.mesh.sequence=4"], procs,
      timeout=180)
  assert all(p.returncode == 0 for p in processes), [out[-3000:] for out in outputs]
  assert all("2 local / 4 global devices" in out for out in outputs)
  one = one_device.done()
  rows = [[r for r in read_metrics(run) if "train/loss" in r] for run in (one, procs)]
  assert [r["step"] for r in rows[0]] == [r["step"] for r in rows[1]] == [25, 50]
  for a, b in zip(*rows, strict=True):
    assert abs(a["train/loss"] - b["train/loss"]) <= TOLERANCE * a["train/loss"], (a, b)
  assert_rows_close(eval_rows(one), eval_rows(procs))
  labels, probabilities = compare.load_predictions(str(one))
  procs_labels, procs_probabilities = compare.load_predictions(str(procs))
  np.testing.assert_array_equal(procs_labels, labels)
  np.testing.assert_allclose(procs_probabilities, probabilities, rtol=TOLERANCE, atol=1e-7)


@pytest.mark.parametrize("processes, rows", [
    ([[0, 0, 1, 1], [0, 0, 1, 1]], [(0, 1), (0, 1)]),  # data 2 x sequence 4 across both
    ([[0, 0], [1, 1]], [(0, 2), (1, 2)]),              # each data group within a process
    ([[0], [0], [1], [1]], [(0, 2), (1, 2)]),          # data parallelism, 2 devices each
    ([[0, 1, 2, 3], [0, 1, 2, 3]], [(0, 1)] * 4),      # 4 processes share both groups
])
def test_processes_that_share_a_data_group_read_the_same_rows(processes, rows):
  from textattn import platform
  grid = np.array(processes)
  assert [platform.process_row_block(grid, p) for p in range(grid.max() + 1)] == rows


def test_a_mesh_that_gives_processes_uneven_rows_is_refused():
  from textattn import platform
  from textattn.errors import UsageError
  for grid in ([[0, 1], [1, 1]], [[0], [1], [0], [1]]):
    with pytest.raises(UsageError, match=r"not equal blocks of adjacent rows"):
      platform.process_row_block(np.array(grid), 0)


@pytest.mark.cpu_only
def test_translation_trains_with_its_encoder_and_decoder_split_over_two_devices(tmp_path):
  """The shipped translation config through textattn.main, and with sources and teacher-forced
  targets split over sequence = 2 (2 devices; a data axis beside it is the 2 x 4 classification
  test's): the loss of every logged window equals one device's;
  decoding (the test report's greedy translations) runs on one device and gives the same
  translations."""
  from tests.test_train import read_metrics, run_main
  from tests.test_translation import write_pairs
  data = write_pairs(tmp_path / "pairs.txt")
  from tests.test_train import REPO
  args = [f"--config={REPO / 'configs' / 'spa_eng_transformer.py'}", f"--config.dataset={data}", "--config.num_train_steps=6", "--config.log_every_steps=2",
          "--config.eval_every_steps=6", "--config.checkpoint_every_steps=6",
          "--config.source_vocab=40", "--config.target_vocab=40", "--config.source_len=8",
          "--config.target_len=8", "--config.model.embed_dim=16", "--config.model.ffn_dim=16",
          "--config.model.num_heads=2", "--config.model.head_dim=0", "--config.beam_size=0", "--config.batch_size=16",
          "--config.platform.eval_batch_size=32", "--config.model.encoder_attention=additive",
          "--config.model.decoder_attention=causal"]
  one = run_main(args, tmp_path / "one", wait=False)
  split = run_main(args + ["--config.platform.num_cpu_devices=2", "--config.mesh.sequence=2"],
                   tmp_path / "split", wait=False)
  one_out, _ = _finish(one), _finish(split)
  assert "Test report: loss=" in one_out and "bleu_greedy=" in one_out, one_out[-3000:]
  rows = [[r for r in read_metrics(tmp_path / run) if "train/loss" in r] for run in ("one", "split")]
  assert len(rows[0]) == len(rows[1]) == 3
  for a, b in zip(*rows, strict=True):
    assert abs(a["train/loss"] - b["train/loss"]) <= TOLERANCE * a["train/loss"], (a, b)
  with open(tmp_path / "one" / "test_translations.jsonl") as f, \
       open(tmp_path / "split" / "test_translations.jsonl") as g:
    assert f.read() == g.read()


def test_a_language_model_trains_split_over_two_devices_like_one_device(tmp_path):
  """Packed documents, causal softmax, mesh.sequence=2: every logged loss and the test bits per
  byte equal one device's (a variant with no sequence sharding: test_language_model.py's
  refusals)."""
  from tests.test_language_model import write_documents
  from tests.test_train import REPO, read_metrics, run_main
  write_documents(tmp_path / "docs.txt")
  args = [f"--config={REPO / 'configs' / 'imdb_lm_bytes.py'}",
          f"--config.dataset={tmp_path / 'docs.txt'}", "--config.val_documents=8",
          "--config.test_documents=8", "--config.max_len=31", "--config.batch_size=8",
          "--config.num_train_steps=6", "--config.eval_every_steps=6",
          "--config.checkpoint_every_steps=6", "--config.log_every_steps=2", "--config.kn_order=0",
          "--config.intervals_dataset=", "--config.model.embed_dim=16",
          "--config.model.num_heads=2", "--config.model.ffn_dim=32", "--config.model.num_layers=1",
          f"--config.cache_dir={tmp_path / 'cache'}"]
  mesh = ["--config.platform.num_cpu_devices=2", "--config.mesh.sequence=2"]
  one = run_main(args, tmp_path / "one", wait=False)
  split = run_main(args + mesh, tmp_path / "split", wait=False)
  _finish(one), _finish(split)
  rows = [read_metrics(tmp_path / run) for run in ("one", "split")]
  losses = [[r["train/loss"] for r in run if "train/loss" in r] for run in rows]
  assert len(losses[0]) == len(losses[1]) == 3
  for a, b in zip(*losses, strict=True):
    assert abs(a - b) <= TOLERANCE * a, losses
  a, b = (run[-1]["test/bits_per_byte"] for run in rows)
  assert abs(a - b) <= TOLERANCE * a, (a, b)


def test_a_variant_that_declares_no_sharding_is_refused_before_the_workdir_is_touched(tmp_path,
                                                                                        toy):
  # (toy: registers "toy_mean", which declares no sharding)
  from tests.test_train import tiny_config, write_sentiment_jsonl
  from textattn import run as runner
  from textattn.errors import UsageError
  config = tiny_config(write_sentiment_jsonl(tmp_path / "reviews.jsonl"), tmp_path / "cache",
                       **{"model.attention": "toy_mean", "mesh.sequence": 2})
  with pytest.raises(UsageError) as error:
    runner.train_and_evaluate(config, str(tmp_path / "run"))
  assert str(error.value) == (
      "config.model.attention='toy_mean' declares no sequence sharding, so it cannot run with "
      "mesh.sequence=2; use mesh.sequence=1 or a variant that does (softmax, causal, additive, "
      "causal_additive_recurrent, causal_linear, retnet, gla, mamba2, deltanet, gated_deltanet).")
  assert not (tmp_path / "run").exists()
  config.mesh.sequence = 3
  config.model.attention = "additive"
  with pytest.raises(UsageError, match=r"^config.mesh.sequence=3 must divide the device count "
                                       r"\(1\), so that data = devices / sequence is whole.$"):
    runner.train_and_evaluate(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------
# The pooling check, run on 8 devices.

@pytest.mark.cpu_only
def test_every_pooling_of_a_length_split_batch_equals_one_device():
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} "
                       f"--xla_force_host_platform_device_count=8")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
  done = subprocess.run([sys.executable, os.path.abspath(__file__), "poolings"], env=env,
                        check=False, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  errors = json.loads(done.stdout.strip().splitlines()[-1])
  assert set(errors) == {"mean", "max", "attention", "cls", "last", "bigram", "dropout",
                         "dropout_padded"}
  for name, error in errors.items():
    assert error <= TOLERANCE, (name, error)


def _poolings() -> dict:
  """Each pooling (value and gradient), the hashed-bigram embedding, dropout, and dropout of a
  batch padded for the mesh (layers.Dropout's `length`), with the batch's length split 2 x 4
  (data x sequence), against the same jitted functions on one device: the largest difference
  relative to the largest value."""
  import jax
  import jax.numpy as jnp

  from textattn import sharding
  from textattn.models import layers
  mesh = sharding.make_mesh(2, 4)
  rng = np.random.default_rng(0)
  batch, length, embed = 4, 16, 8
  x = rng.normal(size=(batch, length, embed)).astype(np.float32)
  tokens = rng.integers(2, 50, (batch, length)).astype(np.int32)
  for row, end in enumerate((3, 8, 16, 0)):  # padding inside a shard, from a shard's start,
    tokens[row, end:] = 0                    # none, all
  pooler = layers.AttentionPooling()
  pooler_params = pooler.init(jax.random.key(0), x, tokens != 0)
  embedding = layers.Embedding(50, length, embed, bigram_buckets=7)
  embedding_params = jax.tree.map(lambda p: p + 0.1, embedding.init(jax.random.key(1), tokens))
  dropout = layers.Dropout(0.3)
  rngs = {"dropout": jax.random.key(5)}

  def pool(x, tokens):
    mask = tokens != 0
    return {"mean": layers.masked_mean(x, mask), "max": layers.masked_max(x, mask),
            "attention": pooler.apply(pooler_params, x, mask), "cls": x[:, 0],
            "last": layers.last_token(x, mask)}

  def everything(x, tokens):
    out = {name: (value, jax.grad(lambda x, n=name: jnp.sum(jnp.sin(pool(x, tokens)[n])))(x))
           for name, value in pool(x, tokens).items()}
    out["bigram"] = embedding.apply(embedding_params, tokens)
    out["dropout"] = dropout.apply({}, x, deterministic=False, rngs=rngs)
    return out

  def error(a, b):
    scale = max(float(np.max(np.abs(np.asarray(leaf)))) for leaf in jax.tree.leaves(a))
    return max(float(np.max(np.abs(np.asarray(p) - np.asarray(q)))) for p, q in
               zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)) / max(scale, 1e-30)

  alone = jax.jit(everything)(x, tokens)
  split = jax.jit(everything)(jax.device_put(x, sharding.length_sharding(mesh, 3)),
                              jax.device_put(tokens, sharding.length_sharding(mesh, 2)))
  errors = {name: error(alone[name], split[name]) for name in alone}
  # A length of 13 padded to 16 for the mesh: the real positions drop as unpadded.
  padded = jnp.pad(x[:, :13], ((0, 0), (0, 3), (0, 0)))
  short = jax.jit(lambda x: dropout.apply({}, x, deterministic=False, rngs=rngs))(x[:, :13])
  long = jax.jit(lambda x: dropout.apply({}, x, deterministic=False, rngs=rngs, length=13))(
      jax.device_put(padded, sharding.length_sharding(mesh, 3)))
  errors["dropout_padded"] = error(short, long[:, :13])
  return errors


if __name__ == "__main__":
  if sys.argv[1] == "poolings":
    print(json.dumps(_poolings()))
