"""Block-scaled matmul `a[..., K] @ b[K, N]` with a custom VJP that requantises gradients.

Legend: M rows of a (all leading axes flattened), K contraction, N output features.
Every GEMM quantises both operands in blocks along ITS OWN contraction axis:
  forward   y[M,N]  = a[M,K] . b[K,N]     a along K, b along K   (recipe.forward format)
  backward  da[M,K] = dy[M,N] . b[K,N]^T  dy along N, b along N  (recipe.backward format)
            db[K,N] = a[M,K]^T . dy[M,N]  a along M, dy along M  (recipe.backward format)
The quantiser has no derivative of its own (straight-through): gradients flow as if the
GEMMs had been exact, but each is computed on requantised operands.

Paths (PATHS), all computing the same math with float32 accumulation:
  'scaled_matmul': jax.nn.scaled_matmul on the FP8/FP4 values and scales (cuDNN
    block-scaled tensor cores on Blackwell; XLA decomposes it on other backends).
  'hopper_fp8': one FP8 x FP8 -> FP32 GEMM per scale block, each partial sum scaled and
    accumulated in FP32 (scale promotion; FP8 tensor cores on Hopper), see hopper.py.
  'dequantize': dequantise to float32 and run an ordinary dot; portable (CPU included).
default_path picks by device: compute capability 9.x -> 'hopper_fp8', 10.x ->
'scaled_matmul', anything else (older GPUs, CPU, TPU) -> 'dequantize'.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from c2jax_kernels import platform as platform_lib
from c2jax_kernels.block_scaled import formats
from c2jax_kernels.block_scaled import hopper


@dataclasses.dataclass(frozen=True)
class MatmulRecipe:
  forward: str  # format of the forward GEMM's operands
  backward: str  # format of both gradient GEMMs' operands


RECIPES = {
    'mxfp8': MatmulRecipe(forward='mxfp8_e4m3', backward='mxfp8_e4m3'),
    'nvfp4_fwd_mxfp8_bwd': MatmulRecipe(forward='nvfp4', backward='mxfp8_e4m3'),
}


def get_recipe(name):
  if name not in RECIPES:
    raise ValueError(f"Unknown block-scaled recipe {name!r}; choose one of {sorted(RECIPES)}.")
  return RECIPES[name]


def _matmul_scaled(lhs_q, rhs_q):
  values_l = lhs_q.values[None]
  values_r = rhs_q.values[None]
  out_1xMxP = jax.nn.scaled_matmul(values_l, values_r, lhs_q.scales[None],
                                   rhs_q.scales[None], preferred_element_type=jnp.float32)
  out_MxP = out_1xMxP[0]
  # Per-token scales are constant along the contraction, so they factor out of the sum.
  if lhs_q.token_scales is not None:
    out_MxP = out_MxP * lhs_q.token_scales
  if rhs_q.token_scales is not None:
    out_MxP = out_MxP * rhs_q.token_scales.T
  return out_MxP


def _matmul_dequantized(lhs_q, rhs_q):
  return jnp.einsum('mc,pc->mp', formats.dequantize_padded(lhs_q),
                    formats.dequantize_padded(rhs_q), preferred_element_type=jnp.float32,
                    precision=jax.lax.Precision.HIGHEST)


PATHS = {'scaled_matmul': _matmul_scaled, 'hopper_fp8': hopper.fp8_promoted_gemm,
         'dequantize': _matmul_dequantized}

# GPU compute-capability major version -> the path using that generation's tensor cores.
_GPU_PATHS = {9: 'hopper_fp8', 10: 'scaled_matmul'}


def default_path(device=None):
  """The path for `device` (default: the device the program compiles for,
  platform.target_device()); see the module docstring."""
  # NVIDIA devices report e.g. '9.0'; ROCm reports a gfx name, which gets the portable path.
  return _GPU_PATHS.get(platform_lib.gpu_major(device), 'dequantize')


def quantized_gemm(lhs_MxC, lhs_axis, rhs, rhs_axis, fmt, path):
  """float32 [M, P] = lhs . rhs contracted over C, both quantised along C in `fmt`.

  lhs_MxC is 2-D with C on `lhs_axis`; rhs is 2-D with C on `rhs_axis`, P on the other.
  """
  lhs_q = formats.quantize(lhs_MxC, fmt, axis=lhs_axis)
  rhs_q = formats.quantize(rhs, fmt, axis=rhs_axis)
  return PATHS[path](lhs_q, rhs_q)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _block_scaled_matmul(a_MxK, b_KxN, recipe, path, out_dtype):
  fmt = get_recipe(recipe).forward
  return quantized_gemm(a_MxK, 1, b_KxN, 0, fmt, path).astype(out_dtype)


def _fwd(a_MxK, b_KxN, recipe, path, out_dtype):
  # Keep the unquantised operands: the backward GEMMs quantise them along other axes.
  return _block_scaled_matmul(a_MxK, b_KxN, recipe, path, out_dtype), (a_MxK, b_KxN)


def _bwd(recipe, path, out_dtype, residuals, dy_MxN):
  del out_dtype
  a_MxK, b_KxN = residuals
  fmt = get_recipe(recipe).backward
  da_MxK = quantized_gemm(dy_MxN, 1, b_KxN, 1, fmt, path)
  db_KxN = quantized_gemm(a_MxK, 0, dy_MxN, 0, fmt, path)
  return da_MxK.astype(a_MxK.dtype), db_KxN.astype(b_KxN.dtype)


_block_scaled_matmul.defvjp(_fwd, _bwd)


def block_scaled_matmul(a, b, *, recipe='mxfp8', path=None, preferred_element_type=None):
  """a[..., K] @ b[K, N] on block-quantised operands; see the module docstring.

  Args:
    a: [..., K] activations. b: [K, N] weights.
    recipe: a name in RECIPES ('mxfp8' or 'nvfp4_fwd_mxfp8_bwd').
    path: a name in PATHS, or None for default_path() (by the device's generation).
    preferred_element_type: output dtype; default a.dtype. Accumulation is float32.
  """
  get_recipe(recipe)
  path = path or default_path()
  if path not in PATHS:
    raise ValueError(f"Unknown block-scaled matmul path {path!r}; choose one of "
                     f"{sorted(PATHS)}.")
  if b.ndim != 2 or a.shape[-1] != b.shape[0]:
    raise ValueError(f"block_scaled_matmul expects a [..., K] and b [K, N]; got {a.shape} "
                     f"and {b.shape}.")
  out_dtype = jnp.dtype(preferred_element_type or a.dtype)
  a_MxK = a.reshape(-1, a.shape[-1])
  y_MxN = _block_scaled_matmul(a_MxK, b, recipe, path, out_dtype)
  return y_MxN.reshape(*a.shape[:-1], b.shape[1])
