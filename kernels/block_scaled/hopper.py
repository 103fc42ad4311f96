"""Hopper FP8 path: one FP8 x FP8 -> FP32 GEMM per scale block, promoted to FP32.

Legend: M rows of the left operand, P rows of the right operand as stored (output columns),
C the contraction (zero-padded to Cp = NB * B), B the format's block size (32 for MXFP8,
16 for NVFP4), NB blocks along C, G blocks per scan step, S scan steps (NB padded to S * G).

Both operands come quantised along C (formats.QuantizedArray, C last), so every block of B
contraction elements carries one scale per row of each operand:
  out[m, p] = t_l[m] t_r[p] sum_nb s_l[m, nb] s_r[p, nb] sum_b v_l[m, nb, b] v_r[p, nb, b]
The inner sum is an FP8 x FP8 dot with FP32 output (`lax.dot_general` on float8_e4m3fn,
batched over blocks, contraction minor on both sides: the "TN" layout XLA's GPU GEMM
rewriter hands to cuBLASLt's FP8 GEMMs on Hopper). Its FP32 result is scaled and summed
in FP32 outside the tensor core: the "scale promotion" of DeepSeek-V3 (report §3.3.2),
which also keeps the tensor core's reduced-precision FP8 accumulator (about 14 mantissa
bits on H800 per that report) from ever summing more than B products. Because each block's
scale is constant inside its block, the result equals the dequantise-then-matmul path up
to FP32 summation order; no regrouping or requantisation of values happens here.

Only G blocks of FP32 partial products [G, M, P] live at once (a scan over S steps keeps
the working set under _STEP_BYTES); per-token scales (NVFP4) are constant along C and are
applied once at the end. Hopper has no FP4 tensor cores, so E2M1 values are fed as E4M3,
which represents every E2M1 value exactly.
"""

import jax
import jax.numpy as jnp

from c2jax_kernels.block_scaled import formats

# FP32 partial products [G, M, P] held per scan step: bounds the extra memory of promotion.
_STEP_BYTES = 1 << 30


def _dot_dtype(value_dtype):
  return jnp.dtype(jnp.float8_e4m3fn) if value_dtype == jnp.float4_e2m1fn else value_dtype


def _blocks_first(q):
  """FP8 values [NB, R, B] and float32 block scales [NB, R] of a C-last QuantizedArray."""
  block = formats.get_format(q.fmt).block_size
  rows, num_blocks = q.scales.shape
  values_RxNBxB = q.values.astype(_dot_dtype(q.values.dtype)).reshape(rows, num_blocks, block)
  return values_RxNBxB.transpose(1, 0, 2), q.scales.astype(jnp.float32).T


def _steps(x_NBx, steps, per_step):
  """[NB, ...] -> [S, G, ...], padding with zero blocks (zero values, zero scales: they add
  exactly nothing, even next to NaN scales elsewhere)."""
  pad = steps * per_step - x_NBx.shape[0]
  x_NBx = jnp.pad(x_NBx, [(0, pad)] + [(0, 0)] * (x_NBx.ndim - 1))
  return x_NBx.reshape(steps, per_step, *x_NBx.shape[1:])


def fp8_promoted_gemm(lhs_q, rhs_q, *, blocks_per_step=None):
  """float32 [M, P] = lhs . rhs^T over C for two C-last QuantizedArrays of one format.

  blocks_per_step: G, the blocks contracted per scan step; None picks the largest G whose
  FP32 partials [G, M, P] fit in _STEP_BYTES.
  """
  if lhs_q.fmt != rhs_q.fmt or lhs_q.values.shape[-1] != rhs_q.values.shape[-1]:
    raise ValueError(f"fp8_promoted_gemm needs both operands in one format over one padded "
                     f"contraction; got {lhs_q.fmt} {lhs_q.values.shape} and {rhs_q.fmt} "
                     f"{rhs_q.values.shape}. Quantise both along the contracted axis with "
                     f"the same format.")
  if lhs_q.values.ndim != 2 or rhs_q.values.ndim != 2:
    raise ValueError(f"fp8_promoted_gemm takes 2-D operands; got values of shapes "
                     f"{lhs_q.values.shape} and {rhs_q.values.shape}.")
  values_l_NBxMxB, scales_l_NBxM = _blocks_first(lhs_q)
  values_r_NBxPxB, scales_r_NBxP = _blocks_first(rhs_q)
  num_blocks, m, _ = values_l_NBxMxB.shape
  p = values_r_NBxPxB.shape[1]
  per_step = blocks_per_step or max(1, min(num_blocks, _STEP_BYTES // max(1, 4 * m * p)))
  steps = -(-num_blocks // per_step)

  def promote_step(acc_MxP, step_inputs):
    values_l_GxMxB, values_r_GxPxB, scales_l_GxM, scales_r_GxP = step_inputs
    # One FP8 GEMM per block (batch axis G), each accumulating only B products.
    partial_GxMxP = jax.lax.dot_general(
        values_l_GxMxB, values_r_GxPxB, dimension_numbers=(((2,), (2,)), ((0,), (0,))),
        preferred_element_type=jnp.float32)
    promoted_GxMxP = partial_GxMxP * scales_l_GxM[:, :, None] * scales_r_GxP[:, None, :]
    return acc_MxP + promoted_GxMxP.sum(axis=0), None

  step_inputs = tuple(_steps(x, steps, per_step) for x in (
      values_l_NBxMxB, values_r_NBxPxB, scales_l_NBxM, scales_r_NBxP))
  out_MxP, _ = jax.lax.scan(promote_step, jnp.zeros((m, p), jnp.float32), step_inputs)
  if lhs_q.token_scales is not None:
    out_MxP = out_MxP * lhs_q.token_scales
  if rhs_q.token_scales is not None:
    out_MxP = out_MxP * rhs_q.token_scales.T
  return out_MxP
