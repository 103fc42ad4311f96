"""Grouped matmul against quantised weights, dequantised a tile at a time (inference).

    out_MxN = quantized_grouped_matmul(lhs_MxK, w, group_sizes_G)   # w: WeightQuant [G, K, N]

Same contract as kernels.grouped_matmul's forward (rows sorted by group, rows past
sum(group_sizes) come out zero, float32 accumulation, out in `preferred_element_type`,
default lhs's dtype); the weight's values are dequantised into lhs's dtype one K-chunk
(whole scale blocks, about CHUNK_K rows) at a time, so no dequantised copy of the whole
weight is ever formed. Implementations (IMPLS):
  tiled  the CPU path: kernels/grouped_matmul/tiled.py's loop over row tiles, each tile
         reading its own group's values and scales by dynamic index and dequantising them
         chunk by chunk along K: work and reads as the unquantised tiled loop, plus the
         dequantise of the chosen groups' weights only (a decode step reads the experts
         its tokens chose, none other).
  slabs  the accelerator path: a loop over K-chunks, each dequantising one [G, chunk, N]
         slab of every group and running `lax.ragged_dot` (native grouped GEMM on TPU and
         GPU; on CPU XLA expands it to a dense product per group, G times the work, so
         the CPU default is 'tiled'). Peak temporary: one slab, K / chunk of the weight.
default_impl(platform) picks 'tiled' on CPU and 'slabs' elsewhere. No VJP: an engine never
differentiates its resident weights (the learner trains the full-precision ones).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from c2jax_kernels import platform as platform_lib
from c2jax_kernels.grouped_matmul import tiled
from c2jax_kernels.weight_quant import formats

# Rows of K dequantised per step: whole scale blocks, about this many.
CHUNK_K = 256


def chunk_k(k: int, block_k: int) -> int:
  """The K-chunk: the largest multiple of block_k up to max(CHUNK_K, block_k) that
  divides K."""
  best = block_k
  size = block_k
  while size <= max(CHUNK_K, block_k) and size <= k:
    if k % size == 0:
      best = size
    size += block_k
  return best


def _check(lhs_MxK, w, group_sizes_G):
  if not formats.is_quantized(w) or w.ndim != 3:
    raise ValueError("quantized_grouped_matmul takes the weights as a WeightQuant of shape "
                     f"[G, K, N] (kernels.weight_quant.quantize_weight); got {type(w)}"
                     f"{'' if not formats.is_quantized(w) else ' of shape ' + str(w.shape)}.")
  if lhs_MxK.ndim != 2 or lhs_MxK.shape[1] != w.shape[1]:
    raise ValueError(f"lhs {tuple(lhs_MxK.shape)} does not contract with weights "
                     f"{w.shape} (need [M, K] against [G, K, N]).")
  if group_sizes_G.shape != (w.shape[0],):
    raise ValueError(f"group_sizes {tuple(group_sizes_G.shape)} must be [G] = "
                     f"[{w.shape[0]}].")


def tiled_gmm(lhs_MxK, w: formats.WeightQuant, group_sizes_G, *, out_dtype):
  num_rows, k = lhs_MxK.shape
  n = w.shape[2]
  if num_rows == 0:
    return jnp.zeros((0, n), out_dtype)
  (bk, bn), dtype = w.block, lhs_MxK.dtype
  chunk = chunk_k(k, bk)
  tile = tiled.tile_rows(num_rows, w.shape[0])
  group_W, first_row_W, count_W, used = tiled._tiles(group_sizes_G, num_rows, tile)  # pylint: disable=protected-access
  rows_R = jnp.arange(tile, dtype=jnp.int32)

  def body(t, out_MxN):
    start, offset = tiled.window(first_row_W[t], num_rows, tile)
    lhs_RxK = jax.lax.dynamic_slice_in_dim(lhs_MxK, start, tile)
    g = group_W[t]

    def k_step(c, acc_RxN):
      k0 = c * chunk
      values = jax.lax.dynamic_slice(w.values, (g, k0, 0), (1, chunk, n))[0]
      scales = jax.lax.dynamic_slice(w.scales, (g, k0 // bk, 0), (1, chunk // bk, n // bn))[0]
      tile_w = formats.dequantize_tile(values, scales, (bk, bn), dtype)
      lhs_chunk = jax.lax.dynamic_slice_in_dim(lhs_RxK, k0, chunk, axis=1)
      return acc_RxN + jnp.dot(lhs_chunk, tile_w, preferred_element_type=jnp.float32)

    tile_RxN = jax.lax.fori_loop(0, k // chunk, k_step,
                                 jnp.zeros((tile, n), jnp.float32)).astype(out_dtype)
    mine_R = (rows_R >= offset) & (rows_R < offset + count_W[t])
    kept_RxN = jax.lax.dynamic_slice_in_dim(out_MxN, start, tile)
    return jax.lax.dynamic_update_slice_in_dim(
        out_MxN, jnp.where(mine_R[:, None], tile_RxN, kept_RxN), start, 0)

  return jax.lax.fori_loop(0, used, body, jnp.zeros((num_rows, n), out_dtype))


def slabs_gmm(lhs_MxK, w: formats.WeightQuant, group_sizes_G, *, out_dtype):
  num_rows, k = lhs_MxK.shape
  n = w.shape[2]
  (bk, bn), dtype = w.block, lhs_MxK.dtype
  chunk = chunk_k(k, bk)
  sizes_G = group_sizes_G.astype(jnp.int32)

  def k_step(c, acc_MxN):
    k0 = c * chunk
    values = jax.lax.dynamic_slice_in_dim(w.values, k0, chunk, axis=1)
    scales = jax.lax.dynamic_slice_in_dim(w.scales, k0 // bk, chunk // bk, axis=1)
    slab_GxCxN = formats.dequantize_tile(values, scales, (bk, bn), dtype)
    lhs_chunk = jax.lax.dynamic_slice_in_dim(lhs_MxK, k0, chunk, axis=1)
    return acc_MxN + jax.lax.ragged_dot(lhs_chunk, slab_GxCxN, sizes_G,
                                        preferred_element_type=jnp.float32)

  acc = jax.lax.fori_loop(0, k // chunk, k_step, jnp.zeros((num_rows, n), jnp.float32))
  return acc.astype(out_dtype)


IMPLS = {"tiled": tiled_gmm, "slabs": slabs_gmm}


def default_impl(platform: str | None = None) -> str:
  """'tiled' on CPU, 'slabs' on TPU and GPU (the platform a step compiles for)."""
  platform = platform or platform_lib.target_platform()
  return "tiled" if platform == "cpu" else "slabs"


def quantized_grouped_matmul(lhs_MxK, w: formats.WeightQuant, group_sizes_G, *, impl=None,
                             preferred_element_type=None):
  """out[m] = lhs[m] @ dequantize(w[group(m)]), a K-chunk of w dequantised at a time."""
  _check(lhs_MxK, w, group_sizes_G)
  impl = impl or default_impl()
  if impl not in IMPLS:
    raise ValueError(f"Unknown quantised grouped-matmul impl {impl!r}; choose one of "
                     f"{tuple(IMPLS)}.")
  out_dtype = jnp.dtype(preferred_element_type or lhs_MxK.dtype)
  return IMPLS[impl](lhs_MxK, w, group_sizes_G, out_dtype=out_dtype)
