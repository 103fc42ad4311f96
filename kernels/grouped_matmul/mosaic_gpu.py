"""Grouped matmul as Pallas Mosaic GPU kernels (Hopper WGMMA; the GPU default).

Legend: M rows (tokens sorted by group), K contraction, N output features, G groups,
T row tiles of block_m rows. Group g owns rows [offsets[g], offsets[g+1]).

gmm (forward and input gradient): one output tile [block_m, block_n] per loop step. A row
tile may straddle several groups, so the tile loops over exactly the groups it touches
(first/last group per tile are computed outside the kernel), runs a K pipeline for each
against that group's weights, and zeroes the rows of other groups in the SMEM copy of lhs
before the WGMMA. All groups accumulate into one accumulator, and the tile is stored once
with a full-width TMA store; tiles past sum(group_sizes) touch no group and store zeros.

tgmm (weight gradient): one [block_k, block_n] tile of one group's [K, N] block per loop
step; the pipeline walks only that group's row blocks and masks the rows of neighbouring
groups in the first and last block. Empty groups store zeros.

Both kernels are persistent: a grid of one program per SM iterates over all tiles.
On CPU they run in Mosaic GPU interpret mode (jax >= 0.12), which simulates SMEM, TMA and
barriers, so the tests exercise the same kernel body as the GPU. On hardware the operands
must be bfloat16/float16 (WGMMA cannot transpose TF32 tiles); interpret mode also takes
float32, which the tests use for tight comparisons.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from c2jax_kernels.platform import LazyModule

plgpu = LazyModule("jax.experimental.pallas.mosaic_gpu")  # imported on first use

_MAX_CONCURRENT_STEPS = 4
_SMEM_BUDGET_BYTES = 200 * 1024  # of the 227 KiB an H100/H200/B200 block may use
_INTERPRET_PROGRAMS = 2  # simulated SMs on CPU: more only costs interpreter time
_DEFAULT_NUM_SMS = 132  # H100 SXM, used when the device does not report core_count


_BLOCK_CHOICES = (128, 64)
_BLOCK_M = 128


def _check_operands(dtype, interpret):
  # WGMMA transposes SMEM tiles only for 16-bit types, and these kernels feed it
  # N-major weight tiles (gmm) and M-major activation tiles (tgmm).
  if not interpret and jnp.dtype(dtype).itemsize != 2:
    raise ValueError(
        f"impl='mosaic_gpu' on GPU takes bfloat16/float16 operands, got "
        f"{jnp.dtype(dtype).name}. Cast the operands (model.dtype='bfloat16'), or use "
        "impl='tiled' (model.moe_impl='ragged' runs ragged_dot) for float32 matmuls.")


def _pick_block(dim, what):
  """Largest WGMMA tile that divides the dimension."""
  for block in _BLOCK_CHOICES:
    if dim % block == 0:
      return block
  raise ValueError(
      f"impl='mosaic_gpu' needs {what}={dim} to be a multiple of one of "
      f"{_BLOCK_CHOICES} (WGMMA tiles). Pad the feature dimension or use "
      "impl='ragged_dot'.")


def _pipeline_depth(in_tile_elems, out_tile_elems, in_dtype, out_dtype):
  """Deepest pipeline (<= _MAX_CONCURRENT_STEPS, >= 2 for delayed release) that fits SMEM."""
  step_bytes = in_tile_elems * jnp.dtype(in_dtype).itemsize
  free = _SMEM_BUDGET_BYTES - out_tile_elems * jnp.dtype(out_dtype).itemsize
  return max(2, min(_MAX_CONCURRENT_STEPS, free // step_bytes))


def _num_programs(interpret):
  if interpret:
    return _INTERPRET_PROGRAMS
  return getattr(jax.local_devices()[0], 'core_count', _DEFAULT_NUM_SMS)


def _interpret_params(interpret):
  if not interpret:
    return None
  params_cls = getattr(plgpu, 'InterpretGPUParams', None)
  if params_cls is None:
    raise RuntimeError(
        "Mosaic GPU interpret mode (needed to run impl='mosaic_gpu' without a GPU) "
        f"requires jax >= 0.12; this is jax {jax.__version__}. Use impl='ragged_dot' "
        "or impl='reference' on CPU.")
  return params_cls()


def _pad_rows(x_MxD, block_m):
  pad = -x_MxD.shape[0] % block_m
  return jnp.pad(x_MxD, ((0, pad), (0, 0))) if pad else x_MxD


def _offsets(group_sizes_G, num_rows):
  # Clipping keeps a contract-violating sum(group_sizes) > M from indexing past lhs.
  ends_G = jnp.minimum(jnp.cumsum(group_sizes_G.astype(jnp.int32)), num_rows)
  return jnp.concatenate([jnp.zeros((1,), jnp.int32), ends_G])


def _tile_group_ranges(offsets_Gp1, num_tiles, block_m):
  """First and last group touching each row tile; last < first for tiles past the sum."""
  ends_G = offsets_Gp1[1:]
  total = offsets_Gp1[-1]
  first_row_T = jnp.arange(num_tiles, dtype=jnp.int32) * block_m
  last_row_T = jnp.minimum(first_row_T + block_m, total) - 1
  first_T = jnp.searchsorted(ends_G, first_row_T, side='right').astype(jnp.int32)
  last_T = jnp.searchsorted(ends_G, last_row_T, side='right').astype(jnp.int32)
  last_T = jnp.where(first_row_T < total, last_T, first_T - 1)
  return first_T, last_T


def _row_mask(block_rows, block_cols, first_row, start, end):
  rows = plgpu.layout_cast(
      lax.broadcasted_iota(jnp.int32, (block_rows, block_cols), 0), plgpu.Layout.WGMMA)
  rows = rows + first_row
  return (rows >= start) & (rows < end)


def gmm(lhs_MxK, rhs, group_sizes_G, *, transpose_rhs, out_dtype, interpret=False):
  """out[m] = lhs[m] @ rhs[group(m)]; rhs is [G,K,N], or [G,N,K] when transpose_rhs."""
  m, k = lhs_MxK.shape
  n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  _check_operands(lhs_MxK.dtype, interpret)
  block_m = _BLOCK_M
  block_k = _pick_block(k, 'K (contraction)')
  block_n = _pick_block(n, 'N (output features)')
  depth = _pipeline_depth(block_m * block_k + block_k * block_n, block_m * block_n,
                          lhs_MxK.dtype, out_dtype)
  rhs = rhs.astype(lhs_MxK.dtype)
  lhs_MxK = _pad_rows(lhs_MxK, block_m)
  padded_m = lhs_MxK.shape[0]
  grid_m, grid_n = padded_m // block_m, n // block_n
  offsets_Gp1 = _offsets(group_sizes_G, m)
  first_T, last_T = _tile_group_ranges(offsets_Gp1, grid_m, block_m)

  def body(first_ref, last_ref, offsets_ref, lhs_gmem, rhs_gmem, out_gmem):
    @plgpu.nd_loop((grid_m, grid_n), collective_axes='sm')
    def _tile(loop_info):
      mi, ni = loop_info.index
      row0 = mi * block_m

      def acc_scope(acc_ref):
        @pl.loop(first_ref[mi], last_ref[mi] + 1)
        def _group(g):
          start, end = offsets_ref[g], offsets_ref[g + 1]
          straddles = (start > row0) | (end < row0 + block_m)

          def step(_, lhs_smem, rhs_smem):
            @pl.when(straddles)
            def _mask_other_groups():
              keep = _row_mask(block_m, block_k, row0, start, end)
              lhs_smem[...] = jnp.where(keep, lhs_smem[...], 0).astype(lhs_smem.dtype)
              plgpu.commit_smem()
            rhs_op = rhs_smem.transpose((1, 0)) if transpose_rhs else rhs_smem
            plgpu.wgmma(acc_ref, lhs_smem, rhs_op)

          rhs_block = (block_n, block_k) if transpose_rhs else (block_k, block_n)
          rhs_index = (lambda kk: (ni, kk)) if transpose_rhs else (lambda kk: (kk, ni))

          @pl.when(end > start)  # empty groups inside a tile contribute nothing
          def _run():
            plgpu.emit_pipeline(
                step,
                grid=(k // block_k,),
                in_specs=[
                    plgpu.BlockSpec((block_m, block_k), lambda kk: (mi, kk),
                                    delay_release=1),
                    plgpu.BlockSpec(rhs_block, rhs_index, delay_release=1),
                ],
                max_concurrent_steps=depth,
            )(lhs_gmem, rhs_gmem.at[g])
            plgpu.wgmma_wait(0)  # next group's masking rewrites SMEM the WGMMA may read

        return acc_ref[...]

      acc = pl.run_scoped(acc_scope, plgpu.ACC((block_m, block_n)))

      @functools.partial(pl.run_scoped,
                         out_smem=plgpu.SMEM((block_m, block_n), out_gmem.dtype))
      def _store(out_smem):
        out_smem[...] = acc.astype(out_smem.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(
            out_smem, out_gmem.at[pl.ds(row0, block_m), pl.ds(ni * block_n, block_n)])
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  kernel = plgpu.kernel(
      body,
      out_type=jax.ShapeDtypeStruct((padded_m, n), out_dtype),
      grid=(_num_programs(interpret),),
      grid_names=('sm',),
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
      interpret=_interpret_params(interpret),
  )
  return kernel(first_T, last_T, offsets_Gp1, lhs_MxK, rhs)[:m]


def tgmm(lhs_MxK, rhs_MxN, group_sizes_G, *, out_dtype, interpret=False):
  """out[g] = lhs[rows of g].T @ rhs[rows of g], shape [G, K, N]; empty groups give zeros."""
  m, k = lhs_MxK.shape
  n = rhs_MxN.shape[1]
  g_count = group_sizes_G.shape[0]
  _check_operands(lhs_MxK.dtype, interpret)
  block_m = _BLOCK_M
  block_k = _pick_block(k, 'K (lhs features)')
  block_n = _pick_block(n, 'N (rhs features)')
  depth = _pipeline_depth(block_m * (block_k + block_n), block_k * block_n,
                          lhs_MxK.dtype, out_dtype)
  rhs_MxN = rhs_MxN.astype(lhs_MxK.dtype)
  lhs_MxK, rhs_MxN = _pad_rows(lhs_MxK, block_m), _pad_rows(rhs_MxN, block_m)
  offsets_Gp1 = _offsets(group_sizes_G, m)
  first_block_G = offsets_Gp1[:-1] // block_m
  num_blocks_G = jnp.where(offsets_Gp1[1:] > offsets_Gp1[:-1],
                           pl.cdiv(offsets_Gp1[1:], block_m) - first_block_G, 0)
  grid_k, grid_n = k // block_k, n // block_n

  def swizzled(minor_dim):
    swizzle = plgpu.find_swizzle(minor_dim * jnp.dtype(lhs_MxK.dtype).itemsize * 8)
    elems = swizzle // jnp.dtype(lhs_MxK.dtype).itemsize
    return (plgpu.TilingTransform((8, elems)), plgpu.SwizzleTransform(swizzle))

  def body(offsets_ref, first_block_ref, num_blocks_ref, lhs_gmem, rhs_gmem, out_gmem):
    @plgpu.nd_loop((g_count, grid_k, grid_n), collective_axes='sm')
    def _tile(loop_info):
      g, ki, ni = loop_info.index
      start, end = offsets_ref[g], offsets_ref[g + 1]
      block0, num_blocks = first_block_ref[g], num_blocks_ref[g]

      def acc_scope(acc_ref):
        def step(idx, lhs_smem, rhs_smem):
          i = idx[0]

          @pl.when((i == 0) | (i == num_blocks - 1))  # only edge blocks hold other groups
          def _mask_other_groups():
            keep = _row_mask(block_m, block_k, (block0 + i) * block_m, start, end)
            lhs_smem[...] = jnp.where(keep, lhs_smem[...], 0).astype(lhs_smem.dtype)
            plgpu.commit_smem()
          plgpu.wgmma(acc_ref, lhs_smem.transpose((1, 0)), rhs_smem)

        @pl.when(num_blocks > 0)
        def _run():
          plgpu.emit_pipeline(
              step,
              grid=(num_blocks,),
              in_specs=[
                  plgpu.BlockSpec((block_m, block_k), lambda i: (block0 + i, ki),
                                  delay_release=1, transforms=swizzled(block_k)),
                  plgpu.BlockSpec((block_m, block_n), lambda i: (block0 + i, ni),
                                  delay_release=1, transforms=swizzled(block_n)),
              ],
              max_concurrent_steps=depth,
          )(lhs_gmem, rhs_gmem)
        return acc_ref[...]

      acc = pl.run_scoped(acc_scope, plgpu.ACC((block_k, block_n)))

      @functools.partial(pl.run_scoped,
                         out_smem=plgpu.SMEM((block_k, block_n), out_gmem.dtype))
      def _store(out_smem):
        out_smem[...] = acc.astype(out_smem.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(
            out_smem,
            out_gmem.at[g, pl.ds(ki * block_k, block_k), pl.ds(ni * block_n, block_n)])
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  kernel = plgpu.kernel(
      body,
      out_type=jax.ShapeDtypeStruct((g_count, k, n), out_dtype),
      grid=(_num_programs(interpret),),
      grid_names=('sm',),
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
      interpret=_interpret_params(interpret),
  )
  return kernel(offsets_Gp1, first_block_G, num_blocks_G, lhs_MxK, rhs_MxN)
