"""Fused block-scaled FP8 grouped GEMMs for Hopper (sm_90) as Pallas Mosaic GPU kernels.

Legend: R rows of the left operand, P output columns, C the contraction (zero-padded to
Cp = NB * B, B = 32 the MXFP8 block size), G groups, NB contraction blocks, T row tiles.
Both operands come in the "TN" layout FP8 WGMMA wants: contraction minor on BOTH sides
(the left tile [rows, B] row-major, the right tile [cols, B] fed transposed), which is the
layout formats.quantize produces when it quantises along the contracted axis.

DeepGEMM-style promotion inside the kernel: the pipeline walks the contraction one scale
block (B = 32, one FP8 WGMMA K-step) at a time; each step's WGMMA lands in a fresh FP32
accumulator that only ever sums B products, is read back, multiplied by the row scales of
the left block and the column scales of the right block, and added to an FP32 register
carry. So scales never leave the kernel, no operand is dequantised, and the tensor core's
reduced-precision FP8 accumulation (DeepSeek-V3 report section 3.3.2) is bounded to B terms.

  fp8_gmm  (forward and input gradient): out[r] = lhs[r] . rhs[group(r)]^T, groups along
    rows. A row tile may straddle groups; it loops over the groups it touches (ranges found
    outside the kernel), runs the K pipeline per group into a fresh carry and selects that
    group's rows once at the end (one select per group and tile, not per K step; a select,
    not a zero scale, so one expert's NaN scale cannot reach another expert's rows).
  fp8_tgmm (weight gradient): out[g] = lhs[:, rows of g] . rhs[:, rows of g]^T, groups
    along the contraction (tokens). The pipeline walks only group g's token blocks; the
    first and last may hold other groups' tokens, whose FP8 values are zeroed in SMEM.
    Scale blocks follow global token order, so a block straddling two groups keeps one
    scale covering both, exactly as quantize() produced it.

Both kernels are persistent (one program per SM walking all output tiles). On CPU they run
in Mosaic GPU interpret mode (pass `interpret=True` or an InterpretGPUParams, e.g. with
detect_races=True), which simulates SMEM, TMA, barriers and WGMMA on the same kernel body.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from c2jax_kernels.platform import LazyModule

plgpu = LazyModule("jax.experimental.pallas.mosaic_gpu")  # imported on first use

SCALE_BLOCK = 32  # MXFP8 block = one FP8 WGMMA K-step (32 bytes per row: 32B swizzle)
_BLOCK_ROWS = 64  # WGMMA M of one warpgroup
_COL_CHOICES = (128, 64)
_PIPELINE_DEPTH = 4
_INTERPRET_PROGRAMS = 2
_DEFAULT_NUM_SMS = 132  # H100 SXM when the device does not report core_count


def interpret_params(interpret):
  """None on GPU; an InterpretGPUParams for interpret=True or the params given."""
  if interpret is False or interpret is None:
    return None
  if interpret is True:
    return plgpu.InterpretGPUParams()
  return interpret


def _num_programs(interpret):
  if interpret_params(interpret) is not None:
    return _INTERPRET_PROGRAMS
  return getattr(jax.local_devices()[0], 'core_count', _DEFAULT_NUM_SMS)


def _pick_cols(dim, what):
  for block in _COL_CHOICES:
    if dim % block == 0:
      return block
  raise ValueError(f"fp8 grouped GEMM needs {what}={dim} padded to a multiple of 64; the "
                   "public wrapper (fused_grouped.py) pads it, call that instead.")


def _check(values, scales, what):
  if values.dtype != jnp.float8_e4m3fn:
    raise ValueError(f"fp8 grouped GEMM takes float8_e4m3fn {what} values, got "
                     f"{values.dtype}; quantise with formats.quantize(x, 'mxfp8_e4m3').")
  if values.shape[-1] != scales.shape[-1] * SCALE_BLOCK:
    raise ValueError(f"{what}: values {values.shape} and scales {scales.shape} disagree; "
                     f"expected one scale per {SCALE_BLOCK} contraction elements.")


def _swizzle(minor_elems, dtype):
  swizzle = plgpu.find_swizzle(minor_elems * jnp.dtype(dtype).itemsize * 8)
  return (plgpu.TilingTransform((8, swizzle // jnp.dtype(dtype).itemsize)),
          plgpu.SwizzleTransform(swizzle))


def _block_product(a_smem, b_smem, rows, cols):
  """One scale block's FP8 WGMMA in a fresh FP32 accumulator, read back as a value."""
  def scope(acc_ref):
    plgpu.wgmma(acc_ref, a_smem, b_smem.transpose((1, 0)))
    return acc_ref[...]
  return pl.run_scoped(scope, plgpu.ACC((rows, cols)))


