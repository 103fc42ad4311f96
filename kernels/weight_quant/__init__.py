"""Weight-only quantised weights resident in an inference engine (formats.py) and the
grouped matmul that dequantises them a tile at a time (grouped.py)."""

from c2jax_kernels.weight_quant.formats import SCHEMES
from c2jax_kernels.weight_quant.formats import WEIGHT_QUANT_CHOICES
from c2jax_kernels.weight_quant.formats import WeightQuant
from c2jax_kernels.weight_quant.formats import abstract_quantized
from c2jax_kernels.weight_quant.formats import dequantize_weight
from c2jax_kernels.weight_quant.formats import is_quantized
from c2jax_kernels.weight_quant.formats import quantize_weight
from c2jax_kernels.weight_quant.formats import resident_bytes
from c2jax_kernels.weight_quant.grouped import IMPLS
from c2jax_kernels.weight_quant.grouped import default_impl
from c2jax_kernels.weight_quant.grouped import quantized_grouped_matmul

__all__ = ['IMPLS', 'SCHEMES', 'WEIGHT_QUANT_CHOICES', 'WeightQuant', 'abstract_quantized',
           'default_impl', 'dequantize_weight', 'is_quantized', 'quantize_weight',
           'quantized_grouped_matmul', 'resident_bytes']
