"""`grouped_matmul`: the MoE expert matmul on tokens sorted by expert, with a custom VJP.

Legend: M rows (tokens sorted by group), K contraction, N output features, G groups.
Group g owns rows [offsets[g], offsets[g+1]), offsets = [0, cumsum(group_sizes)];
sum(group_sizes) <= M and rows past the sum are zero in the output and in dlhs.

Every implementation provides the same two primitives, so the VJP is written once:
  gmm(lhs_MxK, rhs, group_sizes_G, *, transpose_rhs, out_dtype, interpret) -> [M, N]
      rhs is [G, K, N], or [G, N, K] (contracted on its last axis) when transpose_rhs;
  tgmm(lhs_MxK, rhs_MxN, group_sizes_G, *, out_dtype, interpret) -> [G, K, N]
      the per-group lhs.T @ rhs over each group's rows (the weight gradient).
Forward: gmm(lhs, rhs). Input gradient: gmm(dout, rhs, transpose_rhs=True), i.e. against
the transposed weights. Weight gradient: tgmm(lhs, dout).
"""

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from c2jax_kernels import platform as platform_lib
from c2jax_kernels.grouped_matmul import library
from c2jax_kernels.grouped_matmul import megablox
from c2jax_kernels.grouped_matmul import mosaic_gpu
from c2jax_kernels.grouped_matmul import ragged
from c2jax_kernels.grouped_matmul import reference
from c2jax_kernels.grouped_matmul import tiled


@dataclasses.dataclass(frozen=True)
class GroupedMatmulImpl:
  gmm: Callable
  tgmm: Callable
  is_pallas: bool  # Pallas kernels switch to interpret mode on CPU


IMPLS = {
    'mosaic_gpu': GroupedMatmulImpl(mosaic_gpu.gmm, mosaic_gpu.tgmm, is_pallas=True),
    'megablox': GroupedMatmulImpl(megablox.gmm, megablox.tgmm, is_pallas=True),
    # lax.ragged_dot: native on TPU; XLA's GPU compiler expands it into a dense product per
    # group; the `tiled` loop on CPU (XLA has no CPU lowering).
    'ragged_dot': GroupedMatmulImpl(ragged.gmm, ragged.tgmm, is_pallas=False),
    # A fori_loop of row-tile matmuls in plain XLA, any platform (tiled.py).
    'tiled': GroupedMatmulImpl(tiled.gmm, tiled.tgmm, is_pallas=False),
    'reference': GroupedMatmulImpl(reference.gmm, reference.tgmm, is_pallas=False),
    # tokamax's kernels (library.py): Mosaic GPU on sm_90 / sm_100, gmm_v2 on TPU, XLA on
    # CPU; `pip install -e .[kernels]`.
    'tokamax': GroupedMatmulImpl(library.gmm, library.tgmm, is_pallas=False),
}

DEFAULT_IMPL_BY_PLATFORM = {'gpu': 'mosaic_gpu', 'cuda': 'mosaic_gpu',
                            'tpu': 'megablox', 'cpu': 'ragged_dot'}
# The Mosaic GPU kernel issues Hopper's warpgroup MMA (wgmma), which neither earlier nor
# later generations have (ptxas rejects it for sm_100). Blackwell (sm_100) gets tokamax's
# tcgen05 kernels where the package is installed (library.py; docs/kernels.md). Other
# GPUs (NVIDIA or ROCm) get 'tiled': XLA's GPU compiler expands ragged_dot into one dense
# product per group (the GPU compiler's buffers for DeepSeek-V3's expert layer on a B200,
# forward and both gradients: ragged_dot 30.1 GB of temporaries, tiled 2.0 GB).
_MOSAIC_GPU_MAJORS = (9,)
_LIBRARY_GPU_MAJORS = (10,)
_OTHER_GPUS = 'tiled'


def default_impl(platform=None):
  """The implementation used when `impl=None`, for `platform` (default: the target's,
  platform.target_platform()); on GPUs by the target device's compute capability."""
  platform = platform or platform_lib.target_platform()
  if platform not in DEFAULT_IMPL_BY_PLATFORM:
    raise ValueError(f"No default grouped-matmul impl for platform {platform!r}; pass "
                     f"impl= one of {sorted(IMPLS)}.")
  impl = DEFAULT_IMPL_BY_PLATFORM[platform]
  device = platform_lib.target_device()
  if impl == 'mosaic_gpu' and device.platform == 'gpu':  # else: no device to ask
    major = platform_lib.gpu_major(device)
    if major in _LIBRARY_GPU_MAJORS and platform_lib.library_installed():
      return 'tokamax'
    if major not in _MOSAIC_GPU_MAJORS:
      return _OTHER_GPUS
  return impl


