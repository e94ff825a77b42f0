"""textattn: text models with interchangeable attention, in JAX/Flax.

`textattn.load(workdir)` returns what a trained workdir's task offers (a classifier's
`.predict`/`.explain`, a translator's `.translate`); the command-line entry points are
textattn.main, .predict, .translate, .benchmark, .sweep, .compare, .ensemble, .summary.
"""


def load(workdir: str, checkpoint: str = "best", plugins=()):
  """What the task of a training workdir offers for it (textattn/tasks/<task>.py's `load`):
  a classifier (`.predict(texts)`, `.explain(texts)`, `.evaluate(path)`), a translator
  (`.translate(texts)`), or a plugin task's own; `plugins`: the modules the run was trained
  with --plugin."""
  from textattn import run  # (lazy: `import textattn` and every command's --help stay instant)
  return run.load(workdir, checkpoint, plugins)
