"""CPU "auto": native only where measured faster (textattn/attention/calibration.py).

No timing is measured here: `calibration.measure` is replaced by injected timings, so these
tests check the decision, the cache (keying, atomic writes, concurrent first use, corrupt
files), the length threaded from the config, and that the chosen kernel is what a run records
and keeps on resume.
"""

import json
import threading
import time

import pytest

from textattn import attention, models
from textattn.attention import calibration, softmax
from textattn.errors import UsageError

# Injected milliseconds (native, fallback) by (variant, length bucket): native wins short
# softmax and all additive shapes, loses long softmax (as on CPU-4, RESULTS section 19).
TIMINGS = {("softmax", 16): (1.0, 2.0), ("softmax", 32): (3.0, 2.0),
           ("softmax", 256): (1.0, 2.0), ("softmax", 4096): (9.0, 4.0),
           ("causal", 256): (1.0, 1.01), ("additive", 256): (1.0, 3.0),
           ("additive", 4096): (2.0, 5.0)}


@pytest.fixture
def calibrated(tmp_path, monkeypatch):
  """"auto" calibrates (into a cache file of its own) with the injected TIMINGS; returns the
  list of shapes measured."""
  monkeypatch.setenv(calibration.ENV, "measure")
  monkeypatch.setattr(softmax, "native_runs_here", lambda: True)
  path = tmp_path / "textattn_kernels-test.calibration.json"
  monkeypatch.setattr(calibration, "cache_path", lambda: path)
  measured = []

  def fake_measure(shape, make_problem, fallback):
    del make_problem, fallback
    measured.append(shape)
    native_ms, fallback_ms = TIMINGS[(shape.variant, shape.length)]
    return [native_ms / 1e3] * 3, [fallback_ms / 1e3] * 3

  monkeypatch.setattr(calibration, "measure", fake_measure)
  calibration.clear()
  yield measured
  calibration.clear()


def resolve(name, length, head_dim=64, heads=4, dtype="float32"):
  return attention.get(name).kernel("auto", head_dim, dtype, length=length, num_heads=heads)


def test_native_only_where_measured_faster_by_the_margin():
  assert calibration.decide(1.0, 2.0)
  assert not calibration.decide(2.0, 1.0)
  assert not calibration.decide(1.0, 1.0 + calibration.MARGIN / 2)  # a near tie keeps XLA
  shape = calibration.shape("softmax", 512, 64, "float32")
  entry = calibration.verdict(shape, "fused", 1.8, 2.3)
  assert entry["choice"] == "native"
  assert "native 1.8 ms vs fused 2.3 ms at length 512" in entry["reason"]
  assert calibration.verdict(shape, "fused", 2.3, 1.8)["choice"] == "fused"


def test_length_buckets_are_powers_of_two_nearest_in_log_scale():
  assert [calibration.length_bucket(n) for n in (1, 200, 256, 300, 400, 1000, 5000)] == [
      8, 256, 256, 256, 512, 1024, 4096]


def test_auto_resolves_per_length_from_injected_timings(calibrated):
  assert resolve("softmax", 256) == "native"
  assert resolve("softmax", 4000) == "fused"  # bucket 4096: native measured slower
  assert resolve("causal", 256) == "fused"  # 1% faster: within the margin
  assert resolve("additive", 300) == "native"
  assert resolve("additive", 4096, head_dim=12) == "xla"  # the native kernel needs head_dim % 8
  assert resolve("softmax", 4096) == "fused"  # (remembered: not measured again)
  assert [(s.variant, s.length) for s in calibrated] == [
      ("softmax", 256), ("softmax", 4096), ("causal", 256), ("additive", 256)]
  # Without a length (an older caller), the rule that needs no timing.
  assert attention.get("softmax").resolve("auto", 64) == "native"


def test_the_choice_and_its_reason_are_logged_once_at_info_level(calibrated, caplog):
  # Timings nobody asked for are no warning: every run once printed absl W lines with them.
  with caplog.at_level("INFO"):
    for _ in range(2):
      assert resolve("softmax", 4096) == "fused"
  lines = [r.getMessage() for r in caplog.records if "attention_impl='auto'" in r.getMessage()]
  assert len(lines) == 1, lines
  assert "'fused'" in lines[0] and "native 9 ms vs fused 4 ms at length 4096" in lines[0]
  assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.text


