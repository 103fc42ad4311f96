"""Grouped matmul through XLA's `lax.ragged_dot` (the CPU default; also a GPU/TPU baseline).

XLA lowers `ragged_dot` natively on GPU and TPU. On CPU it has no grouped GEMM and JAX
expands the op to a dense dot over every group with masked rows (G times the work), so
there these functions run the same math as a loop of row-tile matmuls (tiled.py), chosen
per platform at lowering time.

Legend: M rows, K contraction, N output features, G groups (see reference.py).
"""

import functools

import jax
import jax.numpy as jnp

from c2jax_kernels.grouped_matmul import tiled


def _ragged_gmm(lhs_MxK, rhs, group_sizes_G, *, transpose_rhs, out_dtype):
  rhs_GxKxN = jnp.swapaxes(rhs, 1, 2) if transpose_rhs else rhs
  out_MxN = jax.lax.ragged_dot(lhs_MxK, rhs_GxKxN, group_sizes_G.astype(jnp.int32),
                               preferred_element_type=jnp.float32)
  return out_MxN.astype(out_dtype)


def _ragged_tgmm(lhs_MxK, rhs_MxN, group_sizes_G, *, out_dtype):
  # Contracting the ragged row axis itself yields one [K, N] block per group.
  numbers = jax.lax.RaggedDotDimensionNumbers(
      dot_dimension_numbers=(((0,), (0,)), ((), ())),
      lhs_ragged_dimensions=[0],
      rhs_group_dimensions=[])
  out_GxKxN = jax.lax.ragged_dot_general(
      lhs_MxK, rhs_MxN, group_sizes_G.astype(jnp.int32), numbers,
      preferred_element_type=jnp.float32)
  return out_GxKxN.astype(out_dtype)


def gmm(lhs_MxK, rhs, group_sizes_G, *, transpose_rhs, out_dtype, interpret=False):
  del interpret
  kwargs = dict(transpose_rhs=transpose_rhs, out_dtype=out_dtype)
  return jax.lax.platform_dependent(
      lhs_MxK, rhs, group_sizes_G, cpu=functools.partial(tiled.gmm, **kwargs),
      default=functools.partial(_ragged_gmm, **kwargs))


def tgmm(lhs_MxK, rhs_MxN, group_sizes_G, *, out_dtype, interpret=False):
  del interpret
  return jax.lax.platform_dependent(
      lhs_MxK, rhs_MxN, group_sizes_G, cpu=functools.partial(tiled.tgmm, out_dtype=out_dtype),
      default=functools.partial(_ragged_tgmm, out_dtype=out_dtype))
