"""Validation-only sweeps over configs, seeds and variants, and their paired comparison.

The same seeds on both sides, validation only (the test split is never exported), and a paired
confidence interval of the difference (docs/runs.md). Two steps, so the sweep machine needs
neither TFDS nor the text, and never sees the test set:

  # 1. Here: encode the train and validation splits of a config (never test) into one file.
  TFDS_DATA_DIR=../shared/tensorflow_datasets python -m textattn.sweep export \
      --config=configs/imdb_fastformer.py --out=.sweep/imdb_800.npz
  # 2. Anywhere with JAX: each variant, each seed, with the project's own optimizer, train_step
  #    and eval_step; the best and last validation accuracy of each run as one JSON line.
  python -m textattn.sweep sweep --data=.sweep/imdb_800.npz \
      --config=configs/imdb_fastformer.py --seeds=0,1,2 --jobs=8 \
      --variant='base' --variant='max:model.pooling=max' ...
  # (MLM pretraining: `export-corpus`, `pretrain --corpus=... --out=encoder.npz`, then
  #  `sweep ... --encoder=encoder.npz`: experiments/gpu/mlm_sweep.sh.)
  # 3. Summarise sweep files, paired over the seeds both sides ran:
  python -m textattn.sweep summarize experiments/sweeps/softmax_bigram_cpu.jsonl \
      --paired=base,bigram --seeds=10-29

Any task (translation, the language model, a plugin's): `sweep` without --data trains each run
on the task's own data through the task registry and reports its selection metric (the Job's;
best = highest or lowest as the Job says), e.g. `--config=configs/imdb_lm_bytes.py
--variant='softmax' --variant='linear:model.attention=causal_linear'`.

A variant is NAME[:FIELD=VALUE[,...]] (values parsed as Python literals where they parse).
`max_len` may be lowered below the exported length (cut as encoding at it would). Run again
with the same --out, a sweep skips the runs that file holds (it resumes); one sweep at a time
holds an --out. A run that fails is a line with its error, and the sweep exits non-zero.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time

import ml_collections
import numpy as np

from textattn import attention, checkpointing, defaults, platform, run, sweep_summary, tasks
from textattn import data as data_lib
from textattn.config import MOVED_IN_V3
from textattn.data.cache import save_npz
from textattn.errors import RunError, UsageError, user_errors
from textattn.models import baselines
from textattn.recipes import pretrain, word2vec
from textattn.sweep_summary import summarize
from textattn.tasks import classification


def load_config(path: str):
  return run.complete(defaults.load(path))


def parse_variant(text: str) -> tuple[str, dict]:
  name, _, rest = text.partition(":")
  overrides = {}
  for item in filter(None, rest.split(",")):
    field, _, value = item.partition("=")
    try:
      overrides[field] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      overrides[field] = value
  return name, overrides


def apply_overrides(config, overrides: dict):
  """`config` with FIELD=VALUE overrides; a recipe's fields (pretrain.*, word2vec.*) are added
  with their defaults when an override names one and the config lacks them."""
  config = config.copy_and_resolve_references()
  for field, value in overrides.items():
    field = MOVED_IN_V3.get(field, field)  # (a config-version-2 name: its field's place now)
    recipe = {"pretrain": pretrain, "word2vec": word2vec}.get(field.split(".")[0])
    if recipe is not None and field.split(".")[0] not in config:
      with config.unlocked():
        config[field.split(".")[0]] = recipe.default_config()
    *parents, leaf = field.split(".")
    node = config
    for parent in parents:
      node = node[parent] if isinstance(node, ml_collections.ConfigDict) and parent in node else {}
    if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
      raise UsageError(f"unknown config field {field!r} (a variant is NAME:FIELD=VALUE,... with "
                       f"the config's fields, e.g. model.pooling=max).")
    node[leaf] = type(node[leaf])(value) if isinstance(node[leaf], float) else value
  return config


# ---- export -----------------------------------------------------------------------------------

# Fields that decide the exported arrays: a sweep variant may not change them (max_len may only
# shrink, see run_one).
DATA_FIELDS = ("dataset", "val_fraction", "data_seed", "tokenizer", "vocab_size", "truncation",
               "text_fields", "label_field", "padding", "ngram_order", "ngram_counts")
# (recorded under these names; the fields of config version 3's opt-in parts are read at their
# places: defaults.set_fields and _field take the names)


def _field(config, name: str):
  node = config
  for part in MOVED_IN_V3.get(name, name).split("."):
    node = node[part]
  return node


# What an export made before a field existed had (it was not recorded then).
DATA_FIELD_DEFAULTS = {"padding": "after_masked", "ngram_order": 2, "ngram_counts": False}


def export(args) -> None:
  config = load_config(args.config)
  if data_lib.pads_before(config):
    raise SystemExit(f"{args.config}: config.layout.padding={config.layout.padding!r}; the sweep stores and "
                     "re-truncates left-aligned rows, so it needs padding='after_masked'.")
  with tempfile.TemporaryDirectory() as workdir:
    data = data_lib.load_dataset(config, workdir)
  dtype = np.uint16 if data.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
  # With embedding.init="word2vec" the token table's start is exported too (built from
  # training + unlabelled text only, as textattn.main builds it), so variants may use it.
  extra = {}
  if config.embedding.init == "word2vec":
    table, found = word2vec.pretrained_token_table(config, data.tokenizer, data.vocab_size)
    extra = {"w2v_table": table, "w2v_found": found,
             "w2v_settings": json.dumps(word2vec_settings(config))}
  # With pretrain.objective="mlm" the pretrained encoder is exported too (as textattn.main
  # builds it, cached), so variants of the fine-tuning start from it.
  if pretrain.enabled(config):
    params, _ = pretrain.pretrain(config, data.tokenizer, data.vocab_size)
    extra.update({f"mlm:{name}": value for name, value in checkpointing.flatten(params).items()})
    extra["mlm_settings"] = json.dumps(pretrain.settings(config))
  save_npz(
      args.out, train_inputs=data.train.inputs.astype(dtype), train_labels=data.train.labels,
      val_inputs=data.validation.inputs.astype(dtype), val_labels=data.validation.labels,
      vocab_size=data.vocab_size, class_names=np.array(data.class_names),
      max_len=config.max_len, truncation=config.layout.truncation, config=args.config,
      data_fields=json.dumps({f: _field(config, f) for f in DATA_FIELDS}), **extra)
  print(f"wrote {args.out}: train {data.train.inputs.shape}, validation "
        f"{data.validation.inputs.shape}, vocab {data.vocab_size} (no test split)"
        + (", word2vec start of the token table" if "w2v_table" in extra else "")
        + (", pretrained encoder" if "mlm_settings" in extra else ""))


def export_corpus(args) -> None:
  """The pretraining corpus of a config with pretrain.unlabeled_split=--unlabeled-split, as
  pretrain.corpus builds it, stored ragged (tokens concatenated, one length per text)."""
  config = apply_overrides(load_config(args.config), {"pretrain.objective": "mlm"})
  with config.unlocked():
    config.pretrain.unlabeled_split = args.unlabeled_split
    # (MLM pretraining refuses the word2vec start some configs use; the corpus does not depend
    # on it.)
    config.embedding.init = "random"
  pretrain.validate_config(config)
  with tempfile.TemporaryDirectory() as workdir:
    data = data_lib.load_dataset(config, workdir)
  inputs, _ = pretrain.corpus(config, data.tokenizer)
  lengths = (inputs != 0).sum(1)
  dtype = np.uint16 if data.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
  save_npz(
      args.out, tokens=inputs[inputs != 0].astype(dtype), lengths=lengths,
      vocab_size=data.vocab_size, max_len=config.max_len, truncation=config.layout.truncation,
      unlabeled_split=args.unlabeled_split,
      data_fields=json.dumps({f: _field(config, f) for f in DATA_FIELDS}))
  print(f"wrote {args.out}: {len(lengths):,} texts, {int(lengths.sum()):,} tokens")


def load_corpus(path: str, config) -> tuple[np.ndarray, int]:
  """export_corpus's texts as int32 [N, config.max_len] rows (left-aligned, zero-padded)."""
  with np.load(path) as f:
    raw = {k: f[k] for k in f.files}
  check_export(raw, config)
  if str(raw["unlabeled_split"]) != config.pretrain.unlabeled_split:
    raise ValueError(f"the corpus was exported with unlabelled split {raw['unlabeled_split']}, "
                     f"not {config.pretrain.unlabeled_split!r}")
  lengths = raw["lengths"]
  inputs = np.zeros((len(lengths), int(raw["max_len"])), np.int32)
  inputs[np.arange(inputs.shape[1])[None, :] < lengths[:, None]] = raw["tokens"]
  if config.max_len < inputs.shape[1]:
    inputs = shorten(inputs, config.max_len, config.layout.truncation, config.tokenizer)
  return inputs, int(raw["vocab_size"])


