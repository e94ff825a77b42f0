"""The toy task's config (tests/toy_task.py), a few seconds on a CPU.

    python -m textattn.main --plugin=tests.toy_task --config=tests/toy_task_config.py \
        --workdir=runs/toy
"""

from tests import toy_task  # noqa: F401 -- registers the task (run from the repository's root)
from textattn import defaults


def get_config():
  config = defaults.for_task("toy_reverse")  # its own fields, then the runner's
  config.num_train_steps = 60
  config.eval_every_steps = 10
  config.checkpoint_every_steps = 10
  config.log_every_steps = 10
  return config
