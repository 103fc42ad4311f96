"""Fused FP8 grouped GEMMs (kernels/block_scaled/hopper_grouped.py, fused_grouped.py) in
Mosaic GPU interpret mode with race detection, against the float64 reference.

The kernels accumulate in FP32 over operands that are exactly the quantised values, so
they must match float64 arithmetic on the same dequantised operands to FP32 rounding
(1e-5 of the largest output), while the unquantised product is ~3e-2 away: a kernel that
skipped or misapplied a scale, dropped a group or leaked rows across groups fails.
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

import c2jax_kernels as kernels
from c2jax_kernels.block_scaled import formats
from c2jax_kernels.block_scaled import fused_grouped
from c2jax_kernels.block_scaled import fused_reference
from c2jax_kernels.block_scaled import grouped
from c2jax_kernels.block_scaled import hopper_grouped

RACES = plgpu.InterpretGPUParams(detect_races=True)  # on_race='raise'
FMT = 'mxfp8_e4m3'


def _close(got, ref):
  np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=0,
                             atol=1e-5 * float(np.abs(ref).max()))


def _dq(q):
  return np.asarray(formats.dequantize(q), np.float64)


def _ranges(sizes):
  ends = np.cumsum(sizes)
  return list(zip(ends - sizes, ends))


def test_fp8_gmm_skewed_and_empty_groups_rows_past_sum_zero():
  rng = np.random.default_rng(0)
  rows, k, p = 128, 64, 64
  # Empty first, middle and last groups; group 1 straddles the two row tiles; 18 rows past
  # the sum must come out zero. Expert 4 (empty) and expert 3 (rows 90..109, sharing a tile
  # with group 1) hold an inf: a NaN block scale, which must stay inside their own rows.
  sizes = np.array([0, 90, 0, 20, 0], np.int32)
  x = rng.normal(size=(rows, k)).astype(np.float32)
  w = rng.normal(size=(len(sizes), k, p)).astype(np.float32)
  w[3, 5, 7] = w[4, 40, 3] = np.inf
  xq, wq = formats.quantize(x, FMT, axis=1), formats.quantize(w, FMT, axis=1)
  out = np.asarray(hopper_grouped.fp8_gmm(xq.values, xq.scales, wq.values, wq.scales,
                                          jnp.asarray(sizes), interpret=RACES))
  ref = np.zeros((rows, p))
  for g, (start, end) in enumerate(_ranges(sizes)):
    ref[start:end] = _dq(xq)[start:end] @ _dq(wq)[g]
  assert np.isnan(out[90:110, 7]).all() and np.isnan(ref[90:110, 7]).all()
  finite = ~np.isnan(ref)
  assert np.isfinite(out[finite]).all()
  np.testing.assert_allclose(out[finite], ref[finite], rtol=0,
                             atol=1e-5 * np.abs(ref[finite]).max())
  assert not out[sizes.sum():].any()
  # The FP8 result is the quantised product, far from the float32 one.
  assert np.abs(np.asarray(out)[:90] - x[:90] @ w[1]).max() > 1e-2


def test_fp8_tgmm_groups_straddle_scale_blocks_and_empty_groups_are_zero():
  rng = np.random.default_rng(1)
  tokens, k, n = 100, 64, 64
  sizes = np.array([45, 0, 40, 5, 0], np.int32)  # boundaries inside 32-token blocks
  x = rng.normal(size=(tokens, k)).astype(np.float32)
  dy = rng.normal(size=(tokens, n)).astype(np.float32)
  xq, dq = formats.quantize(x, FMT, axis=0), formats.quantize(dy, FMT, axis=0)
  out = hopper_grouped.fp8_tgmm(xq.values, xq.scales, dq.values, dq.scales,
                                jnp.asarray(sizes), interpret=RACES)
  ref = np.zeros((len(sizes), k, n))
  for g, (start, end) in enumerate(_ranges(sizes)):
    ref[g] = _dq(xq)[start:end].T @ _dq(dq)[start:end]
  _close(out, ref)
  assert not np.asarray(out)[[1, 4]].any()


def test_kernels_reject_non_fp8_operands():
  x = jnp.zeros((64, 32), jnp.bfloat16)
  with pytest.raises(ValueError, match='float8_e4m3fn lhs'):
    hopper_grouped.fp8_gmm(x, jnp.ones((64, 1)), jnp.zeros((1, 64, 32), jnp.float8_e4m3fn),
                           jnp.ones((1, 64, 1)), jnp.array([64]), interpret=True)


# One dispatch problem (top-2 of 4 experts, two experts empty, odd feature sizes that the
# wrapper pads), run once under jit: forward and both gradients.
T, TOP_K, K, N = 24, 2, 48, 40


@pytest.fixture(scope='module')
def dispatch_problem():
  rng = np.random.default_rng(2)
  experts = np.array([1, 3])[rng.integers(0, 2, size=T * TOP_K)]  # experts 0, 2 empty
  experts[:7] = 3  # skew: expert 3 takes most copies
  order = np.argsort(experts, kind='stable')
  sizes = np.bincount(experts, minlength=4).astype(np.int32)
  x = rng.normal(size=(T, K)).astype(np.float32)
  w = rng.normal(size=(4, K, N)).astype(np.float32)
  dout = rng.normal(size=(T * TOP_K, N)).astype(np.float32)
  rows = order // TOP_K

  @jax.jit
  def run(x, w, dout):
    f = lambda x, w: fused_grouped.fused_grouped_matmul(
        x, w, jnp.asarray(sizes), rows=jnp.asarray(rows), interpret=RACES)
    out, vjp = jax.vjp(f, x, w)
    return out, *vjp(dout)

  got = run(x, w, dout)
  ref = (fused_reference.forward(x, w, sizes, rows),
         *fused_reference.backward(x, w, sizes, dout, rows))
  return dict(got=got, ref=ref, x=x, w=w, rows=rows, sizes=sizes)


def test_fused_forward_quantises_tokens_before_dispatch(dispatch_problem):
  p = dispatch_problem
  assert p['sizes'][0] == p['sizes'][2] == 0 and p['sizes'][3] > p['sizes'][1] > 0
  _close(p['got'][0], p['ref'][0])
  # Really FP8: the unquantised product differs by far more than FP32 rounding.
  plain = np.zeros_like(p['ref'][0])
  ends = np.cumsum(p['sizes'])
  for g, (start, end) in enumerate(zip(ends - p['sizes'], ends)):
    plain[start:end] = p['x'][p['rows'][start:end]] @ p['w'][g]
  assert np.abs(plain - np.asarray(p['got'][0])).max() > 1e-2


def test_fused_input_gradient_scatters_to_tokens(dispatch_problem):
  _close(dispatch_problem['got'][1], dispatch_problem['ref'][1])


def test_fused_weight_gradient_per_group_empty_groups_zero(dispatch_problem):
  p = dispatch_problem
  _close(p['got'][2], p['ref'][2])
  assert not np.asarray(p['got'][2])[[0, 2]].any()


def test_default_grouped_path_by_device_generation():
  gpu = lambda cc: types.SimpleNamespace(platform='gpu', compute_capability=cc)
  cpu = types.SimpleNamespace(platform='cpu')
  assert grouped.default_grouped_path('mxfp8', gpu('9.0')) == 'hopper_fused'
  assert grouped.default_grouped_path('nvfp4_fwd_mxfp8_bwd', gpu('9.0')) == 'dequantize'
  assert grouped.default_grouped_path('mxfp8', gpu('10.0')) == 'dequantize'
  assert grouped.default_grouped_path('mxfp8', cpu) == 'dequantize'


def test_fused_path_refuses_recipes_it_does_not_implement():
  with pytest.raises(ValueError, match="recipe 'mxfp8' only"):
    kernels.block_scaled_grouped_matmul(
        jnp.zeros((8, 32)), jnp.zeros((2, 32, 64)), jnp.array([4, 4]),
        recipe='nvfp4_fwd_mxfp8_bwd', path='hopper_fused')


def test_dequantize_path_with_rows_matches_float64_reference():
  # The portable reference path takes the same `rows` contract as the fused path.
  rng = np.random.default_rng(3)
  x = rng.normal(size=(6, 32)).astype(np.float32)
  w = rng.normal(size=(3, 32, 16)).astype(np.float32)
  rows, sizes = np.array([5, 0, 0, 2, 4, 1, 3]), np.array([3, 0, 4], np.int32)
  out = kernels.block_scaled_grouped_matmul(jnp.asarray(x), jnp.asarray(w), jnp.asarray(sizes),
                                            rows=jnp.asarray(rows), path='dequantize',
                                            impl='ragged_dot')
  _close(out, fused_reference.forward(x, w, sizes, rows))


def test_fused_grouped_matmul_names_bad_arguments():
  lhs, rhs, sizes = jnp.zeros((8, 32)), jnp.zeros((2, 32, 64)), jnp.array([4, 4])
  with pytest.raises(ValueError, match=r'need rhs \[len\(group_sizes\), 32, N\]'):
    fused_grouped.fused_grouped_matmul(lhs, jnp.zeros((3, 32, 64)), sizes)
  with pytest.raises(ValueError, match='rows must be a 1-D integer array'):
    fused_grouped.fused_grouped_matmul(lhs, rhs, sizes, rows=jnp.zeros((8,)))
  with pytest.raises(ValueError, match=r'expects lhs \[M, K\]'):
    fused_grouped.fused_grouped_matmul(lhs[None], rhs, sizes)