def interpret_on_this_backend(impl):
  """Pallas impls run in interpret mode when the program compiles for the CPU (Mosaic
  compiles them for a TPU or GPU target, even one with compile-only devices)."""
  return IMPLS[impl].is_pallas and platform_lib.target_platform() == 'cpu'


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _grouped_matmul(lhs_MxK, rhs_GxKxN, group_sizes_G, impl, out_dtype):
  return IMPLS[impl].gmm(lhs_MxK, rhs_GxKxN, group_sizes_G, transpose_rhs=False,
                         out_dtype=out_dtype, interpret=interpret_on_this_backend(impl))


def _fwd(lhs_MxK, rhs_GxKxN, group_sizes_G, impl, out_dtype):
  out_MxN = _grouped_matmul(lhs_MxK, rhs_GxKxN, group_sizes_G, impl, out_dtype)
  return out_MxN, (lhs_MxK, rhs_GxKxN, group_sizes_G)


def _bwd(impl, out_dtype, residuals, dout_MxN):
  del out_dtype
  lhs_MxK, rhs_GxKxN, group_sizes_G = residuals
  kernels, interpret = IMPLS[impl], interpret_on_this_backend(impl)
  # The kernels multiply operands of one dtype; the cotangent follows the inputs' dtype.
  dout_MxN = dout_MxN.astype(lhs_MxK.dtype)
  dlhs_MxK = kernels.gmm(dout_MxN, rhs_GxKxN, group_sizes_G, transpose_rhs=True,
                         out_dtype=lhs_MxK.dtype, interpret=interpret)
  drhs_GxKxN = kernels.tgmm(lhs_MxK, dout_MxN, group_sizes_G,
                            out_dtype=rhs_GxKxN.dtype, interpret=interpret)
  dgroup_sizes = np.zeros(group_sizes_G.shape, dtype=jax.dtypes.float0)
  return dlhs_MxK, drhs_GxKxN, dgroup_sizes


_grouped_matmul.defvjp(_fwd, _bwd)


def check_args(lhs_MxK, rhs_GxKxN, group_sizes_G, impl):
  """Validates grouped-matmul arguments; returns the impl name to use."""
  impl = impl or default_impl()
  if impl not in IMPLS:
    raise ValueError(f"Unknown grouped-matmul impl {impl!r}; choose one of {sorted(IMPLS)}.")
  if lhs_MxK.ndim != 2 or rhs_GxKxN.ndim != 3 or group_sizes_G.ndim != 1:
    raise ValueError(
        "grouped_matmul expects lhs [M, K], rhs [G, K, N], group_sizes [G]; got shapes "
        f"{lhs_MxK.shape}, {rhs_GxKxN.shape}, {group_sizes_G.shape}.")
  if lhs_MxK.shape[1] != rhs_GxKxN.shape[1] or rhs_GxKxN.shape[0] != group_sizes_G.shape[0]:
    raise ValueError(
        f"grouped_matmul shape mismatch: lhs {lhs_MxK.shape} needs rhs [G, {lhs_MxK.shape[1]}"
        f", N] with G = len(group_sizes) = {group_sizes_G.shape[0]}; got rhs "
        f"{rhs_GxKxN.shape}.")
  if not jnp.issubdtype(group_sizes_G.dtype, jnp.integer):
    raise ValueError(f"group_sizes must be integers, got {group_sizes_G.dtype}.")
  return impl


def grouped_matmul(lhs_MxK, rhs_GxKxN, group_sizes_G, *, impl=None,
                   preferred_element_type=None):
  """out[m] = lhs[m] @ rhs[g] for the group g owning row m; zero rows past sum(sizes).

  Args:
    lhs_MxK: [M, K] rows sorted by group.
    rhs_GxKxN: [G, K, N] one weight matrix per group.
    group_sizes_G: [G] integer rows per group (may be 0), summing to at most M.
    impl: one of IMPLS, or None for the platform default (Hopper: 'mosaic_gpu',
      Blackwell: 'tokamax' where installed, other GPUs: 'tiled', tpu: 'megablox', cpu:
      'ragged_dot'). Pallas impls run interpreted on CPU.
    preferred_element_type: output dtype (accumulation is float32); default lhs dtype.

  Returns:
    [M, N] array. Differentiable in lhs and rhs (custom VJP, see module docstring).
  """
  impl = check_args(lhs_MxK, rhs_GxKxN, group_sizes_G, impl)
  out_dtype = jnp.dtype(preferred_element_type or lhs_MxK.dtype)
  return _grouped_matmul(lhs_MxK, rhs_GxKxN, group_sizes_G.astype(jnp.int32), impl,
                         out_dtype)
