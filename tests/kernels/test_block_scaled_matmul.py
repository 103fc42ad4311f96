"""block_scaled_matmul and its grouped variant: forward and requantised gradients."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import c2jax_kernels as kernels
from c2jax_kernels.grouped_matmul import reference

M, K, N = 48, 96, 40


def fake_quant(x, fmt, axis):
  return kernels.dequantize(kernels.quantize(x, fmt, axis=axis), dtype=jnp.float32)


@functools.partial(jax.jit, static_argnames=('recipe', 'path'))
def forward_and_grads(a, b, dy, *, recipe, path):
  y, vjp = jax.vjp(functools.partial(kernels.block_scaled_matmul, recipe=recipe, path=path),
                   a, b)
  return (y, *vjp(dy))


@functools.partial(jax.jit, static_argnames='recipe')
def expected(a, b, dy, *, recipe):
  """Each GEMM on operands quantised along its own contraction axis."""
  fwd, bwd = kernels.BLOCK_SCALED_RECIPES[recipe].forward, kernels.BLOCK_SCALED_RECIPES[
      recipe].backward
  hi = jax.lax.Precision.HIGHEST
  y = jnp.dot(fake_quant(a, fwd, 1), fake_quant(b, fwd, 0), precision=hi)
  da = jnp.dot(fake_quant(dy, bwd, 1), fake_quant(b, bwd, 1).T, precision=hi)
  db = jnp.dot(fake_quant(a, bwd, 0).T, fake_quant(dy, bwd, 0), precision=hi)
  return y, da, db


def random_operands(seed):
  ks = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(ks[0], (M, K)), jax.random.normal(ks[1], (K, N)),
          jax.random.normal(ks[2], (M, N)))


@pytest.mark.parametrize('path', sorted(kernels.block_scaled.PATHS))
@pytest.mark.parametrize('recipe', sorted(kernels.BLOCK_SCALED_RECIPES))
def test_gemms_use_operands_requantised_along_their_contraction(recipe, path):
  a, b, dy = random_operands(0)
  got = forward_and_grads(a, b, dy, recipe=recipe, path=path)
  want = expected(a, b, dy, recipe=recipe)
  for name, g, w in zip(('y', 'da', 'db'), got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4, err_msg=name)
  # The recipe's accuracy against the exact product: MXFP8 ~2^-4 per element, NVFP4 ~2^-2.
  exact = a @ b
  rel = float(jnp.linalg.norm(got[0] - exact) / jnp.linalg.norm(exact))
  assert rel < (0.05 if recipe == 'mxfp8' else 0.15), rel
  assert rel > 0  # it really quantised


def test_leading_axes_ragged_contraction_and_dtype():
  a = jax.random.normal(jax.random.key(1), (2, 3, 70)).astype(jnp.bfloat16)
  b = jax.random.normal(jax.random.key(2), (70, 24)).astype(jnp.bfloat16)
  y, want = jax.jit(lambda a, b: (
      kernels.block_scaled_matmul(a, b, recipe='mxfp8', path='dequantize'),
      jnp.dot(fake_quant(a.reshape(6, 70), 'mxfp8_e4m3', 1),
              fake_quant(b, 'mxfp8_e4m3', 0)).reshape(2, 3, 24)))(a, b)
  assert y.shape == (2, 3, 24) and y.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(y, np.float32), want, rtol=1e-2, atol=1e-2)
  with pytest.raises(ValueError, match='Unknown block-scaled recipe'):
    kernels.block_scaled_matmul(a, b, recipe='fp8_delayed')
  with pytest.raises(ValueError, match='path'):
    kernels.block_scaled_matmul(a, b, path='tcgen05')


@pytest.mark.parametrize('impl', ['ragged_dot', 'mosaic_gpu'])
def test_block_scaled_grouped_matmul(impl):
  m, k, n = 160, 128, 64
  sizes = jnp.array([50, 0, 37, 60], jnp.int32)  # sum 147 < m, groups straddle tiles
  ks = jax.random.split(jax.random.key(3), 3)
  lhs = jax.random.normal(ks[0], (m, k))
  rhs = jax.random.normal(ks[1], (4, k, n)) / np.sqrt(k)
  dout = jax.random.normal(ks[2], (m, n))
  fn = functools.partial(kernels.block_scaled_grouped_matmul, recipe='mxfp8', impl=impl)

  @jax.jit
  def got_and_want(lhs, rhs, dout):
    out, vjp = jax.vjp(lambda x, w: fn(x, w, sizes), lhs, rhs)
    fmt = 'mxfp8_e4m3'
    gmm = functools.partial(reference.gmm, out_dtype=jnp.float32)
    want = (gmm(fake_quant(lhs, fmt, 1), fake_quant(rhs, fmt, 1), sizes, transpose_rhs=False),
            gmm(fake_quant(dout, fmt, 1), fake_quant(rhs, fmt, 2), sizes, transpose_rhs=True),
            reference.tgmm(fake_quant(lhs, fmt, 0), fake_quant(dout, fmt, 0), sizes,
                           out_dtype=jnp.float32))
    return (out, *vjp(dout)), want

  (out, dlhs, drhs), (want_out, want_dlhs, want_drhs) = got_and_want(lhs, rhs, dout)
  for name, g, w in (('out', out, want_out), ('dlhs', dlhs, want_dlhs),
                     ('drhs', drhs, want_drhs)):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4, err_msg=name)
  assert not np.any(np.asarray(out[147:]))
