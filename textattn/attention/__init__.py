"""Attention variants behind one signature, looked up by name in a registry.

    variant = attention.get("additive")              # or "softmax", "causal", a plugin's name
    module = variant.build(num_heads=4, implementation="auto", dtype=jnp.float32, name="attention")
    y = module.apply(params, x, padding_mask)        # x [batch, length, embed] -> same shape

One module per variant (softmax.py, causal.py, additive.py, causal_additive.py), each with its
kernels (window_additive.py: a window + additive hybrid); additive_pallas.py and causal_additive_pallas.py their Pallas kernels (Triton style),
additive_tpu.py the additive one for TPUs (Mosaic), and
pallas_allowlist.py the platforms where "auto" may pick those; splash.py wraps JAX's Pallas TPU
splash attention (softmax's TPU kernel); common.py holds the masks they share; native/ the C++ CPU
kernels and their loader; calibration.py where "auto" picks them on a CPU (timed per shape at
first use); registry.py the registry. Importing this
package registers the built-in variants.
"""

# Registration order is the order names() lists them in.
from textattn.attention import softmax  # noqa: F401, I001 -- they register on import
from textattn.attention import causal  # noqa: F401
from textattn.attention import additive  # noqa: F401
from textattn.attention import causal_additive  # noqa: F401
from textattn.attention import linear  # noqa: F401
from textattn.attention import feature_maps  # noqa: F401 -- learned maps of linear
from textattn.attention import sliding_window  # noqa: F401
from textattn.attention import performer  # noqa: F401
from textattn.attention import hybrid  # noqa: F401
from textattn.attention import window_additive  # noqa: F401
from textattn.attention.recurrent import retnet  # noqa: F401
from textattn.attention.recurrent import gla  # noqa: F401
from textattn.attention.recurrent import mamba2  # noqa: F401
from textattn.attention.recurrent import deltanet  # noqa: F401 -- deltanet, gated_deltanet
from textattn.attention import sequence  # noqa: F401 -- declares the built-ins' sharding
from textattn.attention.common import usable_cores
from textattn.attention.registry import (Variant, build_options, default_options, get,
                                         load_plugins, names, register, rotary_names, unregister)

__all__ = ["Variant", "build_options", "default_options", "get", "load_plugins", "names",
           "register", "rotary_names", "unregister", "usable_cores"]
