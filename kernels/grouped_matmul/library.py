"""Grouped matmul through tokamax, the OpenXLA kernel library (`pip install -e .[kernels]`).

tokamax's ragged dot has the three products c2jax's VJP needs as dimension numbers: the
forward (rows ragged, rhs [G, K, N]), the input gradient (the same with rhs contracted on
its last axis) and the weight gradient (the ragged row axis contracted: one [K, N] block
per group). Which of tokamax's kernels runs is chosen here per target platform and
product before tracing, never by catching a kernel's refusal:
  gpu: 'mosaic_gpu' (Pallas Mosaic GPU: WGMMA kernels on sm_90, tcgen05 on sm_100). On
       sm_100 tokamax 0.0.17 has no weight-gradient kernel and its forward kernel writes
       16-bit outputs only: those products run as c2jax's 'tiled' loop (XLA's own
       ragged_dot expands into one dense product per group), and its heuristic tiles
       need more shared memory than an SM has, so a config that fits is given (gpu_kernel).
       Rows past the routed sum, which the kernels leave unwritten, are zeroed here, and
       so are the weight gradients of empty groups (used_groups_only).
  tpu: gmm_v2, tokamax's second-generation TPU grouped matmul, with megablox.py's tiles
       (512 rows, 1,024 of K and N): its own VMEM-aware tiling picks the whole K (7,168)
       at DeepSeek-V3's and Kimi-K2.5's expert shapes and runs out of VMEM compiling for
       v5p ('CompileTimeScopedVmemOom'). Its weight-gradient kernel needs the local group
       count, passed here (tokamax otherwise takes it from its own VJP only).
  cpu: tokamax's 'xla' implementation (lax.ragged_dot). Neither Mosaic kernel runs here:
       the Mosaic GPU kernels size their grid from the default device's SM count, and
       gmm_v2 uses SMEM scalars that Pallas' TPU interpreter does not simulate.

Legend: M rows, K contraction, N output features, G groups (see reference.py).
"""

import jax
import jax.numpy as jnp

from c2jax_kernels import platform as platform_lib
from c2jax_kernels.grouped_matmul import tiled

# tokamax's name for its kernel on each platform.
IMPLEMENTATION_BY_PLATFORM = {'gpu': 'mosaic_gpu', 'tpu': 'mosaic_tpu_v2', 'cpu': 'xla'}

FORWARD = jax.lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(((1,), (1,)), ((), ())), lhs_ragged_dimensions=[0],
    rhs_group_dimensions=[0])
TRANSPOSED_RHS = jax.lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(((1,), (2,)), ((), ())), lhs_ragged_dimensions=[0],
    rhs_group_dimensions=[0])
RAGGED_CONTRACTING = jax.lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(((0,), (0,)), ((), ())), lhs_ragged_dimensions=[0],
    rhs_group_dimensions=[])


def tokamax():
  return platform_lib.library("grouped_matmul impl='tokamax'")


def implementation(platform=None) -> str:
  """tokamax's implementation name for the target platform."""
  platform = platform or platform_lib.target_platform()
  if platform not in IMPLEMENTATION_BY_PLATFORM:
    raise ValueError(f"grouped_matmul impl='tokamax' has no kernel for platform "
                     f"{platform!r}; it runs on {sorted(IMPLEMENTATION_BY_PLATFORM)}. Use "
                     "impl='tiled' (portable) or the platform's default (impl=None).")
  return IMPLEMENTATION_BY_PLATFORM[platform]


_TPU_ROWS, _TPU_COLS, _TPU_MIN_ROWS = 512, 1024, 128  # as megablox.py
_TPU_DMA_BYTES = 512
_SM100_BLOCK_K, _SM100_STAGES = 128, 2


def tpu_kernel(k, n, m, dtype, *, num_actual_groups=None):
  """tokamax's gmm_v2 op with explicit tiles for a product contracting k into n columns
  over m rows (for the weight gradient: m contracted, [k, n] per group)."""
  tokamax()  # the clear error when the package is missing
  if min(k, n) * jnp.dtype(dtype).itemsize < _TPU_DMA_BYTES:
    # Mosaic: 'The contiguous inner slice in the DMA transfer must be divisible by 512
    # bytes' (K 64 compiles for none of the three products).
    raise ValueError(
        f"grouped_matmul impl='tokamax' on TPU (gmm_v2) needs rows of at least "
        f"{_TPU_DMA_BYTES} bytes in every operand: hidden and expert widths {k} and {n} "
        f"in {jnp.dtype(dtype).name} are narrower. Use impl='megablox' (the TPU default).")
  from tokamax._src.ops.ragged_dot import pallas_mosaic_tpu_v2  # pylint: disable=g-import-not-at-top
  config = pallas_mosaic_tpu_v2.Config(
      tile_m=_TPU_ROWS if m >= _TPU_ROWS else _TPU_MIN_ROWS,
      tile_k=min(_TPU_COLS, k), tile_n=min(_TPU_COLS, n))
  return [pallas_mosaic_tpu_v2.PallasMosaicTpuV2RaggedDot(
      config=config, num_actual_groups=num_actual_groups, bypass_device_check=True)]


