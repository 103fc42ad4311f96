"""Block-scaled FP8/FP4: formats (quantize/dequantize), matmul and grouped matmul."""

from kernels.block_scaled.formats import FORMATS
from kernels.block_scaled.formats import QuantizedArray
from kernels.block_scaled.formats import dequantize
from kernels.block_scaled.formats import quantize
from kernels.block_scaled.grouped import block_scaled_grouped_matmul
from kernels.block_scaled.matmul import PATHS
from kernels.block_scaled.matmul import RECIPES
from kernels.block_scaled.matmul import block_scaled_matmul
from kernels.block_scaled.matmul import default_path

__all__ = ['FORMATS', 'PATHS', 'QuantizedArray', 'RECIPES', 'block_scaled_grouped_matmul',
           'block_scaled_matmul', 'default_path', 'dequantize', 'quantize']
