"""quantize / dequantize: exactness, scale rounding, and edge cases for every format."""

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import c2jax_kernels as kernels

MX = {'mxfp8_e4m3': (ml_dtypes.float8_e4m3fn, 448.0, 3, 2.0**-9),
      'mxfp8_e5m2': (ml_dtypes.float8_e5m2, 57344.0, 2, 2.0**-16)}  # dtype, max, mantissa
                                                                    # bits, subnormal step


@functools.partial(jax.jit, static_argnames=('fmt', 'axis'))
def _roundtrip(x, fmt, axis):
  return kernels.dequantize(kernels.quantize(x, fmt, axis=axis))


def roundtrip(x, fmt, axis=-1):
  return np.asarray(_roundtrip(jnp.asarray(x), fmt, axis))


def representable_codes(rng, dtype, shape):
  """Random finite values of an FP8 dtype, subnormals included, as float32."""
  bits = rng.integers(0, 256, size=shape, dtype=np.uint8)
  values = bits.view(dtype).astype(np.float32)
  return np.where(np.isfinite(values), values, 0.0)


@pytest.mark.parametrize('fmt', sorted(MX))
def test_mx_roundtrip_is_exact_for_fp8_values_times_powers_of_two(fmt):
  dtype, _, _, _ = MX[fmt]
  rng = np.random.default_rng(0)
  codes = representable_codes(rng, dtype, (8, 4, 32))
  block_exponents = rng.integers(-30, 30, size=(8, 4, 1))
  x = (codes * np.exp2(block_exponents)).reshape(8, 128).astype(np.float32)
  np.testing.assert_array_equal(roundtrip(x, fmt), x)


@pytest.mark.parametrize('fmt', sorted(MX))
def test_mx_scale_is_rounded_up_and_error_is_half_an_ulp(fmt):
  _, value_max, mantissa_bits, subnormal_step = MX[fmt]
  rng = np.random.default_rng(1)
  x = (rng.standard_normal((16, 96)) * np.exp2(rng.integers(-40, 40, (16, 1)))).astype(
      np.float32)
  q = kernels.quantize(jnp.asarray(x), fmt)
  scales = np.asarray(q.scales.astype(jnp.float32))
  amax = np.abs(x).reshape(16, 3, 32).max(-1).astype(np.float64)
  np.testing.assert_array_equal(scales, np.exp2(np.ceil(np.log2(amax / value_max))))
  values = np.abs(np.asarray(q.values.astype(jnp.float32))).reshape(16, 3, 32).max(-1)
  assert np.all(values <= value_max) and np.all(values >= value_max / 2)  # RNE may land on it
  error = np.abs(roundtrip(x, fmt) - x)
  block_scale = np.repeat(scales, 32, axis=1)
  bound = np.maximum(np.abs(x) * 2.0**-(mantissa_bits + 1), subnormal_step / 2 * block_scale)
  assert np.all(error <= bound)


@pytest.mark.parametrize('fmt', sorted(kernels.BLOCK_FORMATS))
def test_zeros_and_partial_blocks(fmt):
  x = np.zeros((3, 70), np.float32)  # 70 is not a multiple of any block size
  x[1, 40:45] = [1.0, -2.0, 0.5, 3.0, -0.25]
  q = kernels.quantize(jnp.asarray(x), fmt)
  assert np.all(np.isfinite(np.asarray(q.scales.astype(jnp.float32))))
  out = roundtrip(x, fmt)
  assert out.shape == x.shape
  np.testing.assert_array_equal(out, x)  # all these values are exact in E2M1 too


@pytest.mark.parametrize('fmt', sorted(MX))
def test_mx_max_values(fmt):
  _, value_max, _, _ = MX[fmt]
  x = np.array([[value_max * 2.0**100, -value_max * 2.0**100] + [2.0**100] * 30,
                [-value_max, value_max / 2] + [1.0] * 30,
                [np.finfo(np.float32).max, -np.finfo(np.float32).max] + [0.0] * 30],
               np.float32)
  out = roundtrip(x, fmt)
  np.testing.assert_array_equal(out[:2], x[:2])
  # float32 max = (2 - 2^-23) * 2^127 rounds to the FP8 grid point 2^128: +-inf.
  np.testing.assert_array_equal(out[2, :2], [np.inf, -np.inf])


