"""Bad input, as a user meets it (issue 27): config and flags, labels of local files, the native
kernel cache, and the inputs of compare and the benchmark. Each ends in one line naming what is
wrong and what is allowed, with exit code 2 for a usage error, no traceback, and nothing
created or changed."""

import _ctypes
import ctypes
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.test_train import REPO, cli_args, run_main, write_sentiment_jsonl
from textattn import command_line, compare, defaults, platform
from textattn import data as data_lib
from textattn.attention import native, softmax
from textattn.benchmark import plan
from textattn.data import raw, tfds_source


def one_line(stderr: str) -> str:
  assert "Traceback" not in stderr, stderr[-3000:]
  lines = [line for line in stderr.strip().splitlines() if line.startswith("error:")]
  assert len(lines) == 1, stderr[-3000:]
  return lines[0]


# ---- Config and flags (textattn.main) ------------------------------------------------------


@pytest.mark.parametrize("extra, message", [
    (["--config.modle.attention=softmax"],
     ("error: --config.modle.attention=softmax: the config has no field 'modle'; did you mean "
     "config.model.attention?")),
    (["--config.batch_size=eight"],
     ("error: --config.batch_size=eight: invalid literal for int() with base 10: 'eight'; "
     "config.batch_size takes a int")),
    (["--config=configs/no_such_config.py"],
     ("error: --config=configs/no_such_config.py: no such config file; give a config file's path "
     "or a shipped config's name")),
    (["--config.model.attention=nope"],
     "error: config.model.attention='nope' is not a known attention; allowed: softmax, causal,"),
    (["--config.platform.xla_flags=--xla_cpu_enable_fast_mat=false"],
     ("error: config.platform.xla_flags='--xla_cpu_enable_fast_mat=false': --xla_cpu_enable_fast_mat is "
     "not a flag this XLA")),
    (["--config.dataset=.."],
     "error: config.dataset='..' is a directory; give a TFDS name such as 'imdb_reviews'"),
], ids=["unknown_field", "wrong_type", "missing_config", "choice", "xla_flag", "dataset_dotdot"])
def test_a_bad_config_is_one_line_exit_2_and_creates_no_workdir(tmp_path, extra, message):
  data = write_sentiment_jsonl(tmp_path / "d.jsonl", n=40)
  workdir = tmp_path / "run"
  result = run_main(cli_args(data, tmp_path / "cache") + extra, workdir)
  assert result.returncode == 2, result.stderr[-3000:]
  assert one_line(result.stderr).startswith(message), result.stderr[-3000:]
  assert not workdir.exists() and not (tmp_path / "cache").exists()


def test_unknown_fields_get_a_did_you_mean_from_the_config_s_own_fields():
  config = defaults.complete(defaults.classification())
  assert command_line.unknown_field(config, "model.attention") is None
  assert command_line.unknown_field(config, "optimizer.learnig_rate") == (
      "config.optimizer.learnig_rate: the config has no field 'learnig_rate' in "
      "config.optimizer; did you mean config.optimizer.learning_rate?")
  message = command_line.unknown_field(config, "model.zzz")
  assert message.startswith("config.model.zzz: the config has no field 'zzz' in config.model; "
                            "the fields in config.model are: architecture, attention,")


def test_an_unknown_xla_flag_or_value_is_refused_before_any_step_compiles():
  config = defaults.complete(defaults.classification())
  config.platform.xla_flags = "--xla_cpu_enable_fast_math=false"
  platform.check_xla_flags(config)  # a flag XLA knows: accepted
  config.platform.xla_flags = "--xla_no_such_option=1"
  with pytest.raises(ValueError, match=r"--xla_no_such_option is not a flag this XLA .* "
                                       r"allowed: XLA's compile options"):
    platform.check_xla_flags(config)
  config.platform.xla_flags = "--xla_cpu_enable_fast_math=perhaps"
  with pytest.raises(ValueError, match=r"'perhaps' is not a valid bool value"):
    platform.check_xla_flags(config)


def test_a_dataset_name_is_checked_before_the_file_system_is_walked(tmp_path, monkeypatch):
  def no_walk(*args, **kwargs):
    raise AssertionError("the file system was walked")
  monkeypatch.setattr(os, "walk", no_walk)
  for name, problem in ((str(tmp_path), "is a directory"), ("..", "is a directory"),
                        ("../imdb_reviews", "is neither an existing local file nor a TFDS name"),
                        ("/etc/passwd/x", "is neither an existing local file nor a TFDS name")):
    config = defaults.complete(defaults.classification())
    config.dataset, config.cache_dir = name, str(tmp_path / "cache")
    with pytest.raises(data_lib.DataError, match=rf"config.dataset='{name}' {problem}"):
      data_lib.load_dataset(config, None)
    with pytest.raises(data_lib.DataError, match=problem):  # what the recipes' caches ask
      tfds_source.TfdsSource(config).identity()
  assert not (tmp_path / "cache").exists()
  tfds_source.check_name("imdb_reviews/plain_text:1.0.0")  # TFDS's grammar is accepted


