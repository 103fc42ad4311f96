"""Grouped matmul through the TPU megablox Pallas kernels that JAX ships (the TPU default).

Legend: M rows, K contraction, N output features, G groups (see reference.py).
On CPU these run under Pallas' TPU interpreter (slow, for tests only).
"""

import importlib

import jax.numpy as jnp

# The package re-exports a function named `gmm` over its module of the same name; the raw
# kernels (no VJP of their own, which api.py supplies) live in the module.
megablox_gmm = importlib.import_module('jax.experimental.pallas.ops.tpu.megablox.gmm')

_TILE = 128  # megablox' own default tile; K and N tiles shrink to tiny arrays


def _tiling(k, n):
  return (_TILE, min(_TILE, k), min(_TILE, n))


def _pad_rows(x_MxD):
  # megablox needs M to be a multiple of the row tile; padded rows belong to no group.
  pad = -x_MxD.shape[0] % _TILE
  return jnp.pad(x_MxD, ((0, pad), (0, 0))) if pad else x_MxD


def gmm(lhs_MxK, rhs, group_sizes_G, *, transpose_rhs, out_dtype, interpret=False):
  m, k = lhs_MxK.shape
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  out_MxN = megablox_gmm.gmm(
      _pad_rows(lhs_MxK), rhs.astype(lhs_MxK.dtype), group_sizes_G.astype(jnp.int32),
      preferred_element_type=out_dtype, tiling=_tiling(k, n),
      transpose_rhs=transpose_rhs, interpret=interpret)[:m]
  # megablox leaves rows past sum(group_sizes) unwritten (garbage on TPU, NaN when
  # interpreted) unless the groups are sharded; the contract here is zeros.
  valid_M = jnp.arange(m) < jnp.sum(group_sizes_G)
  return jnp.where(valid_M[:, None], out_MxN, 0).astype(out_dtype)


def tgmm(lhs_MxK, rhs_MxN, group_sizes_G, *, out_dtype, interpret=False):
  k, n = lhs_MxK.shape[1], rhs_MxN.shape[1]
  # megablox wants the contraction (row) axis of lhs last: [K, M].
  return megablox_gmm.tgmm(
      _pad_rows(lhs_MxK).T, _pad_rows(rhs_MxN.astype(lhs_MxK.dtype)),
      group_sizes_G.astype(jnp.int32), preferred_element_type=out_dtype,
      tiling=_tiling(k, n), interpret=interpret)
