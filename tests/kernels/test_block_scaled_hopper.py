"""The Hopper FP8 path (scale promotion) against float64 references and the portable path."""

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import c2jax_kernels as kernels
from c2jax_kernels.block_scaled import hopper
from c2jax_kernels.block_scaled import matmul
from test_block_scaled_matmul import fake_quant, forward_and_grads

# float32 unit roundoff: a K-term float32 sum of exact products errs by at most ~K * U
# times the sum of the terms' magnitudes (plus one rounding per promoted block).
U = 2.0**-24


@functools.partial(jax.jit, static_argnames='recipe')
def dequantized_operands(a_MxK, b_KxN, dy_MxN, *, recipe):
  """Each GEMM's operands, quantised along that GEMM's contraction and dequantised."""
  fwd = kernels.BLOCK_SCALED_RECIPES[recipe].forward
  bwd = kernels.BLOCK_SCALED_RECIPES[recipe].backward
  return ((fake_quant(a_MxK, fwd, 1), fake_quant(b_KxN, fwd, 0)),
          (fake_quant(dy_MxN, bwd, 1), fake_quant(b_KxN, bwd, 1).T),
          (fake_quant(a_MxK, bwd, 0).T, fake_quant(dy_MxN, bwd, 0)))


def assert_within_float32_accumulation(got, lhs, rhs, name):
  """|got - lhs @ rhs| <= 2 (C + 8) U (|lhs| @ |rhs|), the reference in float64."""
  lhs, rhs = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
  want = lhs @ rhs
  bound = 2 * (lhs.shape[1] + 8) * U * (np.abs(lhs) @ np.abs(rhs))
  err = np.abs(np.asarray(got, np.float64) - want)
  worst = np.unravel_index(np.argmax(err - bound), err.shape)
  assert np.all(err <= bound), (name, worst, err[worst], bound[worst], want[worst])


def operands(case, seed):
  m, k, n = 10, 70, 24  # no dimension a multiple of a 32-block: every axis is padded
  ks = jax.random.split(jax.random.key(seed), 4)
  a = jax.random.normal(ks[0], (m, k))
  b = jax.random.normal(ks[1], (k, n))
  dy = jax.random.normal(ks[2], (m, n))
  if case == 'zeros':
    a = jnp.zeros_like(a)
  elif case == 'large':
    # Scale exponents near both ends of the clamp: ~2^100 and ~2^-83.
    a, b = a * 1e30, b * 1e-25
  elif case == 'mixed':
    # Magnitudes spread over 2^-40 .. 2^40 element by element: blocks get very different
    # scales and many values sit in E4M3's subnormal range inside their block.
    a = a * 2.0**jax.random.randint(ks[3], a.shape, -40, 41).astype(jnp.float32)
  return a, b, dy


@pytest.mark.parametrize('recipe', sorted(kernels.BLOCK_SCALED_RECIPES))
@pytest.mark.parametrize('case', ['random', 'zeros', 'large', 'mixed'])
def test_forward_and_grads_match_float64_and_portable_path(case, recipe):
  a, b, dy = operands(case, seed=len(case) + len(recipe))
  got = forward_and_grads(a, b, dy, recipe=recipe, path='hopper_fp8')
  portable = forward_and_grads(a, b, dy, recipe=recipe, path='dequantize')
  gemms = dequantized_operands(a, b, dy, recipe=recipe)
  for name, g, p, (lhs, rhs) in zip(('y', 'da', 'db'), got, portable, gemms):
    assert np.all(np.isfinite(g)), name
    # Both paths within float32 accumulation error of the same exact (float64) product.
    assert_within_float32_accumulation(g, lhs, rhs, name)
    assert_within_float32_accumulation(p, lhs, rhs, name + ' portable')
  if case == 'zeros':
    assert not np.any(np.asarray(got[0])) and not np.any(np.asarray(got[2]))
    assert np.any(np.asarray(got[1]))


