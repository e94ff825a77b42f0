"""Tasks are plug-ins on one runner: a toy task registered from tests/toy_task.py trains, stops
on SIGTERM, resumes bit-identically and is loaded, with no edit under textattn/; the package
keeps its layers (no command names a task, no task imports another, no config read with a
fallback); and a workdir written before config versions still resumes and predicts."""

import ast
import inspect
import json
import pathlib
import re
import shutil
import signal

import numpy as np
import pytest

import textattn
from tests.test_failures import STOP_LINE, has_checkpoint, start_main, wait_for
from tests.test_train import assert_trees_identical, final_report, read_metrics, restore_params
from textattn import defaults, loop, tasks
from textattn import run as runner
from textattn.errors import DataError, RunError, UsageError
from textattn.tasks.classification import classifier

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "textattn"
FIXTURES = REPO / "tests" / "fixtures"
TOY_ARGS = ["--plugin=tests.toy_task", "--config=tests/toy_task_config.py"]


def test_a_plugin_task_trains_stops_resumes_bit_identically_and_loads(tmp_path):
  stopped = tmp_path / "stopped"
  process = start_main(TOY_ARGS, stopped)
  assert wait_for(lambda: has_checkpoint(stopped), process), process.communicate()
  process.send_signal(signal.SIGTERM)
  _out, err = process.communicate(timeout=120)
  assert process.returncode == 143, err[-3000:]
  [stopped_at] = [int(m) for m in re.findall(STOP_LINE, err)]
  assert 10 <= stopped_at < 60, err[-2000:]
  resumed = start_main(TOY_ARGS, stopped)
  out, err = resumed.communicate(timeout=300)
  assert resumed.returncode == 0, err[-3000:]
  assert f"Resuming from checkpoint at step {stopped_at}." in out

  from tests import toy_task  # (registered by the import, as --plugin does)
  config = defaults.complete(defaults.load(str(REPO / "tests" / "toy_task_config.py")))
  straight = tmp_path / "straight"
  report = runner.train_and_evaluate(config, str(straight))
  assert final_report(stopped) == final_report(straight)
  assert_trees_identical(restore_params(stopped)[1], restore_params(straight)[1])
  assert report["test/accuracy"] > 0.5  # (chance: 1/8) it learnt to reverse

  reverser = textattn.load(str(stopped), plugins=["tests.toy_task"])
  test = toy_task.make_data(config).test.inputs
  predicted = reverser.reverse(test[:, :config.length])
  assert np.mean(predicted == test[:, config.length:]) == pytest.approx(report["test/accuracy"])
  with pytest.raises(DataError, match="is a toy_reverse run, not a classifier's workdir"):
    classifier.Classifier(str(stopped), "best", runner.read_workdir_config(
        str(stopped), ["tests.toy_task"]))  # (the classifier's own loader)


def _python_files(root):
  return sorted(p for p in root.rglob("*.py") if "configs" not in p.parts)


def test_nothing_outside_the_task_modules_branches_on_a_task():
  # The commands, the runner and the loop dispatch through textattn.tasks: no comparison with
  # a task's name outside its own modules (defaults.py names each task's defaults).
  names = set(tasks.names())
  offenders = []
  for path in _python_files(PACKAGE):
    if "tasks" in path.relative_to(PACKAGE).parts or path.name == "defaults.py":
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Compare) and any(
          isinstance(side, ast.Constant) and side.value in names
          for side in [node.left, *node.comparators]):
        offenders.append(f"{path.relative_to(REPO)}:{node.lineno} {ast.unparse(node)}")
  assert not offenders, offenders


