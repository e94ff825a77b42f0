"""textattn: text classifiers with interchangeable attention, in JAX/Flax.

`textattn.load(workdir)` returns a trained workdir's classifier (textattn/predict.py); the
command-line entry points are textattn.main, .predict, .benchmark, .sweep, .compare, .summary.
"""


def load(workdir: str, checkpoint: str = "best", plugins=()):
  """The classifier a training workdir holds: `.predict(texts)`, `.evaluate(path)`."""
  from textattn import predict  # (kept lazy: `import textattn` stays instant)
  return predict.load(workdir, checkpoint, plugins)