def test_verdicts_are_cached_and_keyed_by_library_threads_and_shape(calibrated, tmp_path,
                                                                    monkeypatch):
  assert resolve("softmax", 4096) == "fused"
  entries = calibration.read_cache(calibration.cache_path())
  (key,) = entries
  assert entries[key]["reason"].startswith("native 9 ms vs fused 4 ms at length 4096")
  calibration.clear()  # a new process: the file answers, nothing is measured
  assert resolve("softmax", 4096) == "fused"
  assert len(calibrated) == 1
  # Another head count is the same softmax class; for additive attention it is not.
  assert resolve("softmax", 4096, heads=8) == "fused" and len(calibrated) == 1
  assert resolve("additive", 256, heads=2) == "native" and resolve("additive", 256) == "native"
  assert len(calibrated) == 3
  # Another thread count, or another library (a rebuild, another CPU: another file), measures.
  monkeypatch.setattr(calibration.Shape, "key", lambda self: "t99/" + self.variant)
  calibration.clear()
  assert resolve("softmax", 4096) == "fused" and len(calibrated) == 4
  monkeypatch.setattr(calibration, "cache_path", lambda: tmp_path / "other.calibration.json")
  assert resolve("softmax", 4096) == "fused" and len(calibrated) == 5


@pytest.mark.parametrize("content", ["{not json", '{"version": 1, "entries": []}', "\x00\xff",
                                     '{"version": 1, "entries": {"KEY": {"choice": "bogus"}}}'])
def test_a_corrupt_cache_is_ignored_and_rewritten(calibrated, content):
  path = calibration.cache_path()
  key = calibration.shape("softmax", 256, 64, "float32").key()
  path.write_bytes(content.replace("KEY", key).encode("latin-1"))
  assert resolve("softmax", 256) == "native"
  assert len(calibrated) == 1
  assert calibration.read_cache(path)[key]["choice"] == "native"  # valid again


def test_the_cache_is_replaced_atomically(tmp_path, monkeypatch):
  path = tmp_path / "c.calibration.json"
  calibration.write_cache(path, {"a": {"choice": "native"}})

  def broken_dump(*args, **kwargs):
    raise OSError("disk full")

  monkeypatch.setattr(json, "dump", broken_dump)
  with pytest.raises(OSError):
    calibration.write_cache(path, {"b": {}})
  assert calibration.read_cache(path) == {"a": {"choice": "native"}}  # the old file, whole
  assert [p.name for p in tmp_path.iterdir()] == ["c.calibration.json"]  # no temporary left