def check_export(raw: dict, config) -> None:
  if config.max_len > int(raw["max_len"]):
    raise ValueError(f"max_len {config.max_len} > exported {int(raw['max_len'])}")
  exported = {**DATA_FIELD_DEFAULTS, **json.loads(str(raw["data_fields"]))}
  if exported.pop("punctuation", "strip") != "strip":  # (an option textattn no longer has)
    raise ValueError("the export was made with punctuation='split', which textattn no longer has.")
  changed = {f: (_field(config, f), v) for f, v in exported.items() if _field(config, f) != v}
  if changed:
    raise ValueError(f"these fields differ from the export's (this, exported): {changed}; "
                     f"export again with them instead.")


def pretrain_encoder(args) -> None:
  """Pretrains a config's encoder on an exported corpus; writes the parameters, the settings
  they depend on and the curve, for `sweep --encoder`."""
  config = apply_overrides(load_config(args.config),
                           {"pretrain.objective": "mlm", **json.loads(args.overrides)})
  pretrain.validate_config(config)
  inputs, vocab_size = load_corpus(args.corpus, config)
  t0 = time.perf_counter()
  params, curve = pretrain.train_encoder(config, inputs, vocab_size)
  seconds = time.perf_counter() - t0
  save_npz(args.out, False, mlm_settings=json.dumps(pretrain.settings(config)),
           data_fields=json.dumps({f: _field(config, f) for f in DATA_FIELDS}),
           curve=json.dumps(curve), seconds=seconds,
           **{f"mlm:{name}": value for name, value in checkpointing.flatten(params).items()})
  import jax
  print(json.dumps({"out": args.out, "seconds": seconds, "device": str(jax.devices()[0]),
                    "last": curve[-1]}))


