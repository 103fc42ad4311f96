"""Block-scaled FP8/FP4: formats (quantize/dequantize), matmul and grouped matmul."""

from c2jax_kernels.block_scaled.formats import FORMATS
from c2jax_kernels.block_scaled.formats import QuantizedArray
from c2jax_kernels.block_scaled.formats import dequantize
from c2jax_kernels.block_scaled.formats import quantize
from c2jax_kernels.block_scaled.fused_grouped import fused_grouped_matmul
from c2jax_kernels.block_scaled.grouped import GROUPED_PATHS
from c2jax_kernels.block_scaled.grouped import block_scaled_grouped_matmul
from c2jax_kernels.block_scaled.grouped import default_grouped_path
from c2jax_kernels.block_scaled.matmul import PATHS
from c2jax_kernels.block_scaled.matmul import RECIPES
from c2jax_kernels.block_scaled.matmul import block_scaled_matmul
from c2jax_kernels.block_scaled.matmul import default_path

__all__ = ['FORMATS', 'GROUPED_PATHS', 'PATHS', 'QuantizedArray', 'RECIPES',
           'block_scaled_grouped_matmul', 'block_scaled_matmul', 'default_grouped_path',
           'default_path', 'dequantize', 'fused_grouped_matmul', 'quantize']
