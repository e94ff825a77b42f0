"""The sequence-length benchmark's mechanics on tiny sizes. No timing value is asserted.

Every run below is started at once (module fixture) so their interpreter start-ups and
compilations overlap on a small machine; each test waits for the run it reads.
"""

import concurrent.futures
import csv
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from textattn import defaults
from textattn.benchmark import builders, plan, report, sweep
from textattn.errors import UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIRED_COLUMNS = ("variant", "seq_len", "batch_size", "mode", "dtype", "status", "compile_s",
                    "median_ms", "p90_ms", "tokens_per_s", "examples_per_s", "peak_bytes",
                    "flops")
TINY = ("--embed_dim=16", "--num_heads=2", "--batch_size=2", "--warmup=1", "--repeats=2")

COMMANDS = {
    # Two variants x two lengths; the length-32 points fail on purpose (an exception, and a real
    # MemoryError from the per-point address-space cap), the length-16 ones must not care.
    "sweep": ("--mode=attention", "--variants=softmax,additive", "--seq_lens=16,32", *TINY,
              "--inject_failure=softmax@32=error,additive@32=oom"),
    # The real train_step of a config file; a config override picks the variant. (An override
    # of an opt-in part the config leaves out, --config.model.linear.*, must stay on the report's
    # command line: the parser once dropped it from sys.argv.)
    "train_step": ("--mode=train_step", "--config=configs/imdb_keras_example.py",
                   "--config.model.attention=additive", "--config.model.embed_dim=16",
                   "--config.model.linear.features=8",
                   "--config.vocab_size=100", "--seq_lens=16", "--batch_size=4", "--warmup=1",
                   "--repeats=2"),
    # Sequence parallelism on a 2 x 4 mesh: the point's process gets 8 CPU devices.
    "mesh": ("--mode=forward+backward", "--mesh=data:2,sequence:4", "--variants=additive,causal",
             "--seq_lens=32", "--embed_dim=16", "--num_heads=2", "--batch_size=2", "--warmup=0",
             "--repeats=1"),
}


def one_spec(mode="attention", variant="additive", seq_len=16, inject=None, **spec):
  settings = plan.resolve_settings(defaults.complete(defaults.classification()), mode, {
      "variants": variant, "seq_lens": str(seq_len), "embed_dim": 16, "num_heads": 2,
      "batch_size": 2})
  injections = {(variant, seq_len): inject} if inject else None
  (point,) = plan.plan_points(defaults.complete(defaults.classification()), settings, mode, warmup=0, repeats=1,
                              injections=injections, **spec)
  return point


# Single points run straight through run_point_in_subprocess (no sweep around them).
POINTS = {
    # A point that hangs is killed at the per-point timeout.
    "timeout": (one_spec(inject="timeout"), 1.0),
    # A point whose compiled footprint exceeds the memory limit is not run.
    "memory_limit": (one_spec(mode="forward+backward", memory_limit_gb=1e-6), 120.0),
    # The new kernels run as benchmark points and their rows name them.
    "pallas": (one_spec(mode="attention+backward", variant="additive_pallas",
                        check_against_reference=True), 240.0),
    "chunked": (one_spec(mode="attention+backward", variant="causal_additive_recurrent_chunked",
                         check_against_reference=True), 240.0),
}


