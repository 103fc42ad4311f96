"""c2jax.quant: the recipe registry the model's matmuls go through."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax import quant
import c2jax_kernels as kernels


def test_registry_names_follow_the_kernels():
  assert set(quant.RECIPES) == {'none', *kernels.BLOCK_SCALED_RECIPES}
  assert {'none', 'mxfp8', 'nvfp4_fwd_mxfp8_bwd'} <= set(quant.RECIPES)
  with pytest.raises(ValueError, match='config.quant'):
    quant.check_recipe('int8')


@functools.partial(jax.jit, static_argnames='recipe')
def dot_and_grads(x, w, *, recipe):
  return jax.value_and_grad(lambda x, w: jnp.sum(quant.dot(recipe, x, w) ** 2),
                            argnums=(0, 1))(x, w)


def test_dot_recipes_track_the_exact_product():
  x = jax.random.normal(jax.random.key(0), (2, 8, 64))
  w = jax.random.normal(jax.random.key(1), (64, 32)) / 8
  exact_loss, (exact_dx, exact_dw) = dot_and_grads(x, w, recipe='none')
  np.testing.assert_allclose(exact_loss, jnp.sum((x @ w) ** 2), rtol=1e-5)
  # Gradients compound two quantised GEMMs (dy = 2y already carries the forward's error).
  for recipe, loss_tol, grad_tol in (('mxfp8', 0.05, 0.1), ('nvfp4_fwd_mxfp8_bwd', 0.3, 0.4)):
    loss, (dx, dw) = dot_and_grads(x, w, recipe=recipe)
    assert loss != exact_loss  # it really quantised
    np.testing.assert_allclose(loss, exact_loss, rtol=loss_tol)
    for got, want in ((dx, exact_dx), (dw, exact_dw)):
      assert float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want)) < grad_tol


def test_grouped_dot_none_is_grouped_matmul_and_mxfp8_is_close():
  lhs = jax.random.normal(jax.random.key(2), (96, 64))
  rhs = jax.random.normal(jax.random.key(3), (3, 64, 32)) / 8
  sizes = jnp.array([40, 0, 50], jnp.int32)
  plain = quant.grouped_dot('none', lhs, rhs, sizes, impl='ragged_dot')
  want = kernels.grouped_matmul(lhs, rhs, sizes, impl='reference')
  np.testing.assert_allclose(plain, want, rtol=1e-5, atol=1e-5)
  low = quant.grouped_dot('mxfp8', lhs, rhs, sizes, impl='ragged_dot')
  rel = float(jnp.linalg.norm(low - want) / jnp.linalg.norm(want))
  assert 0 < rel < 0.05
  assert not np.any(np.asarray(low[90:]))
