"""Quantisation recipes for the model's matmuls; kernels/block_scaled does the math.

`config.quant` names a recipe in RECIPES:
  'none'                 plain matmuls in the input dtype;
  'mxfp8'                every GEMM (forward and both gradients) in MXFP8 (E4M3 values,
                         E8M0 scale per 32 elements), operands requantised along each
                         GEMM's own contraction axis;
  'nvfp4_fwd_mxfp8_bwd'  forward GEMM in NVFP4 (E2M1, E4M3 scale per 16, FP32 per-token
                         scale), gradient GEMMs in MXFP8 (the report's RL MoE recipe).

Signatures the model calls:
  dot(recipe, x, w, *, preferred_element_type=None) -> [..., N]
      x [..., K] @ w [K, N] (dense projections).
  grouped_dot(recipe, lhs, rhs, group_sizes, *, impl=None, rows=None,
              preferred_element_type=None)
      -> [M, N]: lhs [M, K] rows sorted by expert, rhs [E, K, N], group_sizes [E] rows per
      expert (sum <= M; rows past the sum are zero); impl is a kernels.grouped_matmul impl
      ('mosaic_gpu' | 'megablox' | 'ragged_dot' | 'reference', None = platform default).
      With rows [M] (token of each sorted row) lhs is the [T, K] tokens before dispatch:
      'mxfp8' quantises them to MXFP8 once per token and gathers FP8. On Hopper the
      block-scaled recipes run the fused FP8 kernels (kernels/block_scaled/fused_grouped.py)
      where they apply, the dequantise path elsewhere.
  check_recipe(recipe): raises ValueError naming the valid recipes (config validation).
All are differentiable (custom VJPs) and jit-compatible; `recipe` must be static.
"""

from c2jax.quant.recipes import RECIPES
from c2jax.quant.recipes import check_recipe
from c2jax.quant.recipes import dot
from c2jax.quant.recipes import grouped_dot

__all__ = ['RECIPES', 'check_recipe', 'dot', 'grouped_dot']