@pytest.fixture(scope="module")
def points():
  with concurrent.futures.ThreadPoolExecutor(len(POINTS)) as pool:
    futures = {name: pool.submit(sweep.run_point_in_subprocess, spec, timeout_s)
               for name, (spec, timeout_s) in POINTS.items()}
    yield lambda name: futures[name].result(timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, points):
  del points  # started first, so that they run alongside the command lines
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  started = {}
  for name, args in COMMANDS.items():
    out_dir = str(tmp_path_factory.mktemp(name))
    if name == "train_step":  # (traced too: --profile_dir)
      args = (*args, f"--profile_dir={os.path.join(out_dir, 'profile')}")
    process = subprocess.Popen(
        [sys.executable, "-m", "textattn.benchmark", *args, f"--out_dir={out_dir}"], cwd=ROOT,
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started[name] = (process, out_dir)
  finished = {}

  def finish(name):
    if name not in finished:
      process, out_dir = started[name]
      stdout, stderr = process.communicate(timeout=300)
      finished[name] = (process.returncode, stdout, stderr, out_dir)
    return finished[name]

  yield finish
  for process, _ in started.values():
    if process.poll() is None:
      process.kill()
      process.communicate()


def rows_of(out_dir):
  with open(os.path.join(out_dir, "results.csv"), newline="") as f:
    return list(csv.DictReader(f))


def test_sweep_writes_a_row_per_point_and_all_outputs(runs):
  returncode, stdout, stderr, out_dir = runs("sweep")
  assert returncode == 0, stderr[-2000:]
  assert report.OUTPUTS == ("results.csv", "results.md", "time_vs_length.png",
                            "memory_vs_length.png")
  for name in report.OUTPUTS:
    assert os.path.getsize(os.path.join(out_dir, name)) > 0, name
  with open(os.path.join(out_dir, "results.csv"), newline="") as f:
    header = next(csv.reader(f))
  assert set(REQUIRED_COLUMNS) <= set(header)
  rows = rows_of(out_dir)
  assert [(r["variant"], int(r["seq_len"])) for r in rows] == [
      ("softmax", 16), ("softmax", 32), ("additive", 16), ("additive", 32)]
  for row in (rows[0], rows[2]):
    assert row["status"] == "ok", row["message"]
    assert (row["mode"], row["dtype"], row["batch_size"]) == ("attention", "float32", "2")
    for column in ("compile_s", "median_ms", "p90_ms", "tokens_per_s", "examples_per_s",
                   "peak_bytes", "flops"):
      assert float(row[column]) > 0, column
    assert float(row["p90_ms"]) >= float(row["median_ms"])
    assert (row["warmup"], row["repeats"]) == ("1", "2")
    # tokens/s and examples/s come from the same median: B * L and B per step.
    assert float(row["tokens_per_s"]) == pytest.approx(
        float(row["examples_per_s"]) * int(row["seq_len"]), rel=1e-6)
    assert row["peak_source"] == "memory_analysis"
    assert int(row["peak_bytes"]) == (int(row["argument_bytes"]) + int(row["output_bytes"])
                                      + int(row["temp_bytes"]) - int(row["alias_bytes"]))
  with open(os.path.join(out_dir, "results.md")) as f:
    markdown = f.read()
  assert "| softmax | 16 | ok |" in markdown and "| additive | 16 | ok |" in markdown
  assert "additive" in stdout and "median ms" in stdout  # the compact table
  # Additive attention's core bytes by formula (4 passes of [2, 16, 16] float32 and the mask:
  # the attention mode is a forward), over the point's time; softmax states none.
  assert float(rows[2]["core_bytes"]) == 4 * 2 * 16 * 16 * 4 + 2 * 2 * 16 * 4
  assert float(rows[2]["core_tbps"]) > 0 and rows[0]["core_bytes"] == ""


def test_mesh_rows_report_memory_per_device_communication_and_ring_blocks(runs):
  """--mesh=data:2,sequence:4: the model's forward + backward runs split over 8 devices; each
  row has its per-device memory, step time, one layer's collective bytes read from the compiled
  HLO equal to the stated formula, and the causal zig-zag ring's 3 + 2(S-1) = 9 blocks on every
  device (a missing or miscounted collective, or a formula that forgot the second mesh axis,
  makes them differ)."""
  returncode, _, stderr, out_dir = runs("mesh")
  assert returncode == 0, stderr[-2000:]
  rows = {row["variant"]: row for row in rows_of(out_dir)}
  assert sorted(rows) == ["additive", "causal"]
  for row in rows.values():
    assert row["status"] == "ok", row["message"]
    assert row["mesh"] == "2x4" and row["platform"].endswith("x8"), row
    assert int(row["peak_bytes"]) > 0 and float(row["median_ms"]) > 0
    assert int(row["comm_layer_bytes"]) == int(row["comm_formula_bytes"]) > 0, row
    assert int(row["comm_step_bytes"]) > 0
  assert rows["causal"]["ring_blocks"] == "9/9/9/9"
  assert rows["additive"]["ring_blocks"] == ""
  with open(os.path.join(out_dir, "results.md")) as f:
    markdown = f.read()
  assert "## Sequence parallelism (--mesh = data x sequence)" in markdown
  assert "| causal | 32 | 2x4 | ok |" in markdown and "| 1.000 |" in markdown


LOOP_HLO = """HloModule ring

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %x = f32[4]{0} get-tuple-element(%p), index=1
  %cp = f32[4]{0} collective-permute(%x), channel_id=1, source_target_pairs={{0,1},{1,0}}
  ROOT %t = (s32[], f32[4]) tuple(%i, %cp)
}

%cond (q: (s32[], f32[4])) -> pred[] {
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}

ENTRY %main (a: f32[4]) -> (s32[], f32[4]) {
  %ar = f32[2]{0} all-reduce(%a), channel_id=2, to_apply=%add
  ROOT %w = (s32[], f32[4]) while(%t0), condition=%cond, body=%body, TRIP
}
"""


def test_collectives_in_a_loop_count_once_per_iteration():
  """The ring's steps run in a while loop: its body's collective-permute (16 bytes) moves data
  once per iteration (7 here), and a loop whose trip count XLA does not know has no static
  count."""
  from textattn.benchmark import collectives
  known = LOOP_HLO.replace("TRIP", 'backend_config={"known_trip_count":{"n":"7"}}')
  assert collectives.collective_bytes(known, 2) == {"all-reduce": 8, "collective-permute": 112}
  with pytest.raises(ValueError, match="no known trip count"):
    collectives.collective_bytes(LOOP_HLO.replace(", TRIP", ""), 2)


@pytest.mark.parametrize("text", ["data:2", "data:1,sequence:0", "data:1,sequence:x",
                                  "data:1,sequence:2,data:1", "data:1,seq:2", "1x2"])
def test_malformed_mesh_specs_are_refused_in_one_sentence(text):
  with pytest.raises(UsageError) as error:
    plan.parse_mesh(text)
  assert str(error.value) == (
      f"--mesh={text!r} must be data:D,sequence:S with D and S positive integers (e.g. "
      f"data:1,sequence:4: the batch split over D devices, the length over S).")


@pytest.mark.parametrize("mode,given,message", [
    ("decode_step", {}, ("--mesh applies to the modes attention, attention+backward, forward, "
                        "forward+backward; --mode=decode_step runs without one.")),
    ("forward", {"variants": "causal_additive"},
     ("--variants: 'causal_additive' declares no sequence sharding, so it cannot run with --mesh "
     "sequence:4; allowed: softmax, causal, additive, causal_additive_recurrent, causal_linear, "
     "retnet, gla, mamba2, deltanet, gated_deltanet.")),
    ("attention", {"variants": "softmax_chunked"},
     ("--variants: with --mesh sequence:4 each attention runs its sequence-sharded core whatever "
     "the implementation, so name it 'softmax', not 'softmax_chunked'.")),
    ("forward", {"variants": "additive", "seq_lens": "16,30"},
     "--seq_lens: 30 cannot be split over sequence:4 for 'additive': give multiples of 4."),
    ("forward", {"variants": "causal", "seq_lens": "36"},  # the zig-zag ring halves each shard
     "--seq_lens: 36 cannot be split over sequence:4 for 'causal': give multiples of 8."),
    ("forward", {"batch_size": 3}, "--batch_size=3 must be a multiple of the mesh's data=2."),
], ids=["mode", "unsharded", "implementation", "length", "causal_length", "batch"])
def test_meshes_the_benchmark_cannot_run_are_refused_in_one_sentence(mode, given, message):
  given = {"batch_size": 2, "seq_lens": "32", **given}
  with pytest.raises(UsageError) as error:
    plan.resolve_settings(defaults.complete(defaults.classification()), mode, given, mesh=(2, 4))
  assert str(error.value) == message
  # Without --variants a mesh benchmarks the variants that declare sequence sharding.
  settings = plan.resolve_settings(defaults.complete(defaults.classification()), "forward", {}, mesh=(1, 2))
  assert settings["variants"] == ["softmax", "causal", "additive", "causal_additive_recurrent",
                                  "causal_linear", "retnet", "gla", "mamba2", "deltanet",
                                  "gated_deltanet"]


def test_failed_points_are_recorded_and_the_sweep_goes_on(runs):
  returncode, _, stderr, out_dir = runs("sweep")
  assert returncode == 0, stderr[-2000:]
  rows = {(r["variant"], int(r["seq_len"])): r for r in rows_of(out_dir)}
  assert rows["softmax", 32]["status"] == "error"
  assert "injected" in rows["softmax", 32]["message"]
  assert rows["additive", 32]["status"] == "oom"
  assert "MemoryError" in rows["additive", 32]["message"]
  assert "of cap" in rows["additive", 32]["message"]  # says whose memory ran out
  for key in (("softmax", 32), ("additive", 32)):
    assert rows[key]["median_ms"] == ""
  assert rows["softmax", 16]["status"] == rows["additive", 16]["status"] == "ok"
  with open(os.path.join(out_dir, "results.md")) as f:
    assert "| additive | 32 | oom |" in f.read()


def test_train_step_mode_uses_the_config_and_prints_examples_per_second(runs):
  returncode, stdout, stderr, out_dir = runs("train_step")
  assert returncode == 0, stderr[-2000:]
  (row,) = rows_of(out_dir)
  assert row["status"] == "ok", row["message"]
  # The config's attention_impl is "auto": the variant says so, the row what it resolved to.
  assert (row["variant"], row["mode"], row["seq_len"], row["batch_size"]) == (
      "additive_auto", "train_step", "16", "4")
  from textattn.attention import native
  assert row["implementation"] == ("native" if native.available() else "xla")
  assert row["embed_dim"] == "16" and row["num_heads"] == "2"  # the rest from the config
  assert "train_step additive_auto L=16 batch=4 float32 lengths=half_to_full:" in stdout
  assert "examples/s" in stdout and row["lengths"] == "half_to_full"
  # How good the number is: the kernel's label, the model FLOPs utilisation against the
  # measured CPU peak, and no attention FLOP count for linear-time attention.
  assert row["kernel"] == ("native" if native.available() else "linear (XLA)")
  assert float(row["peak_tflops"]) > 0 and 0 < float(row["mfu_pct"]) < 100
  assert row["attention_tflops"] == ""
  with open(os.path.join(out_dir, "results.md")) as f:
    assert "--config.model.attention=additive --config.model.embed_dim=16 " \
           "--config.model.linear.features=8 " in f.read()  # (the command, as given)


def test_profile_dir_holds_a_trace_of_the_annotated_steps(runs):
  returncode, _, stderr, out_dir = runs("train_step")
  assert returncode == 0, stderr[-2000:]
  traces = list(pathlib.Path(out_dir, "profile").glob("*_L16/plugins/profile/*/*.xplane.pb"))
  assert len(traces) == 1, traces
  assert b"benchmark_step" in traces[0].read_bytes()  # the step annotation, as XProf shows it


@pytest.mark.parametrize("lengths", plan.LENGTHS)
def test_random_inputs_have_the_requested_lengths(lengths):
  spec = one_spec(lengths=lengths) | {"vocab_size": 50}
  _, mask, tokens, _ = builders.random_inputs(spec, 64, 16)
  assert mask[0].all() and ((tokens != 0) == mask).all()  # padding is exactly the masked part
  counts = mask.sum(axis=1)
  if lengths == "full":
    assert (counts == 64).all()
  else:
    assert counts.min() >= 32 and (counts < 64).sum() >= 8  # padded examples, none below L/2


def test_train_step_batches_follow_the_configs_padding_layout():
  # The seed config trains with padding before the tokens (config.layout.padding="before_as_token"):
  # the benchmark's step must see that layout, not the pipeline's default.
  config = defaults.complete(defaults.load(os.path.join(ROOT, "configs", "imdb_keras_example.py")))
  config.update(vocab_size=50, max_len=16, batch_size=4)
  config.model.embed_dim = 8
  spec = one_spec(mode="train_step", seq_len=16) | {"vocab_size": 50, "num_classes": 2}
  _, (_, batch) = builders.build(spec, config)
  inputs = np.asarray(batch["inputs"])
  padding = inputs == 0
  assert padding.any() and (padding[:, 1:] <= padding[:, :-1]).all()  # zeros first, then tokens
  config.layout.padding = "after_masked"
  _, (_, batch) = builders.build(spec, config)
  padding = np.asarray(batch["inputs"]) == 0
  assert padding.any() and (padding[:, :-1] <= padding[:, 1:]).all()


def test_unknown_lengths_are_refused():
  with pytest.raises(ValueError, match="lengths='short' is invalid; allowed: half_to_full, full"):
    one_spec(lengths="short")


def test_a_hanging_point_is_killed_and_recorded_as_timeout(points):
  result = points("timeout")
  assert result["status"] == "timeout" and "point_timeout_s" in result["message"]
  assert "median_ms" not in result


@pytest.mark.cpu_only  # the limit applies to CPU points only
def test_a_point_over_the_memory_limit_is_recorded_as_oom_without_running(points):
  result = points("memory_limit")
  assert result["status"] == "oom" and "memory_analysis" in result["message"]
  assert result["peak_bytes"] > 2**10  # the footprint that did not fit is still reported
  assert "median_ms" not in result


@pytest.mark.parametrize("bad,message", [
    # Where the allowed names are listed, not all of them (they fill screens).
    ("--variants=softmax,softmax_flash", ("error: --variants: 'softmax_flash' is not a known "
                                          "variant; give softmax_<impl> with <impl> one of auto, "
                                          "xla, dot_product")),
    ("--variants=flash", ("error: --variants: 'flash' is not a known variant; give <attention> "
                          "or <attention>_<implementation> from textattn.attention's registry, "
                          "as `python -m textattn.benchmark --help` lists them")),
    ("--out_dir={file}", "error: --out_dir={file} exists and is not a directory"),
    # Results already there (the committed tables): a sweep would rewrite them point by point.
    ("--out_dir={dir}", ("error: --out_dir={dir} already holds results (results.csv); give a "
                         "new --out_dir, or --overwrite")),
    ("--mesh=data:2", ("error: --mesh='data:2' must be data:D,sequence:S with D and S positive "
                       "integers")),
], ids=["implementation", "variant", "out_dir", "out_dir_with_results", "mesh"])
def test_bad_flags_fail_with_one_sentence_and_touch_nothing(tmp_path, bad, message):
  a_file = tmp_path / "results.csv"
  a_file.write_text("kept\n")
  result = subprocess.run(
      [sys.executable, "-m", "textattn.benchmark", bad.format(file=a_file, dir=tmp_path)],
      cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode == 2
  (line,) = result.stderr.strip().splitlines()
  assert line.startswith(message.format(file=a_file, dir=tmp_path)), line
  assert len(line.replace(str(tmp_path), "TMP")) <= 300, line  # one short sentence
  assert a_file.read_text() == "kept\n"


@pytest.mark.parametrize("name,expected", [
    ("softmax", ("softmax", "xla")), ("softmax_dot_product", ("softmax", "dot_product")),
    ("softmax_cudnn", ("softmax", "cudnn")), ("softmax_chunked", ("softmax", "chunked")),
    ("causal_fused", ("causal", "fused")), ("additive", ("additive", "xla")),
    ("additive_native", ("additive", "native")), ("additive_auto", ("additive", "auto")),
    ("additive_pallas", ("additive", "pallas")),
    ("causal_additive_recurrent_chunked", ("causal_additive_recurrent", "chunked"))])
def test_variant_names_round_trip(name, expected):
  assert plan.parse_variant(name) == expected
  assert plan.variant_name(*expected) == name


@pytest.mark.parametrize("name", ["additive_chunked", "additive_fused", "softmax_", "flash",
                                  "causal_flash"])
def test_malformed_variant_names_are_rejected(name):
  with pytest.raises(ValueError, match="not a known variant") as raised:
    plan.parse_variant(name)
  assert len(str(raised.value)) <= 300 and "--help" in str(raised.value)


def test_variants_are_the_registry_s_attentions_and_implementations():
  from textattn import attention
  for name in attention.names():
    variant = attention.get(name)
    assert plan.parse_variant(name) == (name, variant.reference)
    for implementation in variant.implementations:
      assert plan.parse_variant(f"{name}_{implementation}") == (name, implementation)
      assert plan.parse_variant(plan.variant_name(name, implementation)) == (name, implementation)


BUILT_IN = ("softmax", "causal", "additive", "causal_additive", "causal_additive_recurrent")


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_built_in_kernel_has_a_benchmark_label(name):
  # Rows name the kernel that ran ("auto" is labelled by what it resolved to).
  from textattn import attention
  variant = attention.get(name)
  labels = dict(variant.kernels)
  assert set(labels) == set(variant.implementations) - {"auto"}, name
  assert all(labels.values())


@pytest.mark.parametrize("point,label", [("pallas", "pallas"), ("chunked", "chunked")])
def test_new_kernels_run_as_points_labelled_and_equal_to_their_reference(points, point, label):
  result = points(point)
  assert result["status"] == "ok", result["message"]
  assert result["kernel"] == label
  assert result["max_abs_diff"] < 1e-4


def test_the_default_comparison_is_additive_against_the_best_and_the_naive_softmax():
  from textattn import attention
  variants = plan.SYNTHETIC_DEFAULTS["variants"].split(",")
  assert variants == ["softmax_auto", "softmax", "additive_auto"]
  assert dict(attention.get("softmax").kernels)["xla"] == "naive"


@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_point_timeout_that_is_not_positive_is_refused(tmp_path, value):
  result = subprocess.run(
      [sys.executable, "-m", "textattn.benchmark", f"--point_timeout_s={value}",
       f"--out_dir={tmp_path / 'out'}"],
      cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode == 2
  (line,) = result.stderr.strip().splitlines()
  assert line == (f"error: --point_timeout_s={float(value):g} must be a positive number of "
                  f"seconds (the wall-clock limit of one point's subprocess)."), line
  assert not (tmp_path / "out").exists()


def test_flags_override_the_config_only_when_given():
  config = defaults.complete(defaults.classification())
  given = {"batch_size": 8, "seq_lens": None, "variants": None}
  settings = plan.resolve_settings(config, "train_step", given)
  assert settings["batch_size"] == 8 and settings["seq_lens"] == [config.max_len]
  assert settings["variants"] == [plan.variant_name(config.model.attention,
                                                   config.model.attention_impl)]
  assert settings["embed_dim"] == config.model.embed_dim
  settings = plan.resolve_settings(config, "forward", given)
  assert settings["embed_dim"] == plan.SYNTHETIC_DEFAULTS["embed_dim"]
  with pytest.raises(ValueError, match="num_heads"):
    plan.resolve_settings(config, "forward", {"embed_dim": 10, "num_heads": 4})
  with pytest.raises(ValueError, match="inject_failure"):
    plan.parse_injections("softmax@16=segfault")


def test_decode_step_mode_times_each_causal_variant_and_refuses_a_non_causal_one(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "textattn.benchmark", "--mode=decode_step", "--seq_lens=16",
       "--embed_dim=16", "--num_heads=2", "--repeats=2", "--warmup=1",
       f"--out_dir={tmp_path / 'out'}"], cwd=ROOT, capture_output=True, text=True, timeout=300,
      check=False)
  assert result.returncode == 0, result.stdout + result.stderr
  import csv
  rows = list(csv.DictReader((tmp_path / "out" / "results.csv").read_text().splitlines()))
  assert {(r["variant"], int(r["seq_len"])) for r in rows} == {
      (v, 16) for v in ("causal", "causal_additive", "causal_additive_recurrent")}
  assert all(r["status"] == "ok" for r in rows)
  for r in rows:  # one token per row per step
    assert float(r["tokens_per_s"]) == pytest.approx(float(r["examples_per_s"]))
  bad = subprocess.run(
      [sys.executable, "-m", "textattn.benchmark", "--mode=decode_step", "--variants=additive",
       f"--out_dir={tmp_path / 'bad'}"], cwd=ROOT, capture_output=True, text=True, timeout=120,
      check=False)
  assert bad.returncode == 2 and "'additive' is not causal" in bad.stderr


def test_a_timed_point_stays_ok_when_what_follows_its_timing_fails(tmp_path, monkeypatch):
  # A naive reference out of memory where the point's own (chunked, flash) kernel fits made the
  # whole row "oom": the one point the kernel exists to win, shown as failed.
  from textattn.benchmark import measure

  def reference_out_of_memory(*_):
    raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4.0GiB")
  monkeypatch.setattr(measure, "_check_against_reference", reference_out_of_memory)
  spec = one_spec(variant="softmax_chunked", check_against_reference=True)
  path = str(tmp_path / "point.json")
  measure.run_point(spec, path)
  with open(path) as f:
    row = json.load(f)
  assert row["status"] == "ok" and float(row["median_ms"]) > 0, row
  assert row["message"] == "timed; what followed failed (out of memory)"


def test_the_peak_is_one_cpu_devices_measured_or_each_used_accelerators_datasheet(monkeypatch):
  # Fake CPU devices share one machine's cores: 8 of them do not have 8 times its peak.
  import types

  from textattn.benchmark import measure, utilization
  monkeypatch.setattr(utilization, "measured_cpu_peak", lambda: 2.0)
  cpu = types.SimpleNamespace(platform="cpu", device_kind="cpu")
  assert measure.peak(cpu, "float32", 8) == (2.0, None)
  gpu = types.SimpleNamespace(platform="gpu", device_kind="NVIDIA H100 80GB HBM3")
  one = utilization.device_peak(gpu.device_kind, "bfloat16")
  assert one[0] and measure.peak(gpu, "bfloat16", 4) == (4 * one[0], 4 * one[1])


def test_a_kernel_over_its_on_chip_memory_is_an_error_not_the_point_out_of_memory():
  from textattn.benchmark import measure
  assert measure._is_oom(RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to "
                                       "allocate 17179869184 bytes."))
  assert not measure._is_oom(RuntimeError("RESOURCE_EXHAUSTED: Shared memory size limit "
                                          "exceeded: requested 262144, available: 232448"))
  assert not measure._is_oom(RuntimeError("RESOURCE_EXHAUSTED: Ran out of VMEM: 48.0M of 16.0M"))


def test_decode_step_updates_its_cache_in_place_at_the_last_position_each_call():
  # Without donation each timed call copied the whole KV cache (an O(L) cost the recurrent
  # variants' small state does not pay), unlike a real decoder's in-place update.
  import jax
  import ml_collections

  from textattn.benchmark import builders, measure
  spec = one_spec(mode="decode_step", variant="causal", seq_len=16)
  step, args = builders.build(spec, ml_collections.ConfigDict(json.loads(spec["config"])))
  out = step(*args)
  assert all(leaf.is_deleted() for leaf in jax.tree.leaves(args[1]))  # donated
  following = measure.next_arguments("decode_step", args, out)
  indices = [int(leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(following[1])
             if getattr(path[-1], "key", None) == "index"]
  assert indices and set(indices) == {15}  # the same step again: position L - 1
  jax.block_until_ready(step(*following))


def test_ctrl_c_during_a_point_kills_its_process(monkeypatch):
  # The point runs in its own session (a hang is killed by process group), so a terminal's
  # Ctrl-C never reached it: it ran on after the sweep's traceback, holding its device.
  import signal
  started = []
  real_popen = subprocess.Popen

  def popen(*args, **kwargs):
    started.append(real_popen(*args, **kwargs))
    signal.setitimer(signal.ITIMER_REAL, 3.0)  # (Ctrl-C while the hanging point runs)
    return started[-1]
  previous = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
  monkeypatch.setattr(sweep.subprocess, "Popen", popen)
  try:
    with pytest.raises(KeyboardInterrupt):
      sweep.run_point_in_subprocess(one_spec(inject="timeout"), 120.0)
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)
  assert started[0].poll() is not None  # (ended, not left running)
