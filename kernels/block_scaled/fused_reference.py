"""Float64 reference for fused_grouped: the same quantisation, exact arithmetic.

Legend: T tokens before dispatch, M token copies sorted by group (rows[m] is the token of
copy m, or rows is None and M = T), K contraction, N output features, G groups.
Every operand is quantised exactly as the fused kernels quantise it (MXFP8 along each
GEMM's own contraction axis), dequantised, and multiplied in numpy float64, so the only
difference from the kernels is their FP32 accumulation.
"""

import numpy as np

from c2jax_kernels.block_scaled import formats

FMT = 'mxfp8_e4m3'


def _fq(x, axis):
  """quantise -> dequantise, as float64 numpy."""
  return np.asarray(formats.dequantize(formats.quantize(x, FMT, axis=axis)), np.float64)


def _group_of_rows(group_sizes_G, num_rows):
  """Group id per row; -1 for rows past sum(group_sizes)."""
  ends = np.cumsum(np.asarray(group_sizes_G))
  group_M = np.searchsorted(ends, np.arange(num_rows), side='right')
  return np.where(np.arange(num_rows) < ends[-1], group_M, -1)


def forward(lhs, rhs_GxKxN, group_sizes_G, rows_M=None):
  """[M, N] float64: row m times its group's weights; zero past sum(group_sizes)."""
  x_TxK = _fq(lhs, 1)  # per-token quantisation commutes with the row gather
  x_MxK = x_TxK if rows_M is None else x_TxK[np.asarray(rows_M)]
  w_GxKxN = _fq(rhs_GxKxN, 1)
  group_M = _group_of_rows(group_sizes_G, x_MxK.shape[0])
  out = np.zeros((x_MxK.shape[0], w_GxKxN.shape[2]))
  for g in range(w_GxKxN.shape[0]):
    sel = group_M == g
    out[sel] = x_MxK[sel] @ w_GxKxN[g]
  return out


def backward(lhs, rhs_GxKxN, group_sizes_G, dout_MxN, rows_M=None):
  """(dlhs, drhs) float64 of the straight-through VJP, each GEMM requantised."""
  x_MxK = np.asarray(lhs) if rows_M is None else np.asarray(lhs)[np.asarray(rows_M)]
  group_M = _group_of_rows(group_sizes_G, x_MxK.shape[0])
  dy_n = _fq(dout_MxN, 1)  # dlhs contracts over N
  w_n = _fq(rhs_GxKxN, 2)
  x_m = _fq(x_MxK, 0)  # drhs contracts over tokens
  dy_m = _fq(dout_MxN, 0)
  dx_MxK = np.zeros(x_MxK.shape)
  drhs = np.zeros(np.shape(rhs_GxKxN))
  for g in range(drhs.shape[0]):
    sel = group_M == g
    dx_MxK[sel] = dy_n[sel] @ w_n[g].T
    drhs[g] = x_m[sel].T @ dy_m[sel]
  if rows_M is None:
    return dx_MxK, drhs
  dlhs = np.zeros(np.shape(lhs))
  np.add.at(dlhs, np.asarray(rows_M), dx_MxK)
  return dlhs, drhs