def test_no_task_module_imports_another():
  wings = {p.stem for p in (PACKAGE / "tasks").iterdir()
           if p.name != "__init__.py" and not p.name.startswith("_")}
  assert {"classification", "translation"} <= wings
  for wing in wings:
    others = {f"textattn.tasks.{w}" for w in wings - {wing}}
    for path in (PACKAGE / "tasks").glob(f"{wing}*/**/*.py" if (PACKAGE / "tasks" / wing).is_dir()
                                          else f"{wing}.py"):
      for node in ast.walk(ast.parse(path.read_text())):
        modules = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                   [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        assert not any(m.split(".")[:3] == o.split(".") for m in modules for o in others), path


def test_a_plugin_task_gets_the_runners_checks_for_free():
  # The toy task checks only its own fields; the runner refuses its bad runner fields.
  from tests import toy_task  # noqa: F401 -- registers the task
  for field, value, words in [("batch_size", 0, "config.batch_size=0"),
                              ("num_epochs", 0, "config.num_epochs=0"),
                              ("keep_checkpoints", 0, "config.keep_checkpoints=0"),
                              ("optimizer.learning_rate", 0.0, "learning_rate=0.0")]:
    config = defaults.complete(defaults.load(str(REPO / "tests" / "toy_task_config.py")))
    config.num_train_steps = -1
    defaults.set_fields(config, {field: value})
    with pytest.raises(UsageError, match=re.escape(words)):
      runner.validate(config, None)
  config = defaults.complete(defaults.load(str(REPO / "tests" / "toy_task_config.py")))
  config.batch_size = 3
  with pytest.raises(UsageError, match="multiple of the device count"):
    runner.validate(config, 2)


CONFIG_RECEIVER = re.compile(r"(^|\.|_)(config|cfg|model|optimizer|opt|m)$")


def test_no_config_is_read_with_a_fallback():
  # Every field is declared with its default (a task's, the runner's, the optimizer's) and old
  # workdirs are migrated (config.migrate), so `config.get(field, fallback)` would only hide a missing declaration
  # or restate a default.
  offenders = []
  for path in _python_files(PACKAGE):
    for node in ast.walk(ast.parse(path.read_text())):
      if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr == "get"
          and CONFIG_RECEIVER.search(ast.unparse(node.func.value))):
        offenders.append(f"{path.relative_to(REPO)}:{node.lineno} {ast.unparse(node)}")
  assert not offenders, offenders


def test_the_loop_takes_its_actions_as_hooks_not_a_long_parameter_list():
  assert len(inspect.signature(loop.fit).parameters) <= 6


# ---- A workdir written before config versions (textattn at 4f22bde) ----------------------


def old_workdir(tmp_path, version=1):
  """A copy of tests/fixtures/workdir_v<version> and the config (today's fields) that made it."""
  workdir = tmp_path / f"workdir_v{version}"
  shutil.copytree(FIXTURES / f"workdir_v{version}", workdir)
  config = defaults.complete(defaults.load(str(FIXTURES / f"workdir_v{version}_config.py")))
  config.dataset = str(FIXTURES / "workdir_v1_reviews.csv")
  config.cache_dir = str(tmp_path / "cache")
  return workdir, config


@pytest.mark.parametrize("version", [1, 2])
def test_a_workdir_of_an_older_config_version_predicts_and_resumes(tmp_path, version):
  workdir, config = old_workdir(tmp_path, version)
  saved = json.loads((workdir / "config.json").read_text())
  assert saved.get("config_version", 1) == version
  classifier = textattn.load(str(workdir))
  if version == 2:  # (its fields that moved into opt-in parts arrive at their new places)
    assert "truncation" in saved and "token_dropout_rate" in saved["model"]
    assert classifier.config.layout.truncation == "post"
    assert classifier.config.embedding.bigram_buckets == 16
    assert classifier.config.platform.eval_batch_size == 8
    assert "truncation" not in classifier.config
  assert classifier.config.config_version == defaults.CONFIG_VERSION
  assert classifier.config.task == "classification"
  [row] = classifier.predict(["a wonderful superb film"])
  assert row["label"] in ("pos", "neg") and row["tokens"] == 4

  config.num_train_steps = 12  # (a constant schedule may be extended)
  report = runner.train_and_evaluate(config, str(workdir))
  assert report["test/params_from_step"] in (4, 8, 12)
  steps = [row["step"] for row in read_metrics(workdir) if "train/loss" in row]
  assert steps == [4, 8, 12]
  assert (workdir / "config.before-step-8.json").exists()  # the old record is kept aside