def word2vec_settings(config) -> dict:
  return {**word2vec.vector_settings(config), "scale": config.word2vec.scale}


# ---- sweep ------------------------------------------------------------------------------------


def shorten(inputs: np.ndarray, max_len: int, truncation: str, tokenizer: str) -> np.ndarray:
  """Left-aligned, zero-padded rows cut to max_len as encoding does: "pre" keeps the last tokens,
  but an n-gram row keeps its first ids (its most frequent features) whatever the truncation."""
  out = np.zeros((len(inputs), max_len), np.int32)
  for i, (row, n) in enumerate(zip(inputs, (inputs != 0).sum(1))):
    pre = truncation == "pre" and tokenizer != "ngram"
    keep = row[max(0, n - max_len):n] if pre else row[:min(n, max_len)]
    out[i, :len(keep)] = keep
  return out


def _load_export(data_path: str, config) -> tuple[dict, dict]:
  """(the export's arrays, {"train", "val"} Splits re-truncated to config.max_len)."""
  with np.load(data_path) as f:
    raw = {k: f[k] for k in f.files}
  check_export(raw, config)
  splits = {}
  for name in ("train", "val"):
    inputs = raw[f"{name}_inputs"].astype(np.int32)
    if config.max_len < inputs.shape[1]:
      inputs = shorten(inputs, config.max_len, config.layout.truncation, config.tokenizer)
    splits[name] = data_lib.Split(inputs, raw[f"{name}_labels"].astype(np.int32))
  return raw, splits


