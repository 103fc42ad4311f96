"""Plain-jnp grouped matmul: the definition every other implementation is tested against.

Legend: M rows (tokens sorted by group), K contraction, N output features, G groups.
Group g owns rows [offsets[g], offsets[g+1]) with offsets = [0, cumsum(group_sizes)].
Rows at or past sum(group_sizes) belong to no group: their output rows are zero.

Cost is G times a dense matmul (every group multiplies a masked copy of all rows), which
is fine for tests and tiny CPU models and is why it is never a default.
"""

import jax
import jax.numpy as jnp


def group_masks(group_sizes_G, num_rows):
  """[G, M] boolean: mask_GxM[g, m] is True iff row m belongs to group g."""
  ends_G = jnp.cumsum(group_sizes_G.astype(jnp.int32))
  starts_G = ends_G - group_sizes_G.astype(jnp.int32)
  rows_M = jnp.arange(num_rows, dtype=jnp.int32)
  return (rows_M[None, :] >= starts_G[:, None]) & (rows_M[None, :] < ends_G[:, None])


def gmm(lhs_MxK, rhs, group_sizes_G, *, transpose_rhs, out_dtype, interpret=False):
  """out[m] = lhs[m] @ rhs[group(m)]; rhs is [G,K,N], or [G,N,K] when transpose_rhs."""
  del interpret  # plain jnp runs anywhere
  mask_GxM = group_masks(group_sizes_G, lhs_MxK.shape[0]).astype(lhs_MxK.dtype)
  spec = 'gm,mk,gnk->mn' if transpose_rhs else 'gm,mk,gkn->mn'
  out_MxN = jnp.einsum(spec, mask_GxM, lhs_MxK, rhs,
                       preferred_element_type=jnp.float32,
                       precision=jax.lax.Precision.HIGHEST)
  return out_MxN.astype(out_dtype)


def tgmm(lhs_MxK, rhs_MxN, group_sizes_G, *, out_dtype, interpret=False):
  """out[g] = lhs[rows of g].T @ rhs[rows of g], shape [G, K, N]; empty groups give zeros."""
  del interpret
  mask_GxM = group_masks(group_sizes_G, lhs_MxK.shape[0]).astype(lhs_MxK.dtype)
  out_GxKxN = jnp.einsum('gm,mk,mn->gkn', mask_GxM, lhs_MxK, rhs_MxN,
                         preferred_element_type=jnp.float32,
                         precision=jax.lax.Precision.HIGHEST)
  return out_GxKxN.astype(out_dtype)
