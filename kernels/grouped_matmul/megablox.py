"""Grouped matmul through the TPU megablox Pallas kernels that JAX ships (the TPU default).

Legend: M rows, K contraction, N output features, G groups (see reference.py).
On CPU these run under Pallas' TPU interpreter (slow, for tests only).
"""

import importlib

import jax.numpy as jnp

# The package re-exports a function named `gmm` over its module of the same name; the raw
# kernels (no VJP of their own, which api.py supplies) live in the module.
megablox_gmm = importlib.import_module('jax.experimental.pallas.ops.tpu.megablox.gmm')

# Tiles as MaxText's defaults (512 rows, 1024 of K and N, clamped to the array). With
# megablox' own 128 x 128 x 128, the TPU compiler estimated DeepSeek-V3's expert layer
# (forward and both gradients) at 21.3 ms on v5p and 30.5 ms on v6e; with these, 7.90 and
# 7.55 ms (docs/scaling.md, "Kernels through Mosaic").
_ROWS, _COLS = 512, 1024
_MIN_ROWS = 128  # fewer rows than _ROWS (decode, tests): pad to a multiple of this only


def _row_tile(m):
  return _ROWS if m >= _ROWS else _MIN_ROWS


def _tiling(m, k, n):
  return (_row_tile(m), min(_COLS, k), min(_COLS, n))


def _pad_rows(x_MxD, tile):
  # megablox needs M to be a multiple of the row tile; padded rows belong to no group.
  pad = -x_MxD.shape[0] % tile
  return jnp.pad(x_MxD, ((0, pad), (0, 0))) if pad else x_MxD


def gmm(lhs_MxK, rhs, group_sizes_G, *, transpose_rhs, out_dtype, interpret=False):
  m, k = lhs_MxK.shape
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  tiling = _tiling(m, k, n)
  out_MxN = megablox_gmm.gmm(
      _pad_rows(lhs_MxK, tiling[0]), rhs.astype(lhs_MxK.dtype),
      group_sizes_G.astype(jnp.int32), preferred_element_type=out_dtype, tiling=tiling,
      transpose_rhs=transpose_rhs, interpret=interpret)[:m]
  # megablox leaves rows past sum(group_sizes) unwritten (garbage on TPU, NaN when
  # interpreted) unless the groups are sharded; the contract here is zeros.
  valid_M = jnp.arange(m) < jnp.sum(group_sizes_G)
  return jnp.where(valid_M[:, None], out_MxN, 0).astype(out_dtype)


def tgmm(lhs_MxK, rhs_MxN, group_sizes_G, *, out_dtype, interpret=False):
  (m, k), n = lhs_MxK.shape, rhs_MxN.shape[1]
  tiling = _tiling(m, k, n)
  # megablox wants the contraction (row) axis of lhs last: [K, M].
  return megablox_gmm.tgmm(
      _pad_rows(lhs_MxK, tiling[0]).T, _pad_rows(rhs_MxN.astype(lhs_MxK.dtype), tiling[0]),
      group_sizes_G.astype(jnp.int32), preferred_element_type=out_dtype,
      tiling=tiling, interpret=interpret)
