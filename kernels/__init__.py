"""Pallas kernels, each with a custom VJP, per-backend implementations and a jnp reference.

- grouped_matmul(lhs_MxK, rhs_GxKxN, group_sizes_G, *, impl=None,
  preferred_element_type=None) -> [M, N]: the MoE expert matmul (kernels/grouped_matmul);
  impls: grouped_matmul_impls(), default per platform: default_grouped_matmul_impl().
- target_platform(): the platform a traced step compiles for (the mesh in force's
  devices, else JAX's backend); it picks the default impls and Pallas interpret mode.
  target_device(): one of those devices (a GPU's compute capability picks GPU paths).
- quantize(x, fmt, axis=-1) -> QuantizedArray; dequantize(q, dtype=None); fmt in
  BLOCK_FORMATS ('mxfp8_e4m3', 'mxfp8_e5m2', 'nvfp4') (kernels/block_scaled/formats.py).
- block_scaled_matmul(a, b, *, recipe='mxfp8', path=None, preferred_element_type=None)
  and block_scaled_grouped_matmul(lhs, rhs, group_sizes, *, recipe='mxfp8', impl=None,
  path=None, rows=None, preferred_element_type=None); recipes in BLOCK_SCALED_RECIPES.
  The grouped path 'hopper_fused' (default on sm_90 for 'mxfp8') runs FP8 WGMMA kernels
  with the block scales applied inside (kernels/block_scaled/fused_grouped.py).
- lm_head_loss (a module): linear_cross_entropy(x_TxD, kernel_DxV, labels_T) -> [T], the
  LM head's matmul and cross entropy fused, through tokamax (kernels/lm_head_loss.py).
- cpu_matmul (imported as a module): panel_matmul(x, pack(kernel)), a few-row float32
  matmul for XLA:CPU decode steps, C++ through XLA's FFI, built on first use
  (kernels/cpu_matmul).
"""

from c2jax_kernels.block_scaled import FORMATS as BLOCK_FORMATS
from c2jax_kernels.block_scaled import RECIPES as BLOCK_SCALED_RECIPES
from c2jax_kernels.block_scaled import QuantizedArray
from c2jax_kernels.block_scaled import block_scaled_grouped_matmul
from c2jax_kernels.block_scaled import block_scaled_matmul
from c2jax_kernels.block_scaled import dequantize
from c2jax_kernels.block_scaled import quantize
from c2jax_kernels import lm_head_loss
from c2jax_kernels.grouped_matmul import IMPLS as _GROUPED_MATMUL_IMPLS
from c2jax_kernels.grouped_matmul import default_impl as default_grouped_matmul_impl
from c2jax_kernels.grouped_matmul import grouped_matmul
from c2jax_kernels.platform import target_device
from c2jax_kernels.platform import target_platform


def grouped_matmul_impls():
  """Names accepted by `grouped_matmul(..., impl=)`."""
  return tuple(_GROUPED_MATMUL_IMPLS)


__all__ = ['BLOCK_FORMATS', 'BLOCK_SCALED_RECIPES', 'QuantizedArray',
           'block_scaled_grouped_matmul', 'block_scaled_matmul', 'default_grouped_matmul_impl',
           'dequantize', 'grouped_matmul', 'grouped_matmul_impls', 'quantize',
           'target_device', 'target_platform']
