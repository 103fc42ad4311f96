"""The 'gathered' MoE dispatch (few-token calls such as decode steps) against the dense
reference, forward and gradients, and the one function that picks it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.model import moe_dispatch

T, D, F, E, K = 3, 8, 6, 8, 2


def _inputs():
  keys = jax.random.split(jax.random.key(0), 5)
  x = jax.random.normal(keys[0], (T, D))
  experts = moe_dispatch.ExpertWeights(*(0.3 * jax.random.normal(k, s) for k, s in zip(
      keys[1:4], [(E, D, F), (E, D, F), (E, F, D)])))
  weights = jax.nn.softmax(jax.random.normal(keys[4], (T, K)), axis=-1)
  indices = jnp.asarray([[1, 5], [5, 5], [0, 7]], jnp.int32)  # a duplicate (replay) too
  return x, weights, indices, experts


def test_gathered_matches_dense_forward_and_gradients():
  x, weights, indices, experts = _inputs()

  def loss(impl, x, weights, experts):
    y = moe_dispatch.DISPATCH[impl](x, weights, indices, experts)
    return jnp.sum(y * jnp.arange(D)), y

  (_, y), grads = jax.value_and_grad(loss, argnums=(1, 2, 3), has_aux=True)(
      "gathered", x, weights, experts)
  (_, y_ref), grads_ref = jax.value_and_grad(loss, argnums=(1, 2, 3), has_aux=True)(
      "dense", x, weights, experts)
  np.testing.assert_allclose(y, y_ref, atol=1e-5)
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref)):
    np.testing.assert_allclose(got, want, atol=1e-5)
  # Untouched experts get no gradient.
  unused = [e for e in range(E) if e not in np.asarray(indices)]
  np.testing.assert_array_equal(np.asarray(grads[2].gate_ExDxF)[unused], 0)


def test_select_gathers_only_for_few_unquantised_tokens():
  assert moe_dispatch.select("ragged", "none", 4, 2, 8) is moe_dispatch.gathered
  assert moe_dispatch.select("ragged", "none", 5, 2, 8) is moe_dispatch.ragged
  assert moe_dispatch.select("dense", "mxfp8", 1, 2, 8) is moe_dispatch.dense
  x, weights, indices, experts = _inputs()
  with pytest.raises(ValueError, match="gathered"):
    moe_dispatch.gathered(x, weights, indices, experts, quant="mxfp8")
