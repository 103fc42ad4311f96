"""`fused_grouped_matmul`: MXFP8 MoE expert GEMMs on FP8 tensor cores, scales in-kernel.

Legend: T tokens before dispatch, M token copies sorted by group, K contraction, N output
features, G groups. rows_M[m] is the token behind copy m (None: lhs is already [M, K]).

Tokens are quantised to MXFP8 BEFORE dispatch: lhs [T, K] is quantised once per token
(T rows, not M = T * top_k copies), and the dispatch gather moves FP8 values plus one E8M0
scale per 32 (about half the bytes of bf16). Row-wise quantisation commutes with the
gather, so this equals gathering then quantising. The GEMMs (straight-through VJP, each
operand quantised along its own contraction axis, as grouped.py):
  forward  out  = fp8_gmm(x, W)         x along K (per token), W[g] along K
  backward dlhs = fp8_gmm(dout, W^T)    dout along N, W[g] along N; scatter-added to T
           drhs = fp8_tgmm(x, dout)     x along M, dout along M (the sorted copies)
Kernels: grouped.py's path 'hopper_fused' runs the Pallas Mosaic GPU kernels of hopper_grouped.py
(WGMMA on sm_90; Mosaic GPU interpret mode on CPU, for tests). The portable reference is
grouped.py's dequantise path, which computes the same math with a float grouped GEMM, and
fused_reference.py, the same in float64 numpy.

Blackwell (sm_100, MXFP8 and NVFP4 forward): not built. This jax (0.12.0) exposes the
hardware primitive, `plgpu.tcgen05_mma(acc, a, b, a_scale=, b_scale=)` with TMEM scale
refs filled by `plgpu.async_copy_scales_to_tmem` (jax/_src/pallas/mosaic_gpu/
primitives.py), but its CPU simulation is missing, so a kernel could not be verified here:
Mosaic GPU interpret mode's `TcGen05Mma.__call__` (interpret/gpu_callbacks.py) asserts
`a_scale_key is None` ("TODO: Support scales and sparse metadata"), and the interpreter's
equation dispatch (interpret/jaxpr_interpret.py) has no case for
`async_copy_scales_to_tmem_p`, so it re-binds it on host arrays and fails with
"async_copy_scales_to_tmem source must be an SMEM ref" (both seen with a one-tile probe
kernel on 2026-11-24). Until both exist (or a GPU is at hand) sm_100 takes the
dequantise path (default_grouped_path). Note WGMMA is sm_90a-only: these Hopper kernels
do not run on Blackwell.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from c2jax_kernels.block_scaled import formats
from c2jax_kernels.block_scaled import hopper_grouped

FMT = 'mxfp8_e4m3'
_ALIGN = 64  # kernel tiles: rows and output columns padded to a multiple of this


def _pad_axis(x, axis, multiple):
  pad = -x.shape[axis] % multiple
  if not pad:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, pad)
  return jnp.pad(x, widths)  # zero values and zero scales contribute exactly nothing


def _quantized(x, axis):
  q = formats.quantize(x, FMT, axis=axis)
  return q.values, q.scales


def _gmm(x_values_MxC, x_scales_MxNB, w_values_GxPxC, w_scales_GxPxNB, group_sizes_G,
         out_dtype, interpret):
  """Pads to kernel tiles, runs fp8_gmm, slices back to [M, P]."""
  m, p = x_values_MxC.shape[0], w_values_GxPxC.shape[1]
  # float32 before padding: E8M0 has no zero, so padded scales would read as NaN.
  x_scales_MxNB, w_scales_GxPxNB = (s.astype(jnp.float32) for s in (x_scales_MxNB,
                                                                    w_scales_GxPxNB))
  out = hopper_grouped.fp8_gmm(
      _pad_axis(x_values_MxC, 0, _ALIGN), _pad_axis(x_scales_MxNB, 0, _ALIGN),
      _pad_axis(w_values_GxPxC, 1, _ALIGN), _pad_axis(w_scales_GxPxNB, 1, _ALIGN),
      group_sizes_G, out_dtype=out_dtype, interpret=interpret)
  return out[:m, :p]


def _tgmm(x_values_KxM, x_scales_KxNB, dy_values_NxM, dy_scales_NxNB, group_sizes_G,
          out_dtype, interpret):
  k, n = x_values_KxM.shape[0], dy_values_NxM.shape[0]
  x_scales_KxNB, dy_scales_NxNB = (s.astype(jnp.float32) for s in (x_scales_KxNB,
                                                                   dy_scales_NxNB))
  out = hopper_grouped.fp8_tgmm(
      _pad_axis(x_values_KxM, 0, _ALIGN), _pad_axis(x_scales_KxNB, 0, _ALIGN),
      _pad_axis(dy_values_NxM, 0, _ALIGN), _pad_axis(dy_scales_NxNB, 0, _ALIGN),
      group_sizes_G, out_dtype=out_dtype, interpret=interpret)
  return out[:, :k, :n]


def _gather(x, rows_M):
  return x if rows_M is None else jnp.take(x, rows_M, axis=0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _fused(lhs, rhs_GxKxN, group_sizes_G, rows_M, out_dtype, interpret):
  x_values, x_scales = _quantized(lhs, 1)  # per token, before the dispatch gather
  w_values_GxNxK, w_scales_GxNxNB = _quantized(rhs_GxKxN, 1)
  return _gmm(_gather(x_values, rows_M), _gather(x_scales, rows_M), w_values_GxNxK,
              w_scales_GxNxNB, group_sizes_G, out_dtype, interpret)


def _fwd(lhs, rhs_GxKxN, group_sizes_G, rows_M, out_dtype, interpret):
  out = _fused(lhs, rhs_GxKxN, group_sizes_G, rows_M, out_dtype, interpret)
  return out, (lhs, rhs_GxKxN, group_sizes_G, rows_M)


def _bwd(out_dtype, interpret, residuals, dout_MxN):
  del out_dtype
  lhs, rhs_GxKxN, group_sizes_G, rows_M = residuals
  dy_values_MxN, dy_scales_MxNB = _quantized(dout_MxN, 1)
  w_values_GxKxN, w_scales_GxKxNB = _quantized(rhs_GxKxN, 2)
  dx_MxK = _gmm(dy_values_MxN, dy_scales_MxNB, w_values_GxKxN, w_scales_GxKxNB,
                group_sizes_G, jnp.float32, interpret)
  x_MxK = _gather(lhs, rows_M)
  x_values_KxM, x_scales_KxNB = _quantized(x_MxK, 0)
  dy_values_NxM, dy_scales_NxNB = _quantized(dout_MxN, 0)
  drhs = _tgmm(x_values_KxM, x_scales_KxNB, dy_values_NxM, dy_scales_NxNB, group_sizes_G,
               jnp.float32, interpret)
  if rows_M is None:
    dlhs = dx_MxK
    drows = None
  else:  # the transpose of the dispatch gather: sum each token's copies
    dlhs = jnp.zeros(lhs.shape, jnp.float32).at[rows_M].add(dx_MxK)
    drows = np.zeros(rows_M.shape, dtype=jax.dtypes.float0)
  dgroups = np.zeros(group_sizes_G.shape, dtype=jax.dtypes.float0)
  return dlhs.astype(lhs.dtype), drhs.astype(rhs_GxKxN.dtype), dgroups, drows


_fused.defvjp(_fwd, _bwd)

def supports(recipe_forward, recipe_backward):
  """Whether the fused kernels implement a recipe (MXFP8 E4M3 both ways)."""
  return recipe_forward == FMT and recipe_backward == FMT


def fused_grouped_matmul(lhs, rhs_GxKxN, group_sizes_G, *, rows=None,
                         preferred_element_type=None, interpret=False):
  """MXFP8 grouped GEMM on FP8 tensor cores; differentiable in lhs and rhs.

  Args:
    lhs: [M, K] rows sorted by group, or [T, K] tokens when `rows` is given.
    rhs_GxKxN: [G, K, N] one weight matrix per group.
    group_sizes_G: [G] integer rows per group (may be 0), summing to at most M.
    rows: optional [M] int token index of each sorted copy: lhs is quantised per token
      and the gather moves FP8 (quantise before dispatch).
    preferred_element_type: output dtype (FP32 accumulation); default lhs dtype.
    interpret: False on Hopper; True or a plgpu.InterpretGPUParams (e.g. with
      detect_races=True) runs the kernels in Mosaic GPU interpret mode on CPU.
  Returns:
    [M, N]; rows past sum(group_sizes) are zero.
  """
  if lhs.ndim != 2 or rhs_GxKxN.ndim != 3 or group_sizes_G.ndim != 1:
    raise ValueError("fused_grouped_matmul expects lhs [M, K], rhs [G, K, N], group_sizes "
                     f"[G]; got {lhs.shape}, {rhs_GxKxN.shape}, {group_sizes_G.shape}.")
  if lhs.shape[1] != rhs_GxKxN.shape[1] or rhs_GxKxN.shape[0] != group_sizes_G.shape[0]:
    raise ValueError(f"fused_grouped_matmul shape mismatch: lhs {lhs.shape}, rhs "
                     f"{rhs_GxKxN.shape}, group_sizes {group_sizes_G.shape}; need rhs "
                     f"[len(group_sizes), {lhs.shape[1]}, N].")
  if rows is not None and (rows.ndim != 1 or not jnp.issubdtype(rows.dtype, jnp.integer)):
    raise ValueError(f"rows must be a 1-D integer array of token indices, got {rows.dtype} "
                     f"{rows.shape}.")
  out_dtype = jnp.dtype(preferred_element_type or lhs.dtype)
  rows = None if rows is None else rows.astype(jnp.int32)
  return _fused(lhs, rhs_GxKxN, group_sizes_G.astype(jnp.int32), rows, out_dtype,
                interpret)
