"""Grouped matmul as a loop of row-tile matmuls in plain XLA: the CPU lowering of ragged_dot.

XLA has no grouped GEMM on CPU: there `lax.ragged_dot` expands to a dense dot over every
group with masked rows, G times the work. Here each group's rows are cut into tiles of
`tile` rows (its last tile partly empty) and a `fori_loop` over the tiles in use runs one
[tile, K] x [K, N] matmul per tile against its group's weights, read in place by dynamic
index (no [tiles, K, N] copy of the weights). A tile is a window of the sorted rows
themselves: no padded copy of lhs is made; rows of the window that are not the tile's
(the next group's, or past the end) are dropped on write (gmm) or zeroed (tgmm). Work:
sum_g ceil(size_g / tile) tiles, at most M / tile + G - 1, and empty groups cost nothing.

Legend: M rows (sorted by group), K contraction, N output features, G groups, W tiles
(static upper bound), R rows per tile.
"""

import jax
import jax.numpy as jnp

# The largest tile: big enough that one tile's matmul runs near the machine's matmul rate,
# small enough that the partly empty last tile of each group wastes little.
MAX_TILE_ROWS = 128
MIN_TILE_ROWS = 8


def tile_rows(num_rows, num_groups):
  """Rows per tile for M rows in G groups: the power of two nearest M / G (the mean group),
  within [MIN_TILE_ROWS, MAX_TILE_ROWS] and at most M."""
  mean_group = max(num_rows // max(num_groups, 1), 1)
  tile = MIN_TILE_ROWS
  while tile * 2 <= min(mean_group, MAX_TILE_ROWS):
    tile *= 2
  return max(min(tile, num_rows), 1)


def _tiles(group_sizes_G, num_rows, tile):
  """Static tile bound W and, per tile, its group, first row and row count, plus the
  number of tiles in use (tiles at or past it are idle)."""
  num_groups = group_sizes_G.shape[0]
  num_tiles = -(-num_rows // tile) + num_groups - 1
  sizes_G = group_sizes_G.astype(jnp.int32)
  ends_G = jnp.cumsum(sizes_G)
  starts_G = ends_G - sizes_G
  tiles_G = (sizes_G + tile - 1) // tile
  tile_ends_G = jnp.cumsum(tiles_G)
  tile_W = jnp.arange(num_tiles, dtype=jnp.int32)
  # The group owning tile w: how many groups' tiles end at or before it.
  group_W = jnp.minimum(jnp.sum(tile_W[:, None] >= tile_ends_G[None, :], axis=1),
                        num_groups - 1).astype(jnp.int32)
  first_row_W = starts_G[group_W] + (tile_W - (tile_ends_G - tiles_G)[group_W]) * tile
  count_W = jnp.clip(ends_G[group_W] - first_row_W, 0, tile)
  return group_W, first_row_W, count_W, tile_ends_G[-1]


def window(first_row, num_rows, tile):
  """The window [start, start + tile) holding a tile's rows, kept inside [0, M), and the
  tile's first row's offset in it."""
  start = jnp.minimum(first_row, num_rows - tile)
  return start, first_row - start


def gmm(lhs_MxK, rhs, group_sizes_G, *, transpose_rhs, out_dtype, interpret=False,
        tile=None):
  """out[m] = lhs[m] @ rhs[group(m)]; rhs is [G,K,N], or [G,N,K] when transpose_rhs."""
  del interpret
  num_rows = lhs_MxK.shape[0]
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  if num_rows == 0:
    return jnp.zeros((0, n), out_dtype)
  tile = tile or tile_rows(num_rows, rhs.shape[0])
  group_W, first_row_W, count_W, used = _tiles(group_sizes_G, num_rows, tile)
  contract = ((1,), (1,)) if transpose_rhs else ((1,), (0,))
  rows_R = jnp.arange(tile, dtype=jnp.int32)

  def body(w, out_MxN):
    start, offset = window(first_row_W[w], num_rows, tile)
    lhs_RxK = jax.lax.dynamic_slice_in_dim(lhs_MxK, start, tile)
    rhs_g = jax.lax.dynamic_index_in_dim(rhs, group_W[w], keepdims=False)
    tile_RxN = jax.lax.dot_general(lhs_RxK, rhs_g, (contract, ((), ())),
                                   preferred_element_type=jnp.float32).astype(out_dtype)
    mine_R = (rows_R >= offset) & (rows_R < offset + count_W[w])
    kept_RxN = jax.lax.dynamic_slice_in_dim(out_MxN, start, tile)
    return jax.lax.dynamic_update_slice_in_dim(
        out_MxN, jnp.where(mine_R[:, None], tile_RxN, kept_RxN), start, 0)

  return jax.lax.fori_loop(0, used, body, jnp.zeros((num_rows, n), out_dtype))


def tgmm(lhs_MxK, rhs_MxN, group_sizes_G, *, out_dtype, interpret=False, tile=None):
  """out[g] = lhs[rows of g].T @ rhs[rows of g], shape [G, K, N]; empty groups give zeros."""
  del interpret
  num_rows, k = lhs_MxK.shape
  num_groups, n = group_sizes_G.shape[0], rhs_MxN.shape[1]
  if num_rows == 0:
    return jnp.zeros((num_groups, k, n), out_dtype)
  tile = tile or tile_rows(num_rows, num_groups)
  group_W, first_row_W, count_W, used = _tiles(group_sizes_G, num_rows, tile)
  rows_R = jnp.arange(tile, dtype=jnp.int32)

  def body(w, acc_GxKxN):
    start, offset = window(first_row_W[w], num_rows, tile)
    mine_R = (rows_R >= offset) & (rows_R < offset + count_W[w])
    lhs_RxK = jnp.where(mine_R[:, None], jax.lax.dynamic_slice_in_dim(lhs_MxK, start, tile),
                        0)
    rhs_RxN = jax.lax.dynamic_slice_in_dim(rhs_MxN, start, tile)
    update_KxN = jax.lax.dot_general(lhs_RxK, rhs_RxN, (((0,), (0,)), ((), ())),
                                     preferred_element_type=jnp.float32)
    g = group_W[w]
    return jax.lax.dynamic_update_index_in_dim(
        acc_GxKxN, jax.lax.dynamic_index_in_dim(acc_GxKxN, g, keepdims=False) + update_KxN,
        g, 0)

  acc_GxKxN = jax.lax.fori_loop(0, used, body, jnp.zeros((num_groups, k, n), jnp.float32))
  return acc_GxKxN.astype(out_dtype)