# ---- Labels of local files -----------------------------------------------------------------


def file_config(tmp_path, path, **overrides):
  config = defaults.complete(defaults.classification())
  config.update(dataset=str(path), cache_dir=str(tmp_path / "cache"), max_len=8,
                vocab_size=100, val_fraction=0.2, **overrides)
  return config


def test_label_spellings_of_one_value_are_one_class(tmp_path):
  assert [raw.label_string(v) for v in (1, 1.0, "1", " 1 ", "1.0", "1e0", "+1", " pos ",
                                        "0.50", 12345678901234567891, "-0")] == [
      "1", "1", "1", "1", "1", "1", "1", "pos", "0.5", "12345678901234567891", "0"]
  for missing in (None, float("nan"), "", "  ", "NaN", "nan", "None", "null"):
    assert raw.label_string(missing) is None
  labels = [1, 1.0, "1", " 1.0 ", 0, "0", 0.0, " 0"]
  path = tmp_path / "d.jsonl"
  path.write_text("".join(json.dumps({"text": f"text {i}", "label": labels[i % len(labels)]})
                          + "\n" for i in range(40)))
  workdir = tmp_path / "work"
  data = data_lib.load_dataset(file_config(tmp_path, path), str(workdir))
  assert data.class_names == ["0", "1"]
  info = json.loads((workdir / data_lib.DATA_INFO_FILE).read_text())
  assert info["class_names"] == ["0", "1"]  # the class list is saved in the workdir


def test_a_cache_entry_from_before_the_label_rules_is_read_afresh(tmp_path, monkeypatch):
  path = tmp_path / "d.csv"
  path.write_text("text,label\n" + "".join(f"text {i},{['1', '1.0', '2'][i % 3]}\n"
                                           for i in range(30)))
  config = file_config(tmp_path, path)
  with monkeypatch.context() as patch:  # the old rule: spellings were classes of their own
    patch.setattr(raw, "label_string", lambda value: str(value).strip())
    assert data_lib.load_dataset(config, None).class_names == ["1", "1.0", "2"]
  entries = sorted(p.name for p in (tmp_path / "cache").glob("*.npz"))
  assert data_lib.load_dataset(config, None).class_names == ["1", "2"]
  assert sorted(p.name for p in (tmp_path / "cache").glob("*.npz")) == entries  # same key


def test_cache_keys_are_unchanged_for_labels_the_rules_leave_alone(tmp_path):
  path = tmp_path / "d.csv"
  path.write_bytes(b"text,label\n" + b"".join(f"text {i},{'ab'[i % 2]}\n".encode()
                                             for i in range(30)))
  data_lib.load_dataset(file_config(tmp_path, path), None)
  # The names the code before the label rules gives this file (commit 33a50a7).
  assert sorted(p.name for p in (tmp_path / "cache").glob("d-*")) == [
      "d-vocab100-81556329eb3cdf4b423cd7af.json", "d-word-8pre-6398abdb69a21c467b638fe4.npz"]


@pytest.mark.parametrize("name, content, message", [
    ("nan.csv", "text,label\nok,a\nfine,b\nmeh, NaN \n",
     (r"nan.csv, line 4: the label column 'label' is 'NaN', a missing value; every row needs a "
     r"label \(a class name or a number\)")),
    ("empty.csv", "text,label\nok,a\nfine,\n", (r"empty.csv, line 3: the label column 'label' is "
                                                r"empty; every row needs a label")),
    ("none.jsonl", '{"text": "a", "label": "b"}\n{"text": "c", "label": "None"}\n',
     (r"none.jsonl, line 2: label field 'label' is 'None'; it must be a non-empty string or a "
     r"number \(not a missing value")),
    ("nan.jsonl", '{"text": "a", "label": "b"}\n{"text": "c", "label": NaN}\n',
     r"nan.jsonl, line 2: label field 'label' is nan"),
    ("one_class.csv", "text,label\n" + "".join(f"t{i}, 1.0\n" for i in range(20)),
     r"one_class.csv: every label is '1'; a classifier needs at least two classes in training"),
], ids=["csv_nan", "csv_empty", "jsonl_none", "jsonl_nan", "one_class"])
def test_a_missing_label_or_a_single_class_is_a_data_error(tmp_path, name, content, message):
  path = tmp_path / name
  path.write_text(content)
  with pytest.raises(data_lib.DataError, match=message):
    data_lib.load_dataset(file_config(tmp_path, path), str(tmp_path / "work"))
  assert not (tmp_path / "work").exists() and not list((tmp_path / "cache").glob("*.npz"))


