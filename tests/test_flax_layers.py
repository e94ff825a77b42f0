"""textattn.flax_layers: flax's Dense and DenseGeneral with CPU-friendly gradients (issue
56): the same parameters, values and gradients as flax's."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from textattn import flax_layers as layers

CASES = [  # (ours, flax's, input shape, contracted axes)
    (lambda: layers.Dense(4), lambda: nn.Dense(4), (2, 5, 3), 1),
    (lambda: layers.DenseGeneral((2, 3)), lambda: nn.DenseGeneral((2, 3)), (2, 5, 6), 1),
    (lambda: layers.DenseGeneral(4, axis=(-2, -1)), lambda: nn.DenseGeneral(4, axis=(-2, -1)),
     (2, 5, 2, 3), 2),
]


@pytest.mark.parametrize("ours, theirs, shape, k", CASES)
def test_same_parameters_values_and_gradients_as_flax_and_float64(ours, theirs, shape, k):
  x = jax.random.normal(jax.random.key(1), shape)
  params = ours().init(jax.random.key(0), x)
  flax_params = theirs().init(jax.random.key(0), x)
  assert jax.tree.structure(params) == jax.tree.structure(flax_params)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(flax_params)):
    np.testing.assert_array_equal(a, b)
  out_shape = theirs().apply(flax_params, x).shape
  weights = jax.random.normal(jax.random.key(2), out_shape)

  def loss(module):
    return lambda p, x: jnp.sum(weights * jnp.tanh(module.apply(p, x)))
  got = jax.grad(loss(ours()), argnums=(0, 1))(params, x)
  np.testing.assert_allclose(ours().apply(params, x), theirs().apply(params, x), rtol=1e-6,
                             atol=1e-6)
  # float64 reference: y = x . kernel (the input's trailing axes with the kernel's leading ones)
  kernel = np.asarray(params["params"]["kernel"], np.float64)
  bias = np.asarray(params["params"]["bias"], np.float64)
  x64, w64 = np.asarray(x, np.float64), np.asarray(weights, np.float64)
  axes = (list(range(x.ndim - k, x.ndim)), list(range(k)))
  y = np.tensordot(x64, kernel, axes) + bias
  g = w64 * (1 - np.tanh(y) ** 2)
  lead = list(range(x.ndim - k))
  np.testing.assert_allclose(got[0]["params"]["kernel"],
                             np.tensordot(x64, g, (lead, lead)), rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(got[0]["params"]["bias"], g.sum(axis=tuple(lead)), rtol=2e-5,
                             atol=2e-5)
  outer = kernel.ndim - k
  np.testing.assert_allclose(
      got[1], np.tensordot(g, kernel, (list(range(g.ndim - outer, g.ndim)),
                                       list(range(k, kernel.ndim)))), rtol=2e-5, atol=2e-5)


def test_only_trailing_axes_are_contracted_and_no_custom_dot():
  for axis in (0, (-1, -2)):
    with pytest.raises(ValueError, match="trailing axes only"):
      layers.DenseGeneral(4, axis=axis).init(jax.random.key(0), jnp.ones((2, 3, 5)))
  with pytest.raises(ValueError, match="for a custom dot_general"):
    layers.Dense(4, dot_general=lax.dot_general).init(jax.random.key(0), jnp.ones((2, 3)))


def test_a_stated_precision_is_flaxs_arithmetic():
  x = jax.random.normal(jax.random.key(1), (2, 5, 3))
  ours, theirs = (cls(4, precision=lax.Precision.HIGHEST) for cls in (layers.Dense, nn.Dense))
  params = theirs.init(jax.random.key(0), x)
  np.testing.assert_array_equal(ours.apply(params, x), theirs.apply(params, x))


def _large_ops(module, shape, op: str) -> list[str]:
  """The `op` instructions (transpose, reduce-window) in the compiled backward pass of `module`
  over an input of `shape`, given the output's gradient: those of at least as many elements
  as the input (transposes) or reading something that large (reduce-window trees)."""
  x = jnp.ones(shape)
  params = module.init(jax.random.key(0), x)
  g = jnp.ones(module.apply(params, x).shape)

  def backward(p, x, g):
    return jax.vjp(lambda p, x: module.apply(p, x), p, x)[1](g)
  # (with the seed model's XLA options: YNNPACK fusions off, configs/imdb_keras_example.py)
  text = jax.jit(backward, compiler_options={"xla_cpu_experimental_ynn_fusion_type": ""}).lower(
      params, x, g).compile().as_text()
  sizes = {name: int(np.prod([int(d) for d in dims.split(",") if d]))
           for name, dims in re.findall(r"%(\S+) = f32\[([\d,]*)\]", text)}
  found = []
  for name, dims, operand in re.findall(
      r"%(\S+) = f32\[([\d,]*)\]\S* " + re.escape(op) + r"\(%([^,)]+)", text):
    if max(sizes.get(name, 0), sizes.get(operand, 0)) >= np.prod(shape):
      found.append(f"{name} = {op}({operand})")
  return found


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's lowering")
def test_the_cpu_gradient_has_no_transposed_copy_and_no_reduce_window_tree():
  # The bugs it guards (the seed model's train step on a CPU): XLA:CPU wrote the [32, 200, 2, 16]
  # output gradient transposed to form the kernel gradient (a strided loop, ~0.1-0.35 ms each),
  # and summed the bias gradient over the 6,400 tokens by a tree of reduce-window operations.
  shape = (32, 200, 32)
  assert _large_ops(nn.DenseGeneral((2, 16)), shape, "transpose"), "flax's own no longer does"
  assert _large_ops(nn.DenseGeneral((2, 16)), shape, "reduce-window"), "flax's own no longer does"
  for module, x_shape in [(layers.DenseGeneral((2, 16)), shape), (layers.Dense(32), shape),
                          (layers.DenseGeneral(32, axis=(-2, -1)), (32, 200, 2, 16))]:
    assert _large_ops(module, x_shape, "transpose") == []
    assert _large_ops(module, x_shape, "reduce-window") == []