def _zeros_acc(rows, cols):
  return plgpu.layout_cast(jnp.zeros((rows, cols), jnp.float32), plgpu.Layout.WGMMA)


def _promote(carry, partial, row_scales_smem, col_scales_smem):
  """carry + partial * row_scale[:, None] * col_scale[None, :]: the per-block promotion.

  The scale tiles are [1, rows] and [1, cols] in SMEM, loaded straight into the WGMMA
  accumulator's row and column layouts so the broadcast needs no shuffles.
  """
  rows, cols = partial.shape
  row_scale = plgpu.load(row_scales_smem.at[0], layout=plgpu.Layout.WGMMA.reduce(1))
  col_scale = plgpu.load(col_scales_smem.at[0], layout=plgpu.Layout.WGMMA.reduce(0))
  return carry + (partial * lax.broadcast_in_dim(row_scale, (rows, cols), [0])
                  * lax.broadcast_in_dim(col_scale, (rows, cols), [1]))


def _store_tile(acc, out_gmem_tile, out_dtype):
  @functools.partial(pl.run_scoped, out_smem=plgpu.SMEM(acc.shape, out_dtype))
  def _store(out_smem):
    out_smem[...] = acc.astype(out_dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(out_smem, out_gmem_tile)
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def _tile_group_ranges(offsets_Gp1, num_tiles, block_rows):
  """First and last group touching each row tile; last < first for tiles past the sum."""
  ends_G, total = offsets_Gp1[1:], offsets_Gp1[-1]
  first_row_T = jnp.arange(num_tiles, dtype=jnp.int32) * block_rows
  last_row_T = jnp.minimum(first_row_T + block_rows, total) - 1
  first_T = jnp.searchsorted(ends_G, first_row_T, side='right').astype(jnp.int32)
  last_T = jnp.searchsorted(ends_G, last_row_T, side='right').astype(jnp.int32)
  return first_T, jnp.where(first_row_T < total, last_T, first_T - 1)


def offsets(group_sizes_G, num_rows):
  # Clipping keeps a contract-violating sum(group_sizes) > rows from indexing past lhs.
  ends_G = jnp.minimum(jnp.cumsum(group_sizes_G.astype(jnp.int32)), num_rows)
  return jnp.concatenate([jnp.zeros((1,), jnp.int32), ends_G])


def fp8_gmm(lhs_RxC, lhs_scales_RxNB, rhs_GxPxC, rhs_scales_GxPxNB, group_sizes_G, *,
            out_dtype=jnp.float32, interpret=False):
  """out[r, p] = sum_c lhs[r, c] rhs[group(r), p, c] with per-block scales, FP32 accumulate.

  R must be a multiple of 64 and P of 64 (fused_grouped pads); rows past sum(group_sizes)
  come out zero.
  """
  _check(lhs_RxC, lhs_scales_RxNB, 'lhs')
  _check(rhs_GxPxC, rhs_scales_GxPxNB, 'rhs')
  rows, contraction = lhs_RxC.shape
  cols = rhs_GxPxC.shape[1]
  num_blocks = contraction // SCALE_BLOCK
  block_rows, block_cols = _BLOCK_ROWS, _pick_cols(cols, 'P (output columns)')
  if rows % block_rows:
    raise ValueError(f"fp8_gmm needs rows={rows} padded to a multiple of {block_rows}.")
  grid_r, grid_p = rows // block_rows, cols // block_cols
  offsets_Gp1 = offsets(group_sizes_G, rows)
  first_T, last_T = _tile_group_ranges(offsets_Gp1, grid_r, block_rows)
  # Block-major scales: each pipeline step loads one contiguous row of scales.
  lhs_scales_NBxR = lhs_scales_RxNB.astype(jnp.float32).T
  rhs_scales_GxNBxP = jnp.swapaxes(rhs_scales_GxPxNB.astype(jnp.float32), 1, 2)

  def body(first_ref, last_ref, offsets_ref, lhs_gmem, lhs_s_gmem, rhs_gmem, rhs_s_gmem,
           out_gmem):
    @plgpu.nd_loop((grid_r, grid_p), collective_axes='sm')
    def _tile(loop_info):
      ri, pi = loop_info.index
      row0 = ri * block_rows
      row_ids = row0 + plgpu.broadcasted_iota(jnp.int32, (block_rows, block_cols), 0,
                                              layout=plgpu.Layout.WGMMA)

      def group_body(g, acc):
        start, end = offsets_ref[g], offsets_ref[g + 1]

        def step(_, lhs_smem, lhs_s_smem, rhs_smem, rhs_s_smem, carry):
          partial = _block_product(lhs_smem, rhs_smem, block_rows, block_cols)
          return _promote(carry, partial, lhs_s_smem, rhs_s_smem)

        group_acc = plgpu.emit_pipeline(
            step,
            grid=(num_blocks,),
            in_specs=[
                plgpu.BlockSpec((block_rows, SCALE_BLOCK), lambda kb: (ri, kb),
                                transforms=_swizzle(SCALE_BLOCK, lhs_RxC.dtype)),
                plgpu.BlockSpec((1, block_rows), lambda kb: (kb, ri)),
                plgpu.BlockSpec((block_cols, SCALE_BLOCK), lambda kb: (pi, kb),
                                transforms=_swizzle(SCALE_BLOCK, rhs_GxPxC.dtype)),
                plgpu.BlockSpec((1, block_cols), lambda kb: (kb, pi)),
            ],
            max_concurrent_steps=_PIPELINE_DEPTH,
            init_carry=_zeros_acc(block_rows, block_cols),
        )(lhs_gmem, lhs_s_gmem, rhs_gmem.at[g], rhs_s_gmem.at[g])
        # Rows of other groups were multiplied by this group's weights: select, never
        # scale by zero, so a NaN scale of one expert cannot reach another's rows. An
        # empty group selects nothing.
        in_group = (row_ids >= start) & (row_ids < end)
        return jnp.where(in_group, group_acc, acc)

      acc = lax.fori_loop(first_ref[ri], last_ref[ri] + 1, group_body,
                          _zeros_acc(block_rows, block_cols))
      _store_tile(acc, out_gmem.at[pl.ds(row0, block_rows), pl.ds(pi * block_cols,
                                                                  block_cols)], out_dtype)

  kernel = plgpu.kernel(
      body,
      out_type=jax.ShapeDtypeStruct((rows, cols), out_dtype),
      grid=(_num_programs(interpret),),
      grid_names=('sm',),
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
      interpret=interpret_params(interpret),
  )
  return kernel(first_T, last_T, offsets_Gp1, lhs_RxC, lhs_scales_NBxR, rhs_GxPxC,
                rhs_scales_GxNBxP)


def fp8_tgmm(lhs_KxM, lhs_scales_KxNB, rhs_NxM, rhs_scales_NxNB, group_sizes_G, *,
             out_dtype=jnp.float32, interpret=False):
  """out[g, k, n] = sum over tokens m of group g of lhs[k, m] rhs[n, m], block-scaled.

  Both operands are quantised along the token axis M (last, padded to NB * 32); K and N
  must be multiples of 64 (fused_grouped pads). Empty groups give zeros.
  """
  _check(lhs_KxM, lhs_scales_KxNB, 'lhs')
  _check(rhs_NxM, rhs_scales_NxNB, 'rhs')
  rows, tokens = lhs_KxM.shape
  cols = rhs_NxM.shape[0]
  num_groups = group_sizes_G.shape[0]
  block_rows, block_cols = _BLOCK_ROWS, _pick_cols(cols, 'N (output columns)')
  if rows % block_rows:
    raise ValueError(f"fp8_tgmm needs K={rows} padded to a multiple of {block_rows}.")
  grid_r, grid_p = rows // block_rows, cols // block_cols
  offsets_Gp1 = offsets(group_sizes_G, tokens)
  first_block_G = offsets_Gp1[:-1] // SCALE_BLOCK
  num_blocks_G = jnp.where(offsets_Gp1[1:] > offsets_Gp1[:-1],
                           pl.cdiv(offsets_Gp1[1:], SCALE_BLOCK) - first_block_G, 0)
  lhs_scales_NBxK = lhs_scales_KxNB.astype(jnp.float32).T
  rhs_scales_NBxN = rhs_scales_NxNB.astype(jnp.float32).T

  def body(offsets_ref, first_block_ref, num_blocks_ref, lhs_gmem, lhs_s_gmem, rhs_gmem,
           rhs_s_gmem, out_gmem):
    @plgpu.nd_loop((num_groups, grid_r, grid_p), collective_axes='sm')
    def _tile(loop_info):
      g, ri, pi = loop_info.index
      start, end = offsets_ref[g], offsets_ref[g + 1]
      block0, num_blocks = first_block_ref[g], num_blocks_ref[g]

      def step(idx, lhs_smem, lhs_s_smem, rhs_smem, rhs_s_smem, carry):
        i = idx[0]

        @pl.when((i == 0) | (i == num_blocks - 1))  # only edge blocks hold other groups
        def _zero_other_groups():
          token_ids = (block0 + i) * SCALE_BLOCK + plgpu.broadcasted_iota(
              jnp.int32, (block_rows, SCALE_BLOCK), 1, layout=plgpu.Layout.WGMMA)
          keep = (token_ids >= start) & (token_ids < end)
          # Mosaic GPU has no select on 8-bit values: through float16 (the one type FP8
          # converts to in hardware), which holds every E4M3 value exactly, so kept values
          # come back unchanged.
          wide = lhs_smem[...].astype(jnp.float16)
          lhs_smem[...] = jnp.where(keep, wide, 0).astype(lhs_smem.dtype)
          plgpu.commit_smem()

        partial = _block_product(lhs_smem, rhs_smem, block_rows, block_cols)
        return _promote(carry, partial, lhs_s_smem, rhs_s_smem)

      out_tile = out_gmem.at[g, pl.ds(ri * block_rows, block_rows),
                             pl.ds(pi * block_cols, block_cols)]

      @pl.when(num_blocks > 0)
      def _run():
        acc = plgpu.emit_pipeline(
            step,
            grid=(num_blocks,),
            in_specs=[
                plgpu.BlockSpec((block_rows, SCALE_BLOCK), lambda i: (ri, block0 + i),
                                transforms=_swizzle(SCALE_BLOCK, lhs_KxM.dtype)),
                plgpu.BlockSpec((1, block_rows), lambda i: (block0 + i, ri)),
                plgpu.BlockSpec((block_cols, SCALE_BLOCK), lambda i: (pi, block0 + i),
                                transforms=_swizzle(SCALE_BLOCK, rhs_NxM.dtype)),
                plgpu.BlockSpec((1, block_cols), lambda i: (block0 + i, pi)),
            ],
            max_concurrent_steps=_PIPELINE_DEPTH,
            init_carry=_zeros_acc(block_rows, block_cols),
        )(lhs_gmem, lhs_s_gmem, rhs_gmem, rhs_s_gmem)
        _store_tile(acc, out_tile, out_dtype)

      @pl.when(num_blocks == 0)  # an empty group's weight gradient is zero
      def _zeros():
        _store_tile(_zeros_acc(block_rows, block_cols), out_tile, out_dtype)

  kernel = plgpu.kernel(
      body,
      out_type=jax.ShapeDtypeStruct((num_groups, rows, cols), out_dtype),
      grid=(_num_programs(interpret),),
      grid_names=('sm',),
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
      interpret=interpret_params(interpret),
  )
  return kernel(offsets_Gp1, first_block_G, num_blocks_G, lhs_KxM, lhs_scales_NBxK,
                rhs_NxM, rhs_scales_NBxN)
