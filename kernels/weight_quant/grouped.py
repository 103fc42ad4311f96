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
  tokamax  TPU: tokamax's Mosaic TPU ragged dot (`pip install -e .[kernels]`) on the
         values and scales as held (a qwix QArray: int4, int8 or float8 values with
         scales per block along K); the kernel reads each tile's values and scales and
         applies them itself, never a dequantised weight. It takes one scale per output
         column, so fp8's 128-column blocks are repeated across their columns for the
         call, and it expands the scales 8-fold along K itself (its 8-sublane tiles): a
         float32 temporary of 1 byte per int4 value per call. It needs K, N >= 128;
         fewer rows than 128 are padded (the rows the kernel leaves unwritten past the
         routed sum are zeroed here). Its numerics are checked in Pallas' TPU interpreter.
default_impl(platform, k, n) picks 'tiled' on CPU; on TPU 'tokamax' where tokamax is
installed, K, N >= 128 and the call traces per device (XLA cannot partition a Mosaic
call: under expert parallelism's shard_map, or on one device), else 'slabs'
(docs/kernels.md has the evidence: the TPU compiler's estimates at DeepSeek-V3's and
Kimi-K2.5's expert shapes). No VJP: an engine never differentiates its resident weights
(the learner trains the full-precision ones).
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


def slabs_gmm(lhs_MxK, w: formats.WeightQuant, group_sizes_G, *, out_dtype, unroll=False):
  """`unroll`: the K loop unrolled (tools/compile: the TPU compiler's cost model counts a
  loop's body once)."""
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

  acc = jax.lax.fori_loop(0, k // chunk, k_step, jnp.zeros((num_rows, n), jnp.float32),
                          unroll=unroll)
  return acc.astype(out_dtype)


# tokamax's Mosaic TPU kernel takes no dimension but the groups' under this.
TOKAMAX_MIN = 128


def tokamax_gmm(lhs_MxK, w: formats.WeightQuant, group_sizes_G, *, out_dtype):
  tokamax = platform_lib.library("quantised grouped matmul impl='tokamax'")
  import qwix  # pylint: disable=g-import-not-at-top  # tokamax's own dependency

  platform = platform_lib.target_platform()
  if platform != "tpu":
    raise ValueError(f"quantised grouped matmul impl='tokamax' runs on TPU (the target is "
                     f"{platform!r}); use impl='slabs' or 'tiled', or the default.")
  num_rows, k = lhs_MxK.shape
  n = w.shape[2]
  if min(k, n) < TOKAMAX_MIN:
    raise ValueError(f"quantised grouped matmul impl='tokamax': tokamax's TPU kernel needs K "
                     f"and N of at least {TOKAMAX_MIN} (weights {w.shape}); use impl='slabs'.")
  scales = w.scales if w.block[1] == 1 else jnp.repeat(w.scales, w.block[1], axis=2)
  rhs = qwix.QArray(w.values, scales, qtype=w.values.dtype)
  rows = max(num_rows, TOKAMAX_MIN)
  lhs = jnp.pad(lhs_MxK, ((0, rows - num_rows), (0, 0))) if rows > num_rows else lhs_MxK
  out = tokamax.ragged_dot(lhs, rhs, group_sizes_G.astype(jnp.int32),
                           preferred_element_type=out_dtype, implementation="mosaic")
  routed = jnp.arange(rows) < jnp.sum(group_sizes_G)
  return jnp.where(routed[:, None], out, 0).astype(out_dtype)[:num_rows]


IMPLS = {"tiled": tiled_gmm, "slabs": slabs_gmm, "tokamax": tokamax_gmm}


def default_impl(platform: str | None = None, k: int | None = None,
                 n: int | None = None) -> str:
  """'tiled' on CPU; on TPU 'tokamax' where it is installed, takes the weight's K and N and
  the call traces per device; else 'slabs' (also on GPU); for the platform a step
  compiles for."""
  platform = platform or platform_lib.target_platform()
  if platform == "cpu":
    return "tiled"
  fits = k is None or n is None or min(k, n) >= TOKAMAX_MIN
  if platform == "tpu" and fits and _per_device() and platform_lib.library_installed():
    return "tokamax"
  return "slabs"


def _per_device() -> bool:
  """Whether the call traces per device: no mesh axis of more than one device left to
  XLA's partitioner (each is manual, inside a shard_map: expert parallelism's dispatch).
  XLA cannot partition a Mosaic call, so an engine whose experts are sharded outside a
  shard_map (fsdp over the experts) runs 'slabs'."""
  mesh = jax.sharding.get_abstract_mesh()
  manual = set(getattr(mesh, "manual_axes", ()))
  return all(size == 1 or name in manual for name, size in dict(mesh.shape).items())


def quantized_grouped_matmul(lhs_MxK, w: formats.WeightQuant, group_sizes_G, *, impl=None,
                             preferred_element_type=None):
  """out[m] = lhs[m] @ dequantize(w[group(m)]), a K-chunk of w dequantised at a time."""
  _check(lhs_MxK, w, group_sizes_G)
  impl = impl or default_impl(k=w.shape[1], n=w.shape[2])
  if impl not in IMPLS:
    raise ValueError(f"Unknown quantised grouped-matmul impl {impl!r}; choose one of "
                     f"{tuple(IMPLS)}.")
  out_dtype = jnp.dtype(preferred_element_type or lhs_MxK.dtype)
  return IMPLS[impl](lhs_MxK, w, group_sizes_G, out_dtype=out_dtype)
