"""flax's Dense and DenseGeneral, differentiated the way XLA:CPU runs them fast (issue 56).

Same parameters (names, shapes, initialisers, the random numbers they draw) and the same values
to float rounding as flax's layers; on a CPU their gradients are formed differently:

- A dense layer over [batch, length, ...] activations is one [batch x length, in] x [in, out]
  matmul, and so are its two gradients. Differentiated as flax writes it, XLA:CPU formed the
  kernel gradient from the output gradient written *transposed*, [out, batch x length], by the
  elementwise fusion producing it: a strided loop, ~0.1-0.35 ms each, ~0.65 ms of the seed
  model's ~5.8 ms additive train step (experiments/cpu_step/README.md).
- Bias gradients, sums over batch x length, are matrix-vector products with a vector of ones:
  XLA:CPU runs such a column sum as a tree of reduce-window operations ~3x slower
  (experiments/cpu_step/rowsum_micro.py). (The same for LayerNorm's scale and bias, a custom
  gradient of x_hat * scale + bias, made the seed model's step ~5% slower: not done.)

Every other backend gets flax's own arithmetic (lax.dot_general, a broadcast add). Only what
this package uses is supported: contraction over the inputs' trailing axes, no batch_dims.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

Array = jax.Array


def contracts_merged_axes() -> bool:
  """Whether Dense and DenseGeneral run as described above (on the CPU backend): one 2-D matmul
  over the merged leading axes, so XLA reduces a kernel's gradient over a data x sequence mesh
  once over both axes (textattn/benchmark/collectives.py)."""
  return jax.default_backend() == "cpu"


def column_sum(g: Array) -> Array:
  """g [n, m] summed over n, as ones[n] @ g (a matrix-vector product)."""
  return jnp.matmul(jnp.ones((g.shape[0],), g.dtype), g,
                    preferred_element_type=jnp.promote_types(g.dtype, jnp.float32))


@jax.custom_vjp
def _affine(x: Array, kernel: Array, bias: Array | None) -> Array:
  """x [n, k] @ kernel [k, m] (+ bias [m])."""
  y = x @ kernel
  return y if bias is None else y + bias


def _affine_fwd(x, kernel, bias):
  return _affine(x, kernel, bias), (x, kernel, bias)


def _affine_bwd(residuals, g):
  x, kernel, bias = residuals
  d_x = lax.dot_general(g, kernel, (((1,), (1,)), ((), ()))).astype(x.dtype)
  d_kernel = lax.dot_general(x, g, (((0,), (0,)), ((), ()))).astype(kernel.dtype)
  d_bias = None if bias is None else column_sum(g).astype(bias.dtype)
  return d_x, d_kernel, d_bias


_affine.defvjp(_affine_fwd, _affine_bwd)


def dense(x: Array, kernel: Array, bias: Array | None, contracted: int,
          precision=None) -> Array:
  """x's last `contracted` axes with kernel's first ones, plus bias [kernel's other axes].
  With a `precision` (lax.Precision), flax's arithmetic on every backend."""
  inner = math.prod(kernel.shape[:contracted])
  outer = kernel.shape[contracted:]
  lead = x.shape[:x.ndim - contracted]
  if not contracts_merged_axes() or precision is not None:
    y = lax.dot_general(x, kernel, ((tuple(range(len(lead), x.ndim)), tuple(range(contracted))),
                                    ((), ())), precision=precision)
    return y if bias is None else y + bias
  y = _affine(x.reshape(-1, inner), kernel.reshape(inner, -1),
              None if bias is None else bias.reshape(-1))
  return y.reshape(lead + outer)


def _no_custom_dot(module: nn.Module) -> None:
  if module.dot_general is not None or module.dot_general_cls is not None:
    raise ValueError(f"textattn.flax_layers.{type(module).__name__} computes its own product; "
                     f"use flax.linen.{type(module).__name__} for a custom dot_general.")


class Dense(nn.Dense):
  """flax.linen.Dense (see the module docstring)."""

  @nn.compact
  def __call__(self, inputs: Array) -> Array:
    kernel = self.param("kernel", self.kernel_init, (jnp.shape(inputs)[-1], self.features),
                        self.param_dtype)
    bias = (self.param("bias", self.bias_init, (self.features,), self.param_dtype)
            if self.use_bias else None)
    _no_custom_dot(self)
    inputs, kernel, bias = self.promote_dtype(inputs, kernel, bias, dtype=self.dtype)
    return dense(inputs, kernel, bias, 1, self.precision)


def _tuple(x) -> tuple:
  return tuple(x) if isinstance(x, (tuple, list)) else (x,)


class DenseGeneral(nn.DenseGeneral):
  """flax.linen.DenseGeneral over the inputs' trailing axes (see the module docstring)."""

  @nn.compact
  def __call__(self, inputs: Array) -> Array:
    features, axis = _tuple(self.features), _tuple(self.axis)
    axis = tuple(a % inputs.ndim for a in axis)  # (in order: kernel axis i is input axis[i])
    if self.batch_dims or axis != tuple(range(inputs.ndim - len(axis), inputs.ndim)):
      raise ValueError(f"textattn.flax_layers.DenseGeneral contracts the inputs' trailing axes "
                       f"only and has no batch_dims; got axis={self.axis}, "
                       f"batch_dims={self.batch_dims}.")
    kernel_shape = tuple(inputs.shape[a] for a in axis) + features

    def kernel_init(rng, shape, dtype=jnp.float32):  # flax's: initialised as a matrix
      flat = (int(np.prod(shape[:len(axis)])), int(np.prod(features)))
      return jnp.reshape(self.kernel_init(rng, flat, dtype), shape)

    def bias_init(rng, shape, dtype=jnp.float32):
      return jnp.reshape(self.bias_init(rng, (int(np.prod(features)),), dtype), shape)
    kernel = self.param("kernel", kernel_init, kernel_shape, self.param_dtype)
    bias = self.param("bias", bias_init, features, self.param_dtype) if self.use_bias else None
    _no_custom_dot(self)
    inputs, kernel, bias = self.promote_dtype(inputs, kernel, bias, dtype=self.dtype)
    return dense(inputs, kernel, bias, len(axis), self.precision)

