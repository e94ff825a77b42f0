"""Is training run-to-run deterministic on this backend, and is a SIGKILLed + resumed run
bit-identical to an uninterrupted one? (On CPU the test suite checks the latter; this is the
GPU check: `JAX_PLATFORMS=cuda python experiments/gpu/determinism.py`.)

Trains the same small classifier (synthetic sentiment JSONL, vocab 2,000, length 128, embed 64,
batch 32, 60 steps) with `textattn.main`: twice with `--config.platform.deterministic=False` (XLA's
default GPU compilation), twice with the default `config.platform.deterministic=True` (on a GPU:
--xla_gpu_deterministic_ops), and once with the default killed after its first checkpoint and
resumed. Prints, for each pair, how many parameter elements differ.
"""

import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import orbax.checkpoint as ocp

REPO = pathlib.Path(__file__).resolve().parents[2]


def write_data(path, n=4000, seed=0):
  rng = random.Random(seed)
  words = [f"w{i}" for i in range(3000)]
  with open(path, "w") as f:
    for i in range(n):
      label = i % 2
      cue = ["great", "superb"] if label else ["awful", "dull"]
      text = rng.choices(words, k=rng.randint(20, 150)) + rng.choices(cue, k=3)
      rng.shuffle(text)
      f.write(json.dumps({"text": " ".join(text), "label": label}) + "\n")


def args(data, cache, deterministic=True):
  values = {"dataset": data, "cache_dir": cache, "vocab_size": 2000, "max_len": 128,
            "batch_size": 32, "eval_batch_size": 64, "num_train_steps": 60,
            "eval_every_steps": 10, "checkpoint_every_steps": 10, "log_every_steps": 10,
            "model.embed_dim": 64, "model.num_heads": 4, "model.ffn_dim": 128,
            "model.mlp_dim": 32, "model.attention": "softmax", "deterministic": deterministic}
  return [f"--config={REPO / 'experiments' / 'gpu' / 'determinism_config.py'}"] + [
      f"--config.{k}={v}" for k, v in values.items()]


def main_command(workdir, extra):
  return [sys.executable, "-m", "textattn.main", f"--workdir={workdir}"] + extra


def run(workdir, extra):
  result = subprocess.run(main_command(workdir, extra), cwd=REPO, capture_output=True, text=True,
                          check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


def params(workdir):
  manager = ocp.CheckpointManager(os.path.join(workdir, "checkpoints"))
  restored = manager.restore(manager.latest_step(),
                             args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  import jax
  return manager.latest_step(), [np.asarray(x) for x in
                                 jax.tree_util.tree_leaves(restored["state"]["params"])]


def compare(name, a, b):
  (step_a, pa), (step_b, pb) = params(a), params(b)
  differing = sum(int(np.sum(x != y)) for x, y in zip(pa, pb))
  total = sum(x.size for x in pa)
  worst = max(float(np.max(np.abs(x - y))) for x, y in zip(pa, pb))
  print(f"{name}: steps {step_a}/{step_b}, {differing:,} of {total:,} parameters differ "
        f"(max |diff| {worst:.3g})", flush=True)


def main():
  tmp = pathlib.Path(tempfile.mkdtemp(prefix="determinism-"))
  data, cache = str(tmp / "data.jsonl"), str(tmp / "cache")
  write_data(data)
  plain, det = args(data, cache, deterministic=False), args(data, cache)
  for name, extra in [("plain_a", plain), ("plain_b", plain), ("det_a", det), ("det_b", det)]:
    start = time.time()
    run(tmp / name, extra)
    print(f"{name}: {time.time() - start:.1f} s", flush=True)
  compare("deterministic=False, run vs re-run", tmp / "plain_a", tmp / "plain_b")
  compare("deterministic=True (default), run vs re-run", tmp / "det_a", tmp / "det_b")

  killed = tmp / "det_killed"
  process = subprocess.Popen(main_command(killed, det), cwd=REPO, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
  checkpoints = killed / "checkpoints"
  while process.poll() is None:
    if checkpoints.exists() and any(d.isdigit() for d in os.listdir(checkpoints)):
      break
    time.sleep(0.01)
  process.send_signal(signal.SIGKILL)
  process.wait()
  resumed = run(killed, det)
  at = (resumed.stdout + resumed.stderr).split("Resuming from checkpoint at step ")[1].split(".")[0]
  print(f"killed after the first checkpoint, resumed at step {at}", flush=True)
  compare("deterministic=True (default), SIGKILL + resume vs uninterrupted", tmp / "det_a",
          killed)


def rehearse(argv):
  """The wiring of the commands main() runs (experiments/gpu/rehearse.py): textattn.main takes
  their flags and config overrides, both settings of config.platform.deterministic."""
  del argv
  import importlib.util
  rehearse_path = pathlib.Path(__file__).with_name("rehearse.py")
  spec = importlib.util.spec_from_file_location("rehearse", rehearse_path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  for deterministic in (False, True):
    module.check(["-m", "textattn.main", "--workdir=/tmp/determinism-rehearsal"]
                 + args("data.jsonl", "cache", deterministic))


if __name__ == "__main__":
  main()
