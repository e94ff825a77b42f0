"""Causal (look-ahead masked) softmax self-attention; registers "causal".

The softmax module and kernels of textattn/attention/softmax.py with `causal=True`: position t
attends to positions <= t only. Same implementations as "softmax"; with segment ids (packed
documents) only within its own segment, through the xla and dot_product kernels
(softmax.SEGMENT_KERNELS; the others refuse them in one sentence).
"""

from __future__ import annotations

import functools

from textattn.attention import registry, softmax

registry.register(registry.Variant(
    name="causal",
    build=functools.partial(softmax.SelfAttention, causal=True),
    implementations=softmax.IMPLEMENTATIONS,
    resolve=functools.partial(softmax.resolve, variant="causal"),
    check=softmax.check,
    causal=True,
    # Only the lower triangle of the scores is needed: half the softmax's FLOPs.
    forward_flops=lambda *shape: 0.5 * softmax.forward_flops(*shape),
    kernels=softmax.KERNEL_LABELS,
    segment_ids=True,
    rotary=True,
    description="softmax self-attention with a look-ahead mask"))