def test_concurrent_first_use_measures_once(calibrated, monkeypatch):
  # Two resolutions at once (the lock is a file lock, so it also holds between processes):
  # the second waits for the first's measurement and reads its verdict.
  slow = calibration.measure

  def slow_measure(*args):
    time.sleep(0.3)
    return slow(*args)

  monkeypatch.setattr(calibration, "measure", slow_measure)
  results = []
  threads = [threading.Thread(target=lambda: results.append(resolve("softmax", 256)))
             for _ in range(2)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert results == ["native", "native"]
  assert len(calibrated) == 1


def test_the_environment_forces_a_choice_without_timing(calibrated, monkeypatch):
  monkeypatch.setenv(calibration.ENV, "xla")
  assert resolve("softmax", 256) == "fused" and resolve("additive", 256) == "xla"
  monkeypatch.setenv(calibration.ENV, "native")
  assert resolve("softmax", 4096) == "native"
  assert calibrated == []
  monkeypatch.setenv(calibration.ENV, "fastest")
  with pytest.raises(UsageError, match="TEXTATTN_CPU_AUTO='fastest'.*measure, native, xla"):
    resolve("softmax", 256)


def test_a_plugins_resolve_without_the_length_keywords_still_works(toy):
  assert attention.get("toy_mean").kernel("auto", 8, "float32", length=64, num_heads=2) == "xla"


def test_the_model_resolves_at_config_max_len(calibrated):
  from textattn import defaults
  config = defaults.complete(defaults.classification())
  config.model.update(embed_dim=256, num_heads=4)
  config.max_len = 256
  assert models.resolved_kernel(config) == "native"
  config.max_len = 4096
  assert models.resolved_kernel(config) == "fused"


def test_a_pretrained_encoder_resolves_for_its_own_head_size_not_the_configs(calibrated):
  # The kernel a fine-tuning run records (and pins on resume) is the one its encoder runs: "auto"
  # resolved for the checkpoint's head size and heads (tiny BERT: 2 heads of 16), not for
  # config.model.embed_dim / num_heads, which a pretrained model ignores.
  from tests.test_finetune import FIXTURE
  from textattn import defaults
  from textattn.pretrained import finetune
  config = defaults.complete(defaults.classification())
  config.model.update(pretrained=str(FIXTURE), embed_dim=64, num_heads=8)  # (head size 8)
  config.max_len = 256
  bert_config = finetune.model_config(config)
  kernel = models.resolved_kernel(config, bert_config)
  assert [(s.head_dim, s.heads) for s in calibrated] == [(16, None)]  # (softmax: no heads)
  model = models.build_model(config, 2, pretrained_config=bert_config)
  assert model.attention_impl == kernel == models.resolved_kernel(config) == "native"


@pytest.mark.cpu_only
def test_the_benchmark_resolves_auto_per_point(calibrated, tmp_path):
  from textattn.attention import native
  if native.find_compiler() is None:
    pytest.skip("no C++ compiler here: the native kernel cannot run")
  from textattn import defaults
  from textattn.benchmark import measure, plan
  settings = plan.resolve_settings(defaults.complete(defaults.classification()), "attention", {
      "variants": "softmax_auto", "seq_lens": "16,32", "embed_dim": 16, "num_heads": 2,
      "batch_size": 2})
  got = {}
  for spec in plan.plan_points(defaults.complete(defaults.classification()), settings, "attention", warmup=0,
                               repeats=1, memory_limit_gb=0):
    path = str(tmp_path / f"{spec['seq_len']}.json")
    measure.run_point(spec, path)
    with open(path) as f:
      result = json.load(f)
    assert result["status"] == "ok", result["message"]
    got[spec["seq_len"]] = (result["implementation"], result["kernel"])
  assert got == {16: ("native", "native"), 32: ("fused", "fused")}


def test_the_calibrated_choice_is_recorded_and_kept_on_resume(calibrated, tmp_path, monkeypatch):
  # The run records the kernel the calibration chose (fused: native measured slower at its
  # length) in its checkpoints' machine signature; where the calibration later says native
  # (a new verdict), the resume keeps the recorded kernel (kernels round differently).
  import textattn
  from tests.test_train import tiny_config, write_sentiment_jsonl
  from textattn import restore
  from textattn import run as runner
  from textattn.tasks.classification import kernels
  data = write_sentiment_jsonl(tmp_path / "reviews.jsonl")
  config = tiny_config(data, tmp_path / "cache", num_train_steps=1, eval_every_steps=1,
                       checkpoint_every_steps=1)  # softmax, max_len 16, head_dim 8
  monkeypatch.setitem(TIMINGS, ("softmax", 16), (3.0, 2.0))
  runner.train_and_evaluate(config, str(tmp_path / "run"))
  assert restore.recorded_machine(str(tmp_path / "run"))["attention_impl"] == "fused"
  monkeypatch.setitem(TIMINGS, ("softmax", 16), (1.0, 2.0))
  monkeypatch.setattr(calibration, "cache_path", lambda: tmp_path / "new.calibration.json")
  calibration.clear()
  config.num_train_steps = 2
  assert models.resolved_kernel(config) == "native"
  pinned = kernels.pinned_kernel(config, str(tmp_path / "run"), is_main=True)
  assert pinned.model.attention_impl == "fused"
  # Prediction from the workdir uses it too (its report is reproduced to the bit).
  assert textattn.load(str(tmp_path / "run")).model.attention_impl == "fused"


def test_a_failed_timing_falls_back_uncached(calibrated, monkeypatch):
  def out_of_memory(*args):
    raise MemoryError("injected")

  monkeypatch.setattr(calibration, "measure", out_of_memory)
  assert resolve("softmax", 256) == "fused"
  assert calibration.read_cache(calibration.cache_path()) == {}  # measured again next time