def _pretrained_starts(raw: dict, config, encoder_path: str):
  """(word2vec token table or None, pretrained encoder parameters or None) from the export."""
  import jax.numpy as jnp

  pretrained_tokens = pretrained_params = None
  if config.embedding.init == "word2vec":
    if "w2v_table" not in raw:
      raise ValueError("embedding.init='word2vec' needs the table in the export; export "
                       "with a config that sets it.")
    exported_w2v = json.loads(str(raw["w2v_settings"]))
    if exported_w2v != word2vec_settings(config):
      raise ValueError(f"the word2vec settings differ from the export's: {exported_w2v}")
    pretrained_tokens = (jnp.asarray(raw["w2v_table"]), jnp.asarray(raw["w2v_found"]))
  if pretrain.enabled(config):
    if encoder_path:  # pretrained on the sweep machine (pretrain_encoder)
      with np.load(encoder_path) as f:
        encoder = {k: f[k] for k in f.files}
      # Same data fields as both exports (corpus and arrays): the same vocabulary and carve.
      if "data_fields" not in encoder:
        raise ValueError(f"{encoder_path} does not record its data fields; pretrain it again.")
      check_export({**encoder, "max_len": raw["max_len"]}, config)
      raw = {**raw, **{k: v for k, v in encoder.items() if k.startswith("mlm")}}
    if "mlm_settings" not in raw:
      raise ValueError("pretrain.objective='mlm' needs the pretrained encoder in the export; "
                       "export with a config that sets it.")
    exported_mlm = json.loads(str(raw["mlm_settings"]))
    if exported_mlm != json.loads(json.dumps(pretrain.settings(config))):
      raise ValueError(f"the pretraining settings differ from the export's: {exported_mlm}; "
                       f"export again with them.")
    pretrained_params = checkpointing.unflatten(
        {k[len("mlm:"):]: jnp.asarray(v) for k, v in raw.items() if k.startswith("mlm:")})
  return pretrained_tokens, pretrained_params


def run_one(data_path: str, config_path: str, overrides: dict, seed: int,
            encoder_path: str = "") -> dict:
  """Trains one (config + overrides, seed) on the export with the project's own loop, steps and
  optimizer, evaluating on validation every eval_every_steps; returns the validation curve."""
  import jax


  config = apply_overrides(load_config(config_path), {**overrides, "seed": seed})
  if jax.default_backend() != "cpu":
    # Full float32 products, as on a CPU (JAX's GPU default is TF32), so that lines from
    # both backends differ only by rounding order and may be pooled.
    jax.config.update("jax_default_matmul_precision", "highest")
  raw, splits = _load_export(data_path, config)
  class_names = [str(c) for c in raw["class_names"]]
  classification.validate(config, None)
  classification.validate(config, jax.device_count())
  pretrained_tokens, pretrained_params = _pretrained_starts(raw, config, encoder_path)
  if baselines.has_frozen(config):
    pretrained_params = baselines.frozen_parameters(
        config, splits["train"].inputs, splits["train"].labels, len(class_names),
        int(raw["vocab_size"]))
  data = data_lib.Dataset(train=splits["train"], validation=splits["val"], test=splits["val"],
                          class_names=class_names, vocab_size=int(raw["vocab_size"]))
  job = classification.make_job(config, data, None, True,
                                pretrained=lambda: (pretrained_tokens, pretrained_params))
  t0 = time.perf_counter()
  curve = [(done, metrics["val/accuracy"]) for done, metrics in run.train_only(config, job)]
  best_step, best = sweep_summary.best_of(curve, higher_is_better=True)
  return {"val_best": best, "val_best_step": best_step, "val_last": curve[-1][1],
          "curve": curve, "seconds": time.perf_counter() - t0, "device": str(jax.devices()[0]),
          "backend": jax.default_backend(), "jax": jax.__version__,
          "matmul_precision": jax.config.jax_default_matmul_precision,
          "compiler_options": platform.step_compiler_options(config)}


def run_task(config_path: str, overrides: dict, seed: int) -> dict:
  """Trains one (config + overrides, seed) of any registered task (translation, the language
  model, a plugin's) on its own data through the task registry, with no workdir kept,
  evaluating the validation split at the run's interval; returns the curve of the task's
  selection metric (Job.metric) and its best by Job.higher_is_better."""
  import jax

  config = apply_overrides(load_config(config_path), {**overrides, "seed": seed})
  run.validate(config, jax.device_count())
  with tempfile.TemporaryDirectory() as workdir:  # (what prepare writes: vocabularies)
    job = tasks.get(config.task).prepare(config, workdir, True)
    t0 = time.perf_counter()
    curve = [(done, float(metrics[job.metric])) for done, metrics in run.train_only(config, job)]
  best_step, best = sweep_summary.best_of(curve, job.higher_is_better)
  return {"metric": job.metric, "higher_is_better": job.higher_is_better, "val_best": best,
          "val_best_step": best_step, "val_last": curve[-1][1], "curve": curve,
          "seconds": time.perf_counter() - t0, "device": str(jax.devices()[0]),
          "backend": jax.default_backend(), "jax": jax.__version__}


