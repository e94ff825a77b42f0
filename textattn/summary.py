"""Print a config's model as a per-module parameter table and its total.

    python -m textattn.summary --config=imdb_keras_example [--num_classes=2]
"""

from __future__ import annotations

from absl import app, flags
from ml_collections import config_flags

from textattn import command_line
from textattn.errors import UsageError, user_errors

_NUM_CLASSES = flags.DEFINE_integer("num_classes", 2, "Number of output classes (IMDB: 2).")
_PLUGINS = flags.DEFINE_multi_string("plugin", [], "Module that registers attention variants.")
_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file or name.",
                                          lock_config=True)


def main(argv):
  del argv
  from absl import logging
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # the table only, as textattn.main is quiet
  from textattn import attention, models, run  # (lazy: `--help` stays instant)
  with user_errors():
    if _NUM_CLASSES.value < 2:
      raise UsageError(f"--num_classes={_NUM_CLASSES.value} must be >= 2.")
    attention.load_plugins(_PLUGINS.value)
    config = run.complete(_CONFIG.value)  # (the opt-in parts the config leaves out, defaulted)
    if "architecture" not in config.model:  # (a classifier's field: other tasks' models differ)
      raise UsageError(f"textattn.summary prints a classifier's parameter table; config.task="
                       f"{config.task!r} builds its model from its data (its vocabulary), so "
                       f"its table is the one textattn.main prints when the run starts.")
    models.validate_model_config(config)
    model = models.build_model(config, _NUM_CLASSES.value)
    print(models.parameter_table(models.abstract_params(model, config.max_len)))


if __name__ == "__main__":
  app.run(main, flags_parser=command_line.flags_parser("config"))
