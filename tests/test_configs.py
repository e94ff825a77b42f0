"""Every shipped config loads, passes the trainer's validation and documents its run command."""

import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest

from textattn import data as data_lib
from textattn import defaults, models
from textattn import run as runner
from textattn.pretrained import hf

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[1] / "configs"
CONFIGS = sorted(p.stem for p in CONFIG_DIR.glob("*.py"))
TINY_BERT = pathlib.Path(__file__).resolve().parent / "fixtures" / "tiny_bert"


@pytest.mark.parametrize("name", CONFIGS)
def test_config_is_valid_and_documents_its_run_command(name, tmp_path):
  path = CONFIG_DIR / f"{name}.py"
  config = defaults.complete(defaults.load(str(path)))
  if config.task == "translation":
    config.dataset = str(tmp_path / "pairs.txt")  # (the user's file; this one exists)
    (tmp_path / "pairs.txt").write_text("Hi.\tHola.\n")
  elif "dataset" in config and data_lib.is_local_file(config.dataset):  # (a user's file)
    config.dataset = str(tmp_path / ("data" + os.path.splitext(config.dataset)[1]))
    pathlib.Path(config.dataset).write_text("text,label\nfine,a\n")
  bert_config = None
  if config.task == "classification" and config.model.pretrained:
    # (the hub's model is not fetched here: the tiny fixture of the same layout, whose 32
    # positions bound max_len)
    config.model.pretrained = str(TINY_BERT)
    config.max_len = min(config.max_len, 32)
    bert_config = hf.read_config(TINY_BERT)
  runner.validate(config, max(1, config.platform.num_cpu_devices))
  if config.task == "classification":
    models.build_model(config, num_classes=2, pretrained_config=bert_config)
  docstring = ast.get_docstring(ast.parse(path.read_text()))
  assert f"python -m textattn.main --config=configs/{name}.py" in docstring


def test_configs_are_loaded_by_path_not_installed_as_a_package(tmp_path):
  # A top-level package named `configs` would shadow any other of that name in a user's
  # environment; config files are read by path (--config=configs/x.py) instead.
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  result = subprocess.run([sys.executable, "-c", "import configs"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, check=False)
  assert result.returncode != 0 and "No module named 'configs'" in result.stderr


def test_the_seed_configs_share_the_seed_model():
  seed = defaults.complete(defaults.load(str(CONFIG_DIR / "imdb_keras_example.py")))
  fast = defaults.complete(defaults.load(str(CONFIG_DIR / "imdb_keras_fast.py")))
  assert fast.model.to_dict() == seed.model.to_dict()
  assert (fast.vocab_size, fast.max_len, fast.batch_size) == (seed.vocab_size, seed.max_len, 32)


def test_a_shipped_config_is_found_by_name_from_any_directory(tmp_path):
  # --config=NAME reads the config the installed package ships (textattn/configs/NAME.py), so
  # the README's commands work outside the checkout; a path still works, and a missing one is
  # one line with exit 2 (the summary command used to end in a traceback).
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  command = [sys.executable, "-m", "textattn.summary"]
  by_name = subprocess.run(command + ["--config=imdb_keras_example"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, check=False)
  assert by_name.returncode == 0, by_name.stderr[-2000:]
  assert "653,566" in by_name.stdout  # the seed model's parameter count
  missing = subprocess.run(command + ["--config=missing.py"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, check=False)
  assert missing.returncode == 2
  assert missing.stderr.startswith("error: --config=missing.py: no such config file")
  assert len(missing.stderr.strip().splitlines()) == 1 and "Traceback" not in missing.stderr
  assert len(missing.stderr.strip()) <= 300  # (it named every shipped config: 519 characters)
  typo = subprocess.run(command + ["--config=imdb_fastfromer"], cwd=tmp_path, env=env,
                        capture_output=True, text=True, check=False)
  assert "did you mean imdb_fastformer?" in typo.stderr
  classes = subprocess.run(command + ["--config=imdb_keras_example", "--num_classes=0"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
  assert classes.returncode == 2 and classes.stderr.startswith(  # (a ZeroDivisionError)
      "error: --num_classes=0 must be >= 2."), classes.stderr[-2000:]


def test_a_variant_option_on_the_command_line_reaches_the_model():
  """--config.model.linear.* on a config without config.model.linear (an option part, added
  when named): the learned map's 8 features show in the parameter table; a misspelt field is
  one line, exit 2."""
  command = [sys.executable, "-m", "textattn.summary", "--config=imdb_keras_fast",
             "--config.model.attention=linear", "--config.model.linear.feature_map=hedgehog"]
  done = subprocess.run(command + ["--config.model.linear.features=8"], capture_output=True,
                        text=True, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "key_kernel[2, 16, 8]" in done.stdout
  typo = subprocess.run(command + ["--config.model.linear.featres=8"], capture_output=True,
                        text=True, check=False)
  assert typo.returncode == 2 and "did you mean config.model.linear.features?" in typo.stderr


def _leaves(config, prefix=""):
  out = []
  for name, value in config.items():
    out += (_leaves(value, f"{prefix}{name}.") if hasattr(value, "items") else [prefix + name])
  return out


def test_the_default_classification_config_is_small_and_its_parts_opt_in():
  # Issue 52: <= 45 leaf fields (flax's examples: 15-44); what one data source, architecture,
  # recipe or platform setting uses is an opt-in part, completed by the runner.
  config = defaults.classification()
  assert len(_leaves(config)) <= 45, len(_leaves(config))
  complete = defaults.complete(config)
  for part in ("source", "layout", "ngrams", "embedding", "bilstm", "platform"):
    assert part not in config and part in complete
  assert "adam" not in config.optimizer and "adam" in complete.optimizer
  # A config's own part values survive completion; a field a part lacks is refused.
  config = defaults.classification("ngrams")
  config.ngrams.order = 3
  assert defaults.complete(config).ngrams.order == 3
  config.ngrams.ordr = 3
  with pytest.raises(ValueError, match=r"config.ngrams.ordr: config.ngrams has no field 'ordr'"):
    defaults.complete(config)


def _assignments(path):
  """(base call, [(dotted field, literal value)]) of a config file's get_config()."""
  base, fields = None, []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
      target, text = node.targets[0], ast.unparse(node.targets[0])
      if text == "config":
        base = node.value
      elif text.startswith("config.") and isinstance(target, ast.Attribute):
        try:
          fields.append((text[len("config."):], ast.literal_eval(node.value)))
        except ValueError:
          pass  # (a computed value: not compared)
  return base, fields


@pytest.mark.parametrize("name", defaults.shipped_configs())
def test_a_shipped_config_sets_only_what_differs_from_its_base(name):
  path = CONFIG_DIR / f"{name}.py"
  base_call, fields = _assignments(path)
  text = ast.unparse(base_call)
  sibling = re.search(r"sibling\(__file__, '([^']+)'\)", text)
  if sibling:
    base = defaults.complete(defaults.load(str(CONFIG_DIR / sibling.group(1))))
  else:
    task = re.search(r"for_task\('([^']+)'", text)
    task = (task.group(1) if task else
            "translation" if "translation(" in text else "classification")
    base = defaults.complete(defaults.for_task(task))
  redundant = []
  for field, value in fields:
    node = base
    for part in field.split("."):
      node = node.get(part)
      if node is None:
        break
    if node is not None and not hasattr(node, "items") and node == value:
      redundant.append(f"config.{field} = {value!r}")
    if node is not None and not hasattr(node, "items"):
      defaults.set_fields(base, {field: value})
  assert not redundant, f"{name} sets what its base already gives: {redundant}"
