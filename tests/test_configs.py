"""Every shipped config loads, passes the trainer's validation and documents its run command."""

import importlib
import pathlib

import pytest

from textattn import models, train

CONFIGS = sorted(p.stem for p in (pathlib.Path(__file__).resolve().parents[1] / "configs").glob(
    "*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", CONFIGS)
def test_config_is_valid_and_documents_its_run_command(name):
  module = importlib.import_module(f"configs.{name}")
  config = module.get_config()
  train.validate_config(config, device_count=max(1, config.num_cpu_devices))
  models.build_model(config, num_classes=2)
  command = "python -m textattn.main --config=configs/"
  assert command in module.__doc__ and (name == "default" or f"configs/{name}.py" in module.__doc__)


def test_the_seed_configs_share_the_seed_model():
  seed = importlib.import_module("configs.imdb_keras_example").get_config()
  fast = importlib.import_module("configs.imdb_keras_fast").get_config()
  assert fast.model.to_dict() == seed.model.to_dict()
  assert (fast.vocab_size, fast.max_len, fast.batch_size) == (seed.vocab_size, seed.max_len, 32)