@pytest.mark.parametrize('fmt', sorted(kernels.BLOCK_FORMATS))
def test_float32_subnormal_inputs_flush_to_zero(fmt):
  x = np.full((1, 32), 1e-40, np.float32)  # subnormal in float32
  np.testing.assert_array_equal(roundtrip(x, fmt), np.zeros_like(x))


@pytest.mark.parametrize('fmt', sorted(kernels.BLOCK_FORMATS))
@pytest.mark.parametrize('bad', [np.nan, np.inf, -np.inf])
def test_non_finite_input_poisons_only_its_block(fmt, bad):
  block = kernels.BLOCK_FORMATS[fmt].block_size
  x = np.tile(np.array([1.5, -0.5, 3.0, 6.0], np.float32), (2, block))  # exact in E2M1 too
  x[0, 3] = bad
  out = roundtrip(x, fmt)
  assert np.all(np.isnan(out[0, :block]))
  np.testing.assert_array_equal(out[0, block:], x[0, block:])
  np.testing.assert_array_equal(out[1], x[1])


def test_nvfp4_exact_when_blocks_share_the_token_max():
  # E2M1 magnitudes; every block holds the row max 6*448*2^j, so the block scales are all
  # 448 (E4M3 max) and the per-token scale is exactly 2^j.
  e2m1 = np.array([6, 4, 3, 2, 1.5, 1, 0.5, 0, -6, -4, -3, -2, -1.5, -1, -0.5, 6], np.float32)
  rows = [np.tile(e2m1 * 448 * 2.0**j, 4) for j in (-20, 0, 17)]
  x = np.stack(rows)
  q = kernels.quantize(jnp.asarray(x), 'nvfp4')
  np.testing.assert_array_equal(np.asarray(q.token_scales)[:, 0], [2.0**-20, 1.0, 2.0**17])
  np.testing.assert_array_equal(roundtrip(x, 'nvfp4'), x)


def test_nvfp4_block_scales_round_up_and_bound_the_error():
  rng = np.random.default_rng(2)
  x = (rng.standard_normal((8, 64)) * np.exp2(rng.integers(-5, 5, (8, 4)).repeat(16, 1)))
  x = x.astype(np.float32)
  q = kernels.quantize(jnp.asarray(x), 'nvfp4')
  token = np.asarray(q.token_scales)
  block = np.asarray(q.scales.astype(jnp.float32))
  wanted = np.abs(x).reshape(8, 4, 16).max(-1) / (6 * token)
  below = np.asarray(jnp.asarray(block).astype(jnp.float8_e4m3fn).view(jnp.uint8) - 1
                     ).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
  assert np.all(block >= wanted * (1 - 1e-6)) and np.all(below < wanted)
  assert np.all(np.abs(np.asarray(q.values.astype(jnp.float32))) <= 6)
  step = np.repeat(block * token, 16, axis=1)
  error = np.abs(roundtrip(x, 'nvfp4') - x)
  assert np.all(error <= np.maximum(0.25 * np.abs(x), 0.25 * step) * (1 + 1e-6))


def test_axis_and_pytree():
  x = jax.random.normal(jax.random.key(0), (64, 5))
  q0 = kernels.quantize(x, 'mxfp8_e4m3', axis=0)
  q1 = kernels.quantize(x.T, 'mxfp8_e4m3', axis=-1)
  np.testing.assert_array_equal(np.asarray(q0.values, np.float32),
                                np.asarray(q1.values, np.float32))
  assert q0.values.shape == (5, 64) and q0.scales.shape == (5, 2)
  out = jax.jit(kernels.dequantize)(q0)
  assert out.shape == x.shape and out.dtype == x.dtype
  assert len(jax.tree_util.tree_leaves(q0)) == 2  # values, scales (no token scales)
  with pytest.raises(ValueError, match='Unknown block-scaled format'):
    kernels.quantize(x, 'mxfp6')
