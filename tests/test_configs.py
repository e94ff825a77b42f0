"""Every shipped config loads, passes the trainer's validation and documents its run command."""

import ast
import os
import pathlib
import subprocess
import sys

import pytest

from textattn import classify, defaults, models

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[1] / "configs"
CONFIGS = sorted(p.stem for p in CONFIG_DIR.glob("*.py"))


@pytest.mark.parametrize("name", CONFIGS)
def test_config_is_valid_and_documents_its_run_command(name, tmp_path):
  path = CONFIG_DIR / f"{name}.py"
  config = defaults.load(str(path))
  if config.get("task") == "translation":
    from textattn import translation
    config.dataset = str(tmp_path / "pairs.txt")  # (the user's file; this one exists)
    (tmp_path / "pairs.txt").write_text("Hi.\tHola.\n")
    translation.validate_config(config, device_count=max(1, config.num_cpu_devices))
  else:
    classify.validate_config(config, device_count=max(1, config.num_cpu_devices))
    models.build_model(config, num_classes=2)
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
  seed = defaults.load(str(CONFIG_DIR / "imdb_keras_example.py"))
  fast = defaults.load(str(CONFIG_DIR / "imdb_keras_fast.py"))
  assert fast.model.to_dict() == seed.model.to_dict()
  assert (fast.vocab_size, fast.max_len, fast.batch_size) == (seed.vocab_size, seed.max_len, 32)