@pytest.mark.parametrize("field, value", [
    ("model.dropout_rate", 0.2),  # in the old contract
    ("intervals_dataset", "imdb_reviews"),  # not in it: added by the migration, then compared
])
def test_a_changed_field_against_a_migrated_workdir_is_refused(tmp_path, field, value):
  workdir, config = old_workdir(tmp_path)
  defaults.set_fields(config, {field: value})
  with pytest.raises(RunError, match=rf"was started with config\.{re.escape(field)}="):
    runner.train_and_evaluate(config, str(workdir))


@pytest.mark.parametrize("command, code, message", [
    (["textattn.sweep", "summarize", "missing.jsonl"], 1, "missing.jsonl: no such sweep file"),
    (["textattn.summary", "--config=imdb_softmax", "--config.model.attention=nope"], 2,
     "config.model.attention='nope' is not a known attention"),
    (["textattn.predict", "--workdir=.", "--text=hi"], 1, ". has no config.json"),
    (["textattn.main", "--config=imdb_softmax", "--workdir=w", "--config.task=nope"], 2,
     "config.task='nope' is not a known task"),
], ids=["sweep", "summary", "predict", "main_task"])
def test_every_command_ends_a_users_mistake_in_one_line(tmp_path, command, code, message):
  import subprocess
  import sys
  result = subprocess.run([sys.executable, "-m", *command], cwd=tmp_path, capture_output=True,
                          text=True, check=False, timeout=300)
  assert result.returncode == code, result.stderr[-2000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert errors == [errors[0]] and errors[0].startswith(f"error: {message}"), result.stderr
  assert "Traceback" not in result.stderr and not (tmp_path / "w").exists()


def test_profile_dir_holds_a_trace_of_the_annotated_train_steps(tmp_path):
  from tests import toy_task  # noqa: F401 -- registers the task
  config = defaults.complete(defaults.load(str(REPO / "tests" / "toy_task_config.py")))
  config.num_train_steps = config.eval_every_steps = config.checkpoint_every_steps = 5
  runner.train_and_evaluate(config, str(tmp_path / "run"), profile_dir=str(tmp_path / "profile"))
  traces = list((tmp_path / "profile").glob("plugins/profile/*/*.xplane.pb"))
  assert len(traces) == 1, traces
  assert loop.STEP_ANNOTATION.encode() in traces[0].read_bytes()  # the steps, as XProf shows them


def test_a_resume_keeps_the_kernel_auto_chose_where_auto_would_now_choose_another(
    tmp_path, monkeypatch):
  # Kernels round differently: a run started with the kernel "auto" resolved to (recorded in
  # its checkpoints' machine signature) resumes with that kernel even where "auto" would pick
  # another, so the resume stays bit-identical. The other resolution is forced here.
  from tests.test_train import tiny_config, write_sentiment_jsonl
  from textattn import models
  data = write_sentiment_jsonl(tmp_path / "reviews.jsonl")
  config = lambda steps: tiny_config(data, tmp_path / "cache", num_train_steps=steps,
                                     eval_every_steps=5, checkpoint_every_steps=5)
  straight = runner.train_and_evaluate(config(10), str(tmp_path / "straight"))
  runner.train_and_evaluate(config(5), str(tmp_path / "resumed"))
  first = models.resolved_kernel(config(10))
  other = "xla" if first != "xla" else "fused"
  real = models.resolved_kernel
  monkeypatch.setattr(models, "resolved_kernel", lambda c, pretrained_config=None: other
                      if c.model.attention_impl == "auto" else real(c, pretrained_config))
  resumed = runner.train_and_evaluate(config(10), str(tmp_path / "resumed"))
  assert resumed == straight
  assert_trees_identical(restore_params(tmp_path / "straight")[1],
                         restore_params(tmp_path / "resumed")[1])
