"""Which attention kernel a classifier is built with: "auto" as the run started with it.

Kernels round differently, so a resumed run, and prediction from its workdir, keep the kernel
"auto" chose when the run started (recorded in its checkpoints' machine signature) wherever
that kernel runs.
"""

from __future__ import annotations

import ml_collections

from textattn import attention, models, restore
from textattn.errors import RunError, UsageError


def pinned_kernel(config, workdir: str | None, is_main: bool, strict: bool = True,
                  bert_config=None):
  """The config the model is built from: `config`, except on a resume with attention_impl="auto"
  where "auto" now resolves to another kernel than the one the run started with (recorded in its
  checkpoints' machine signature): that kernel is kept, since kernels round differently and a
  resume must continue bit-identically. RunError if it cannot run here; with strict=False
  (prediction: a GPU-trained workdir on a CPU) `config` then, as "auto" resolves here.
  `bert_config`: a pretrained encoder's, whose head size and heads "auto" resolves for."""
  m = config.model
  recorded = (restore.recorded_machine(workdir) or {}) if workdir else {}
  kernel = recorded.get("attention_impl", "auto")
  if m.architecture != "transformer" or m.attention_impl != "auto" or kernel == "auto":
    return config
  now = models.resolved_kernel(config, bert_config)
  if kernel == now:
    return config
  pinned = ml_collections.ConfigDict(config.to_dict())
  pinned.model.attention_impl = kernel
  embed_dim, num_heads = ((bert_config.hidden_size, bert_config.num_heads) if bert_config
                          else (m.embed_dim, m.num_heads))
  try:
    attention.get(m.attention).validate(kernel, embed_dim, num_heads, m.dtype)
  except UsageError as error:
    if not strict:
      return config
    raise RunError(f"The run in {workdir} started with the {kernel!r} {m.attention} kernel "
                   f"('auto' chose it there), which cannot run here ({error}); resume it where "
                   f"it runs, or name a kernel with config.model.attention_impl (its rounding "
                   f"differs, so the resume is then not bit-identical).") from None
  if is_main:
    print(f"Resuming with the {kernel!r} {m.attention} kernel the run started with ('auto' "
          f"would choose {now!r} here; kernels round differently).", flush=True)
  return pinned