@functools.partial(jax.jit, static_argnames=('fmt', 'blocks_per_step'))
def promoted(x_MxC, w_PxC, *, fmt, blocks_per_step):
  return hopper.fp8_promoted_gemm(kernels.quantize(x_MxC, fmt), kernels.quantize(w_PxC, fmt),
                                  blocks_per_step=blocks_per_step)


@pytest.mark.parametrize('fmt,per_step', [('mxfp8_e4m3', 2), ('nvfp4', 3)])
def test_scan_over_block_groups_pads_with_zero_blocks(fmt, per_step):
  # C = 150 -> 5 MXFP8 blocks (10 NVFP4 blocks): steps of 2 (3) blocks end in a padded step.
  ks = jax.random.split(jax.random.key(7), 2)
  x = jax.random.normal(ks[0], (6, 150)).at[2, 40].set(jnp.nan)
  w = jax.random.normal(ks[1], (9, 150))
  one_step = promoted(x, w, fmt=fmt, blocks_per_step=None)
  got = promoted(x, w, fmt=fmt, blocks_per_step=per_step)
  # A NaN input poisons its block's scale, hence its output row, and nothing else.
  assert np.all(np.isnan(got[2])) and np.all(np.isfinite(np.delete(got, 2, axis=0)))
  finite = np.delete(np.arange(6), 2)
  assert_within_float32_accumulation(got[finite], fake_quant(x, fmt, 1)[finite],
                                     fake_quant(w, fmt, 1).T, f'G={per_step}')
  np.testing.assert_allclose(got[finite], one_step[finite], rtol=1e-5, atol=1e-5)


def dot_operand_dtypes(jaxpr):
  """(lhs dtype, rhs dtype, preferred type) of every dot_general, sub-jaxprs included."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'dot_general':
      found.append((*(str(v.aval.dtype) for v in eqn.invars),
                    str(eqn.params['preferred_element_type'])))
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        if hasattr(sub, 'eqns'):
          found += dot_operand_dtypes(sub)
        elif hasattr(sub, 'jaxpr') and hasattr(sub.jaxpr, 'eqns'):
          found += dot_operand_dtypes(sub.jaxpr)
  return found


@pytest.mark.parametrize('recipe', sorted(kernels.BLOCK_SCALED_RECIPES))
def test_every_gemm_is_an_fp8_dot_with_float32_output(recipe):
  a, b, dy = operands('random', seed=3)
  fn = functools.partial(forward_and_grads.__wrapped__, recipe=recipe, path='hopper_fp8')
  dots = dot_operand_dtypes(jax.make_jaxpr(fn)(a, b, dy).jaxpr)
  # Forward and both gradient GEMMs; NVFP4's E2M1 values are fed to E4M3 tensor cores.
  assert len(dots) == 3, dots
  assert set(dots) == {('float8_e4m3fn', 'float8_e4m3fn', 'float32')}, dots


def test_default_path_follows_the_gpu_generation():
  gpu = lambda cc: types.SimpleNamespace(platform='gpu', compute_capability=cc)
  assert matmul.default_path(gpu('9.0')) == 'hopper_fp8'
  assert matmul.default_path(gpu('10.0')) == 'scaled_matmul'
  assert matmul.default_path(gpu('8.0')) == 'dequantize'
  assert matmul.default_path(gpu('gfx90a')) == 'dequantize'
  assert matmul.default_path(types.SimpleNamespace(platform='tpu')) == 'dequantize'
  assert matmul.default_path() == 'dequantize'  # this CPU


def test_mismatched_operands_are_rejected_with_advice():
  # Shapes only (eval_shape): the check happens before any computation.
  quant = lambda shape, fmt: jax.eval_shape(
      functools.partial(kernels.quantize, fmt=fmt), jax.ShapeDtypeStruct(shape, jnp.float32))
  x = quant((4, 64), 'mxfp8_e4m3')
  with pytest.raises(ValueError, match='same format'):
    hopper.fp8_promoted_gemm(x, quant((4, 64), 'nvfp4'))
  with pytest.raises(ValueError, match='same format'):
    hopper.fp8_promoted_gemm(x, quant((4, 96), 'mxfp8_e4m3'))
