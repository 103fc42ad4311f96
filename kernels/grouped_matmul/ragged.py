"""Grouped matmul through XLA's `lax.ragged_dot` (the CPU default; also a GPU/TPU baseline).

Legend: M rows, K contraction, N output features, G groups (see reference.py).
"""

import jax
import jax.numpy as jnp


def gmm(lhs_MxK, rhs, group_sizes_G, *, transpose_rhs, out_dtype, interpret=False):
  del interpret
  rhs_GxKxN = jnp.swapaxes(rhs, 1, 2) if transpose_rhs else rhs
  out_MxN = jax.lax.ragged_dot(lhs_MxK, rhs_GxKxN, group_sizes_G.astype(jnp.int32),
                               preferred_element_type=jnp.float32)
  return out_MxN.astype(out_dtype)


def tgmm(lhs_MxK, rhs_MxN, group_sizes_G, *, out_dtype, interpret=False):
  del interpret
  # Contracting the ragged row axis itself yields one [K, N] block per group.
  numbers = jax.lax.RaggedDotDimensionNumbers(
      dot_dimension_numbers=(((0,), (0,)), ((), ())),
      lhs_ragged_dimensions=[0],
      rhs_group_dimensions=[])
  out_GxKxN = jax.lax.ragged_dot_general(
      lhs_MxK, rhs_MxN, group_sizes_G.astype(jnp.int32), numbers,
      preferred_element_type=jnp.float32)
  return out_GxKxN.astype(out_dtype)