def test_a_training_split_of_one_class_after_the_carve_is_an_error(tmp_path):
  # 18 'a' rows and 2 'b' rows: a seed whose carve puts both 'b' rows in validation/test.
  rows = ["a"] * 18 + ["b"] * 2
  seed = next(s for s in range(1000)
              if not set(raw.carve(20, 0.2, s, 2, "x")[0].tolist()) & {18, 19})
  path = tmp_path / "d.csv"
  path.write_text("text,label\n" + "".join(f"t{i},{label}\n" for i, label in enumerate(rows)))
  with pytest.raises(data_lib.DataError, match=r"d.csv: the training split has only class 'a' "
                                               r"\(after carving validation and test\)"):
    data_lib.load_dataset(file_config(tmp_path, path, data_seed=seed), None)


def test_a_test_label_never_seen_in_training_names_the_file_line_and_value(tmp_path):
  n = 30
  seed = next(s for s in range(1000) if n - 1 in raw.carve(n, 0.2, s, 2, "x")[2].tolist())
  path = tmp_path / "d.csv"
  path.write_text("text,label\n" + "".join(f"t{i},{'ab'[i % 2]}\n" for i in range(n - 1))
                  + "rare one,c\n")
  with pytest.raises(data_lib.DataError, match=rf"d.csv, line {n + 1}: label 'c' \(test split\) "
                                               r"never occurs in the training split \(its "
                                               r"classes: a, b\); a class needs training"):
    data_lib.load_dataset(file_config(tmp_path, path, data_seed=seed), None)


# ---- Native kernels ------------------------------------------------------------------------


@pytest.fixture
def native_cache(tmp_path, monkeypatch):
  """A fresh native-kernel cache dir for this test; nothing loaded before is remembered."""
  directory = tmp_path / "native"
  directory.mkdir(mode=0o755)
  monkeypatch.setenv("TEXTATTN_NATIVE_CACHE", str(directory))
  native._load_once.cache_clear()
  softmax.warn_fallback.cache_clear()
  yield directory
  native._load_once.cache_clear()  # later tests load the real cache again
  softmax.warn_fallback.cache_clear()


def planted_library(directory, recorded_hash=None):
  compiler = native.find_compiler()
  if compiler is None:
    pytest.skip("no C++ compiler: no library path to plant at")
  path = native._library_path(compiler)
  assert path.parent == directory
  shutil.copyfile(_ctypes.__file__, path)  # a real shared library without the kernels
  digest = recorded_hash or native._sha256(path)
  path.with_name(path.name + ".sha256").write_text(digest + "\n")
  return path


def test_a_library_whose_hash_does_not_match_is_not_loaded(native_cache, monkeypatch):
  planted = planted_library(native_cache, recorded_hash="0" * 64)
  loaded = []
  monkeypatch.setattr(ctypes.cdll, "LoadLibrary", lambda path: loaded.append(path))
  reason = native.unavailable_reason()
  assert loaded == [] and not native.available()
  assert reason.startswith(f"{planted} does not match the sha256 its build recorded"), reason
  assert planted.read_bytes() == pathlib.Path(_ctypes.__file__).read_bytes()  # left for the user


def test_a_cache_dir_writable_by_others_is_refused(native_cache, monkeypatch):
  native_cache.chmod(0o777)
  monkeypatch.setattr(native, "_library_path", lambda compiler: native_cache / "k.so")
  monkeypatch.setattr(native, "find_compiler", lambda: ["/bin/true"])
  reason = native.unavailable_reason()
  assert reason == (f"the native kernel cache {native_cache} is writable by group or others "
                    f"(mode 777); libraries there are not loaded. Run `chmod go-w "
                    f"{native_cache}` or set TEXTATTN_NATIVE_CACHE to a private directory.")
  assert list(native_cache.iterdir()) == []  # nothing built or written there


