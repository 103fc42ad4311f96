"""Block-scaled grouped matmul: the MoE expert GEMMs under a quantisation recipe.

Legend: M rows (tokens sorted by group), K contraction, N output features, G groups.
Same requantisation rule as matmul.py, with the grouped primitives of
kernels/grouped_matmul doing the GEMMs:
  forward   out  = gmm(lhs, rhs)        lhs along K, rhs[g] along K   (recipe.forward)
  backward  dlhs = gmm(dout, rhs^T)     dout along N, rhs[g] along N  (recipe.backward)
            drhs = tgmm(lhs, dout)      lhs along M, dout along M     (recipe.backward)
Operands are quantised, then dequantised into the input dtype and fed to the chosen
grouped-matmul impl (float32 accumulation). For MXFP8 the dequantised values are exact in
bfloat16 (FP8 value times a power of two), so a bf16 grouped GEMM computes exactly the
block-scaled GEMM; for NVFP4 the float32 per-token scale picks up a bf16 rounding (2^-9
relative), negligible against E2M1's own 2^-2. Blocks along the token axis (weight
gradient) follow row order and may straddle two groups; each block still gets a scale
covering its own values.

Paths (GROUPED_PATHS), one math:
  'dequantize'    the above: portable (CPU, TPU, any GPU), the reference.
  'hopper_fused'  fused_grouped.py: FP8 E4M3 operands through WGMMA, per-block scales
                  applied to the FP32 accumulator inside Pallas Mosaic GPU kernels (MXFP8
                  only; Mosaic GPU interpret mode when the step compiles for the CPU,
                  platform.target_platform()).
default_grouped_path picks 'hopper_fused' on compute capability 9.x for the 'mxfp8'
recipe and 'dequantize' everywhere else (sm_100: see fused_grouped.py's docstring).
`rows` (token index of each sorted row) quantises lhs per token before the dispatch gather
on the fused path; on the dequantise path the gather happens first (same values).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from c2jax_kernels import platform as platform_lib
from c2jax_kernels.block_scaled import formats
from c2jax_kernels.block_scaled import fused_grouped
from c2jax_kernels.block_scaled import matmul
from c2jax_kernels.grouped_matmul import api as grouped_api


def _fake_quant(x, fmt, axis, dtype):
  return formats.dequantize(formats.quantize(x, fmt, axis=axis), dtype=dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _grouped(lhs_MxK, rhs_GxKxN, group_sizes_G, recipe, impl, out_dtype):
  fmt = matmul.get_recipe(recipe).forward
  dtype = lhs_MxK.dtype
  kernels = grouped_api.IMPLS[impl]
  return kernels.gmm(_fake_quant(lhs_MxK, fmt, 1, dtype),
                     _fake_quant(rhs_GxKxN, fmt, 1, dtype), group_sizes_G,
                     transpose_rhs=False, out_dtype=out_dtype,
                     interpret=grouped_api.interpret_on_this_backend(impl))


def _fwd(lhs_MxK, rhs_GxKxN, group_sizes_G, recipe, impl, out_dtype):
  out_MxN = _grouped(lhs_MxK, rhs_GxKxN, group_sizes_G, recipe, impl, out_dtype)
  return out_MxN, (lhs_MxK, rhs_GxKxN, group_sizes_G)


def _bwd(recipe, impl, out_dtype, residuals, dout_MxN):
  del out_dtype
  lhs_MxK, rhs_GxKxN, group_sizes_G = residuals
  fmt = matmul.get_recipe(recipe).backward
  dtype = lhs_MxK.dtype
  kernels = grouped_api.IMPLS[impl]
  interpret = grouped_api.interpret_on_this_backend(impl)
  dlhs_MxK = kernels.gmm(_fake_quant(dout_MxN, fmt, 1, dtype),
                         _fake_quant(rhs_GxKxN, fmt, 2, dtype), group_sizes_G,
                         transpose_rhs=True, out_dtype=lhs_MxK.dtype, interpret=interpret)
  drhs_GxKxN = kernels.tgmm(_fake_quant(lhs_MxK, fmt, 0, dtype),
                            _fake_quant(dout_MxN, fmt, 0, dtype), group_sizes_G,
                            out_dtype=rhs_GxKxN.dtype, interpret=interpret)
  return dlhs_MxK, drhs_GxKxN, np.zeros(group_sizes_G.shape, dtype=jax.dtypes.float0)


_grouped.defvjp(_fwd, _bwd)


GROUPED_PATHS = ('dequantize', 'hopper_fused')


def _fused_supports(recipe):
  spec = matmul.get_recipe(recipe)
  return fused_grouped.supports(spec.forward, spec.backward)


def default_grouped_path(recipe, device=None):
  """'hopper_fused' on sm_90 for recipes the fused kernels implement, else 'dequantize'."""
  on_hopper = matmul.default_path(device) == 'hopper_fp8'
  return 'hopper_fused' if on_hopper and _fused_supports(recipe) else 'dequantize'


def block_scaled_grouped_matmul(lhs_MxK, rhs_GxKxN, group_sizes_G, *, recipe='mxfp8',
                                impl=None, path=None, rows=None,
                                preferred_element_type=None):
  """grouped_matmul (same contract and impls) on block-quantised operands.

  path: a name in GROUPED_PATHS or None for default_grouped_path(recipe); impl is the
  float grouped GEMM of the 'dequantize' path. rows: optional [M] token index per sorted
  row, lhs then holds the [T, K] tokens before dispatch.
  """
  matmul.get_recipe(recipe)
  path = path or default_grouped_path(recipe)
  if path not in GROUPED_PATHS:
    raise ValueError(f"Unknown block-scaled grouped path {path!r}; choose one of "
                     f"{GROUPED_PATHS}.")
  if path == 'hopper_fused':
    if not _fused_supports(recipe):
      raise ValueError(f"path='hopper_fused' implements recipe 'mxfp8' only, got "
                       f"{recipe!r}; use path='dequantize' for it.")
    interpret = platform_lib.target_platform() == 'cpu'  # Mosaic GPU interpret mode (tests)
    if not interpret and matmul.default_path() != 'hopper_fp8':
      raise ValueError(f"path='hopper_fused' runs WGMMA kernels that need a Hopper GPU "
                       f"(compute capability 9.x); this is {platform_lib.target_device()}. "
                       "Leave "
                       "path=None to pick the path for this device.")
    return fused_grouped.fused_grouped_matmul(
        lhs_MxK, rhs_GxKxN, group_sizes_G, rows=rows,
        preferred_element_type=preferred_element_type, interpret=interpret)
  if rows is not None:
    lhs_MxK = jnp.take(lhs_MxK, rows, axis=0)
  impl = grouped_api.check_args(lhs_MxK, rhs_GxKxN, group_sizes_G, impl)
  out_dtype = jnp.dtype(preferred_element_type or lhs_MxK.dtype)
  return _grouped(lhs_MxK, rhs_GxKxN, group_sizes_G.astype(jnp.int32), recipe, impl,
                  out_dtype)