def sweep(args) -> None:
  variants = [parse_variant(v) for v in args.variant] or [("base", {})]
  seeds = sweep_summary.parse_seeds(args.seeds, "--seeds")
  if args.jobs < 1:
    raise UsageError(f"--jobs={args.jobs} must be >= 1 (runs at a time).")
  attention.load_plugins(args.plugin)
  for _, overrides in variants:  # (a bad config or field: one line now, not one per run)
    apply_overrides(load_config(args.config), overrides)
  with sweep_summary.held(args.out):
    # Seed-major, so a sweep cut short has every variant's first seeds; --out's are skipped.
    done = sweep_summary.finished_runs(args.out, dict(variants)) if args.out else {}
    jobs = [(name, overrides, seed) for seed in seeds for name, overrides in variants
            if (name, seed) not in done]
    if done:
      print(f"{args.out} already holds {len(done)} finished run(s); running {len(jobs)}.")

    def launch(job):
      name, overrides, seed = job
      command = [sys.executable, "-m", "textattn.sweep", "one", f"--data={args.data}",
                 f"--config={args.config}", f"--overrides={json.dumps(overrides)}",
                 f"--seed={seed}", f"--encoder={args.encoder}",
                 *(f"--plugin={plugin}" for plugin in args.plugin)]
      # Several processes share one GPU: no process may grab most of its memory up front.
      env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
      done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
      if done.returncode:
        return {"variant": name, "seed": seed, "error": done.stderr[-2000:]}
      return {"variant": name, "seed": seed, "overrides": overrides,
              **json.loads(done.stdout.strip().splitlines()[-1])}

    results = {name: [done[name, s] for s in seeds if (name, s) in done] for name, _ in variants}
    failed = 0
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
      for result in pool.map(launch, jobs):
        line = json.dumps(result)
        print(line, flush=True)
        if args.out:
          with open(args.out, "a") as out:
            out.write(line + "\n")
        if "val_best" in result:
          results[result["variant"]].append(result["val_best"])
        failed += "error" in result
    sweep_summary.print_best(results)
    if failed:
      raise RunError(f"{failed} of {len(jobs)} runs failed (their errors: the lines above); run "
                     f"the sweep again{' with this --out' if args.out else ''} to retry them.")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  sub = parser.add_subparsers(dest="command", required=True)
  p = sub.add_parser("export")
  p.add_argument("--config", required=True)
  p.add_argument("--out", required=True)
  p = sub.add_parser("sweep")
  p.add_argument("--data", default="", help="a classification export (export's --out); none: "
                 "each run reads its task's own data through the task registry")
  p.add_argument("--config", required=True)
  p.add_argument("--variant", action="append", default=[])
  p.add_argument("--seeds", default="0")
  p.add_argument("--jobs", type=int, default=1)
  p.add_argument("--out", default="")
  p.add_argument("--encoder", default="", help="pretrained encoder (pretrain's --out)")
  p.add_argument("--plugin", action="append", default=[], help="a module registering a task "
                 "or attention variant, as textattn.main's --plugin")
  p = sub.add_parser("summarize")
  p.add_argument("files", nargs="+")
  p.add_argument("--paired", default="", help="BASE,OTHER: paired difference over shared seeds")
  p.add_argument("--seeds", default="", help="LO-HI: the seeds the comparison wants")
  p = sub.add_parser("one")
  p.add_argument("--data", default="")
  p.add_argument("--plugin", action="append", default=[])
  p.add_argument("--config", required=True)
  p.add_argument("--overrides", default="{}")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--encoder", default="")
  p = sub.add_parser("export-corpus")
  p.add_argument("--config", required=True)
  p.add_argument("--unlabeled-split", default="unsupervised")
  p.add_argument("--out", required=True)
  p = sub.add_parser("pretrain")
  p.add_argument("--corpus", required=True)
  p.add_argument("--config", required=True)
  p.add_argument("--overrides", default="{}")
  p.add_argument("--out", required=True)
  args = parser.parse_args()
  with user_errors():
    _dispatch(args)


def _dispatch(args) -> None:
  if args.command == "export":
    export(args)
  elif args.command == "export-corpus":
    export_corpus(args)
  elif args.command == "pretrain":
    pretrain_encoder(args)
  elif args.command == "sweep":
    sweep(args)
  elif args.command == "summarize":
    summarize(args)
  else:
    attention.load_plugins(args.plugin)
    overrides = json.loads(args.overrides)
    print(json.dumps(run_one(args.data, args.config, overrides, args.seed, args.encoder)
                     if args.data else run_task(args.config, overrides, args.seed)))


if __name__ == "__main__":
  main()