def test_a_library_without_the_kernels_falls_back_with_one_warning(native_cache, monkeypatch,
                                                                    caplog):
  import jax
  planted = planted_library(native_cache)
  monkeypatch.setattr(jax, "device_count", lambda: 1)
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
  with caplog.at_level("WARNING"):
    assert softmax.resolve("auto") == "fused"
    assert softmax.resolve("auto") == "fused"
  warnings = [r.getMessage() for r in caplog.records if "attention_impl='auto'" in r.getMessage()]
  assert len(warnings) == 1, warnings
  assert f"{planted} lacks the kernel symbol TextattnSoftmaxAttentionForward" in warnings[0]
  # An explicit attention_impl='native' is one sentence instead.
  with pytest.raises(ValueError, match=r"config.model.attention_impl='native' is not available: "
                                       r".* lacks the kernel symbol"):
    softmax.check_native_here()


# ---- compare and the benchmark -------------------------------------------------------------


def write_run(directory, labels, probabilities, class_names=("neg", "pos")):
  os.makedirs(directory)
  np.savez(os.path.join(directory, compare.PREDICTIONS_FILE), labels=np.asarray(labels, np.int32),
           probabilities=np.asarray(probabilities, np.float32), class_names=np.array(class_names),
           params_from_step=np.int64(1))
  return str(directory)


def test_compare_refuses_bad_predictions_in_one_line_exit_2(tmp_path, capsys):
  labels = np.array([0, 1, 1, 0])
  good = write_run(tmp_path / "good", labels, np.eye(2)[labels])
  truncated = write_run(tmp_path / "truncated", labels, np.eye(2)[labels])
  path = pathlib.Path(truncated) / compare.PREDICTIONS_FILE
  path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])
  three = write_run(tmp_path / "three", labels, np.eye(3)[labels], ("a", "b", "c"))
  nan = write_run(tmp_path / "nan", labels, np.where(np.eye(2)[labels] > 0, np.nan, 0.0))
  outside = write_run(tmp_path / "outside", np.array([0, 1, 2, 0]), np.eye(2)[labels])
  other_names = write_run(tmp_path / "names", labels, np.eye(2)[labels], ("no", "yes"))
  cases = {
      truncated: r"test_predictions.npz is not a readable predictions file \(BadZipFile",
      three: r"the runs have different class counts \(2 and 3\)",
      nan: r"the probabilities of 4 test example\(s\) \(first: example 0\) are not finite .*; "
           r"they must be finite numbers",
      outside: r"label 2 of test example 2 \(and 0 more\) is outside the classes 0..1",
      other_names: r"the runs have different classes \(\['neg', 'pos'\] and \['no', 'yes'\]\)",
  }
  import re
  for other, message in cases.items():
    assert compare.main(["compare", good, other]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: "), err
    assert re.search(message, err), err


@pytest.mark.parametrize("flag, message", [
    ("--batch_size=0", "error: --batch_size=0 must be a positive integer."),
    ("--point_memory_limit_gb=-1", "error: --point_memory_limit_gb=-1 must be a number of GiB >= 0"),
    ("--config=no_such_config.py", "error: --config=no_such_config.py: no such config file"),
])
def test_bad_benchmark_flags_are_one_line_exit_2(tmp_path, flag, message):
  result = subprocess.run([sys.executable, "-m", "textattn.benchmark", flag,
                           f"--out_dir={tmp_path / 'out'}"], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)
  assert result.returncode == 2
  assert one_line(result.stderr).startswith(message), result.stderr
  assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("limits, message", [
    ({"point_timeout_s": float("nan")}, "--point_timeout_s=nan must be a positive number"),
    ({"point_time_budget_s": -1.0}, "--point_time_budget_s=-1 must be a number of seconds >= 0"),
    ({"point_memory_limit_gb": float("inf")}, "--point_memory_limit_gb=inf must be a number"),
    ({"num_classes": 1}, "--num_classes=1 must be an integer >= 2"),
])
def test_benchmark_limits_must_be_finite_and_in_range(limits, message):
  values = {"point_timeout_s": 600.0, "point_time_budget_s": 0.0, "point_memory_limit_gb": 8.0,
            "num_classes": 2, **limits}
  with pytest.raises(ValueError, match=message):
    plan.check_limits(**values)


def test_an_input_file_of_blank_lines_is_one_sentence_not_an_empty_success(tmp_path):
  # (translate and generate printed nothing and exited 0 for it)
  from textattn.errors import DataError, UsageError
  blank = tmp_path / "blank.txt"
  blank.write_text("\n  \n\t\n", encoding="utf-8")
  with pytest.raises(DataError, match=r"blank.txt holds no prompts: every line is blank"):
    command_line.text_lines([], str(blank), "prompts")
  blank.write_text("a sentence\n\nanother\n", encoding="utf-8")
  assert command_line.text_lines([], str(blank)) == ["a sentence", "another"]
  with pytest.raises(UsageError, match="not both and not neither"):
    command_line.text_lines(["x"], str(blank))
