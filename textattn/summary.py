"""Print a config's model as a per-module parameter table and its total.

    python -m textattn.summary --config=configs/imdb_keras_example.py [--num_classes=2]
"""

from __future__ import annotations

import collections

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import config_flags

from textattn import models

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_NUM_CLASSES = flags.DEFINE_integer("num_classes", 2, "Number of output classes (IMDB: 2).")


def parameter_table(params) -> str:
  """Rows of module path, parameter shapes and count; the total on the last line."""
  rows = collections.OrderedDict()
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    keys = [getattr(k, "key", str(k)) for k in path]
    module, name = "/".join(keys[:-1]) or "(top)", keys[-1]
    shapes, count = rows.get(module, ([], 0))
    rows[module] = (shapes + [f"{name}{list(leaf.shape)}"], count + int(np.prod(leaf.shape)))
  width = max([len(m) for m in rows] + [6])
  lines = [f"{'module':<{width}}  {'params':>10}  shapes", "-" * (width + 40)]
  for module, (shapes, count) in rows.items():
    lines.append(f"{module:<{width}}  {count:>10,}  {' '.join(shapes)}")
  total = sum(count for _, count in rows.values())
  lines += ["-" * (width + 40), f"{'total':<{width}}  {total:>10,}"]
  return "\n".join(lines)


def abstract_params(model: models.Classifier, max_len: int):
  tokens = jnp.ones((1, max_len), jnp.int32)
  return jax.eval_shape(lambda: model.init(jax.random.key(0), tokens))["params"]


def main(argv):
  del argv
  config = _CONFIG.value
  model = models.build_model(config, _NUM_CLASSES.value)
  print(parameter_table(abstract_params(model, config.max_len)))


if __name__ == "__main__":
  app.run(main)