def gpu_kernel(major):
  """tokamax's Mosaic GPU op for a GPU of compute capability `major`.x: its heuristic
  config on sm_90; on sm_100 one that fits the SM's shared memory."""
  tokamax()
  if major != 10:
    return 'mosaic_gpu'
  from tokamax._src.ops.ragged_dot import pallas_mosaic_gpu  # pylint: disable=g-import-not-at-top
  from tokamax._src.ops.ragged_dot import pallas_mosaic_gpu_common as common  # pylint: disable=g-import-not-at-top
  # tokamax 0.0.17's sm_100 heuristic for bf16 (block_k 256, two stages, 2-CTA MMA) needs
  # 263,268 bytes of shared memory, more than a B200 SM has (232,448): the compile fails
  # ('Mosaic GPU kernel exceeds available shared memory'). Half the K block fits; the rest
  # is tokamax's heuristic.
  config = common.Config(
      block_m=64, block_n=128, block_k=_SM100_BLOCK_K, num_stages=_SM100_STAGES, split_k=1,
      persistent=False, collective=True, grid_minor_dim=common.MatmulDimension.M,
      grid_tile_width=4)
  return [pallas_mosaic_gpu.PallasMosaicGpuRaggedDot(config=config, bypass_device_check=True)]


def call(lhs, rhs, group_sizes_G, numbers, out_dtype, kernel, **kwargs):
  """tokamax's ragged_dot_general with `kernel` (an implementation name, or a list holding
  one op). The Mosaic kernels accumulate in float32 and write out_dtype (a float32
  [G, K, N] weight gradient would be 1.9 GB of temporaries at DeepSeek-V3's expert shape);
  XLA's ragged_dot accumulates in the type it is asked for, so it is asked for float32."""
  accumulate = jnp.float32 if kernel == 'xla' else out_dtype
  out = tokamax().ragged_dot_general(
      lhs, rhs, group_sizes_G.astype(jnp.int32), numbers,
      preferred_element_type=accumulate, implementation=kernel, **kwargs)
  return out.astype(out_dtype)


def routed_rows_only(out_MxN, group_sizes_G):
  """Zeroes the rows past sum(group_sizes), which tokamax's Mosaic GPU kernels leave
  unwritten (Mosaic GPU interpret mode returns them as NaN; on a GPU they hold whatever
  the buffer held), as c2jax's contract promises."""
  rows_M = jnp.arange(out_MxN.shape[0], dtype=jnp.int32)
  return jnp.where((rows_M < jnp.sum(group_sizes_G))[:, None], out_MxN, 0).astype(out_MxN.dtype)


def _gpu_call(lhs, rhs, group_sizes_G, numbers, out_dtype):
  # tokamax picks its sm_90 or sm_100 kernel, and sizes the persistent grid, from JAX's
  # default device: make that the target GPU (a compile-only one under `plan --target`).
  device = platform_lib.target_device()
  with jax.default_device(device):
    return call(lhs, rhs, group_sizes_G, numbers, out_dtype,
                gpu_kernel(platform_lib.gpu_major(device)))


def gmm(lhs_MxK, rhs, group_sizes_G, *, transpose_rhs, out_dtype, interpret=False):
  numbers = TRANSPOSED_RHS if transpose_rhs else FORWARD
  impl = implementation()
  if impl == 'mosaic_tpu_v2':
    m, k = lhs_MxK.shape
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    # Rows past the routed sum are left unwritten unless the kernel zeroes them.
    return call(lhs_MxK, rhs, group_sizes_G, numbers, out_dtype,
                tpu_kernel(k, n, m, lhs_MxK.dtype), zero_initialize=True)
  if impl != 'mosaic_gpu':
    return call(lhs_MxK, rhs, group_sizes_G, numbers, out_dtype, impl)
  if platform_lib.gpu_major() == 10 and jnp.dtype(out_dtype).itemsize != 2:
    # tokamax 0.0.17's sm_100 kernel writes 16-bit outputs only (a float32 one fails
    # Mosaic's layout inference: 'no optimized SMEM <-> registers transfer plan ... for
    # register layout TCGEN05_TRANSPOSED').
    return tiled.gmm(lhs_MxK, rhs, group_sizes_G, transpose_rhs=transpose_rhs,
                     out_dtype=out_dtype, interpret=interpret)
  return routed_rows_only(_gpu_call(lhs_MxK, rhs, group_sizes_G, numbers, out_dtype),
                          group_sizes_G)


def used_groups_only(out_GxKxN, group_sizes_G):
  """Zeroes the weight gradient of groups that received no rows. Neither of tokamax's
  weight-gradient kernels could be run here (docs/kernels.md), so whether they write an
  empty group's block is unverified; c2jax's contract says it is zero."""
  return jnp.where((group_sizes_G > 0)[:, None, None], out_GxKxN, 0).astype(out_GxKxN.dtype)


def tgmm(lhs_MxK, rhs_MxN, group_sizes_G, *, out_dtype, interpret=False):
  impl = implementation()
  if impl == 'mosaic_tpu_v2':
    (m, k), n = lhs_MxK.shape, rhs_MxN.shape[1]
    return used_groups_only(
        call(lhs_MxK, rhs_MxN, group_sizes_G, RAGGED_CONTRACTING, out_dtype,
             tpu_kernel(k, n, m, lhs_MxK.dtype, num_actual_groups=group_sizes_G.shape[0])),
        group_sizes_G)
  if impl != 'mosaic_gpu':
    return call(lhs_MxK, rhs_MxN, group_sizes_G, RAGGED_CONTRACTING, out_dtype, impl)
  if platform_lib.gpu_major() != 9:
    # tokamax 0.0.17 implements the ragged-contracting product on sm_90 only.
    return tiled.tgmm(lhs_MxK, rhs_MxN, group_sizes_G, out_dtype=out_dtype,
                      interpret=interpret)
  return used_groups_only(
      _gpu_call(lhs_MxK, rhs_MxN, group_sizes_G, RAGGED_CONTRACTING, out_dtype),
      group_sizes_G)
