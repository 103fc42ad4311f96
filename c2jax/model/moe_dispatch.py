"""MoE dispatch: run the chosen SwiGLU experts on their tokens and combine by gate weight.

Every implementation is a function
    dispatch(x_TxD, weights_TxK, indices_TxK, experts: ExpertWeights, *, quant='none')
        -> y_TxD
with y_t = sum_k weights[t, k] * expert_{indices[t, k]}(x_t) and
expert_e(x) = (silu(x W_gate[e]) * (x W_up[e])) W_down[e]; every expert matmul (forward
and both gradients) runs under the c2jax.quant recipe `quant` (cfg.quant).
  dense   every expert on every token (O(T*E*F) work): the reference; quantised through
          quant.dot per expert, which quantises exactly the operands the sorted
          dispatches quantise in the forward pass.
  ragged  sort token copies by expert, grouped matmuls through `lax.ragged_dot` (native
          on GPU/TPU; on CPU, where XLA has no grouped GEMM, a loop of row-tile
          matmuls with the same numerics, kernels/grouped_matmul/tiled.py).
  pallas  the same sort, grouped matmuls through the Pallas kernels of kernels/ (Mosaic
          GPU on GPUs, megablox on TPUs; on CPU megablox runs in Pallas' interpreter,
          which is slow and meant for tests). Mosaic GPU on hardware needs bfloat16
          compute (cfg.dtype) and D, F multiples of 64; it says so when they are not.
  gathered  each token copy gathers its expert's weights and runs a batched
          matrix-vector product: reads M expert weights, not E. For calls with few
          tokens (decode steps); `select` picks it there, whatever cfg.moe_impl says
          (and picks 'ragged' over 'dense' for every call against a KV cache).
Register a new one with `DISPATCH['name'] = fn`; config validation reads the keys.

Products with the float32 gate weights and the sum over k happen in float32, as HF
does; the result is cast back to x's dtype. Under a block-scaled recipe the sorted
dispatches hand the tokens to the first two grouped GEMMs UNSORTED with their sort order
(`rows`), so the recipe quantises each token to MXFP8 once before the dispatch gather,
and expert outputs come back in bfloat16 for the combine (Composer 2's MoE recipe); the
dense reference rounds its expert outputs to bfloat16 the same way.

Einsum legend: T tokens, D hidden, E experts, F expert width, K experts per token,
M = T*K token copies.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

import c2jax_kernels as kernels
from c2jax import quant as quantlib
from c2jax_kernels.grouped_matmul import IMPLS as GROUPED_MATMUL_IMPLS

# The Pallas kernel used where the platform's default grouped matmul is not Pallas (CPU):
# megablox has a CPU interpreter for every shape, Mosaic GPU needs 64-multiple features.
_PALLAS_FALLBACK_IMPL = "megablox"


class ExpertWeights(NamedTuple):
  gate_ExDxF: jax.Array
  up_ExDxF: jax.Array
  down_ExFxD: jax.Array


def combine_dtype(quant: str, dtype) -> jnp.dtype:
  """Dtype of the expert outputs entering the combine: bfloat16 under block-scaled
  recipes (the report combines in BF16), the model dtype otherwise."""
  return jnp.dtype(dtype) if quant == "none" else jnp.dtype(jnp.bfloat16)


def dense(x_TxD, weights_TxK, indices_TxK, experts: ExpertWeights, *,
          quant: str = "none") -> jax.Array:
  """Every expert on every token, then a weighted sum (O(T*E*F) work): the reference."""
  num_experts = experts.gate_ExDxF.shape[0]
  # One quantised dot per expert: x is quantised along D per row, as in the grouped GEMM.
  expert_dot = functools.partial(quantlib.dot, quant)
  # x broadcast over experts makes each product a batched matmul that reads the weights
  # in place (an unbatched x lets XLA:CPU copy every expert's weights to [D, E*F] first).
  x_ExTxD = jnp.broadcast_to(x_TxD, (num_experts, *x_TxD.shape))
  gate_ExTxF = jax.vmap(expert_dot)(x_ExTxD, experts.gate_ExDxF)
  up_ExTxF = jax.vmap(expert_dot)(x_ExTxD, experts.up_ExDxF)
  down_dot = functools.partial(expert_dot,
                               preferred_element_type=combine_dtype(quant, x_TxD.dtype))
  out_ExTxD = jax.vmap(down_dot)(jax.nn.silu(gate_ExTxF) * up_ExTxF, experts.down_ExFxD)
  # Unchosen experts get weight 0; a replayed duplicate index adds its weights, as in HF.
  combine_TxE = jnp.einsum(
      "tk,tke->te", weights_TxK, jax.nn.one_hot(indices_TxK, num_experts, dtype=jnp.float32))
  y_TxD = jnp.einsum("etd,te->td", out_ExTxD.astype(jnp.float32), combine_TxE)
  return y_TxD.astype(x_TxD.dtype)


def sorted_by_expert(x_TxD, weights_TxK, indices_TxK, experts: ExpertWeights, *,
                     quant: str = "none", impl: str) -> jax.Array:
  """Sort token copies by expert, three grouped matmuls (kernels.grouped_matmul `impl`,
  under the quant recipe), unsort, combine."""
  num_tokens, top_k = indices_TxK.shape
  num_experts = experts.gate_ExDxF.shape[0]
  expert_M = indices_TxK.reshape(-1)
  # Stable sort keeps each expert's tokens in token order (deterministic results).
  order_M = jnp.argsort(expert_M, stable=True)
  rows_M = order_M // top_k  # the token behind each sorted copy: the dispatch gather
  group_sizes_E = jnp.bincount(expert_M, length=num_experts).astype(jnp.int32)

  def grouped(lhs, rhs_ExCxN, **kwargs):
    return quantlib.grouped_dot(quant, lhs, rhs_ExCxN, group_sizes_E, impl=impl, **kwargs)

  gate_MxF = grouped(x_TxD, experts.gate_ExDxF, rows=rows_M)
  up_MxF = grouped(x_TxD, experts.up_ExDxF, rows=rows_M)
  out_MxD = grouped(jax.nn.silu(gate_MxF) * up_MxF, experts.down_ExFxD,
                    preferred_element_type=combine_dtype(quant, x_TxD.dtype))

  # Inverse permutation by scatter (cheaper than a second sort), then gather back.
  unsort_M = jnp.zeros_like(order_M).at[order_M].set(jnp.arange(order_M.shape[0]))
  out_TxKxD = jnp.take(out_MxD, unsort_M, axis=0).reshape(num_tokens, top_k, -1)
  y_TxD = jnp.einsum("tkd,tk->td", out_TxKxD.astype(jnp.float32), weights_TxK)
  return y_TxD.astype(x_TxD.dtype)


def ragged(x_TxD, weights_TxK, indices_TxK, experts: ExpertWeights, *,
           quant: str = "none") -> jax.Array:
  """Sort by expert; grouped matmuls through XLA's `lax.ragged_dot`."""
  return sorted_by_expert(x_TxD, weights_TxK, indices_TxK, experts, quant=quant,
                          impl="ragged_dot")


def gathered(x_TxD, weights_TxK, indices_TxK, experts: ExpertWeights, *,
             quant: str = "none") -> jax.Array:
  """Each token copy gathers its expert's weights ([M, D, F]: M expert weights read, not
  E) and multiplies them with its token: the cheapest dispatch when M <= E."""
  if quant != "none":
    raise ValueError(f"MoE dispatch 'gathered' runs unquantised experts; quant = {quant!r} "
                     "needs one of the sorted dispatches ('ragged', 'pallas') or 'dense'.")
  num_tokens, top_k = indices_TxK.shape
  expert_M = indices_TxK.reshape(-1)
  x_MxD = jnp.repeat(x_TxD, top_k, axis=0)
  gate_MxF = jnp.einsum("md,mdf->mf", x_MxD, experts.gate_ExDxF[expert_M])
  up_MxF = jnp.einsum("md,mdf->mf", x_MxD, experts.up_ExDxF[expert_M])
  out_MxD = jnp.einsum("mf,mfd->md", jax.nn.silu(gate_MxF) * up_MxF,
                       experts.down_ExFxD[expert_M])
  y_TxD = jnp.einsum("tkd,tk->td", out_MxD.reshape(num_tokens, top_k, -1).astype(jnp.float32),
                     weights_TxK)
  return y_TxD.astype(x_TxD.dtype)


def select(moe_impl: str, quant: str, num_tokens: int, top_k: int, num_experts: int, *,
           decoding: bool = False) -> Callable[..., jax.Array]:
  """The dispatch for one call: `moe_impl` (cfg.moe_impl), except that
  - an unquantised call with no more token copies than experts (T * K <= E: decode steps,
    short prefills) runs 'gathered', which reads only the chosen experts' weights;
  - a `decoding` call (against a KV cache: decode steps and prefill chunks) never runs the
    'dense' reference, which computes all E experts for every token (E / K times the
    work): it runs the sorted 'ragged' dispatch, which computes only the chosen ones
    (same numerics up to float summation order). Training keeps `moe_impl` as given."""
  if quant == "none" and num_tokens * top_k <= num_experts:
    return DISPATCH["gathered"]
  if decoding and moe_impl == "dense":
    return DISPATCH["ragged"]
  return DISPATCH[moe_impl]


def pallas_impl(platform: str | None = None) -> str:
  """The grouped-matmul impl behind moe_impl='pallas' on `platform` (default: JAX's)."""
  impl = kernels.default_grouped_matmul_impl(platform)
  return impl if GROUPED_MATMUL_IMPLS[impl].is_pallas else _PALLAS_FALLBACK_IMPL


def pallas(x_TxD, weights_TxK, indices_TxK, experts: ExpertWeights, *,
           quant: str = "none") -> jax.Array:
  """Sort by expert; grouped matmuls through the platform's Pallas kernel (pallas_impl)."""
  return sorted_by_expert(x_TxD, weights_TxK, indices_TxK, experts, quant=quant,
                          impl=pallas_impl())


DISPATCH: dict[str, Callable[..., jax.Array]] = {
    "dense": dense,
    "ragged": ragged,
    "pallas": pallas,
    "gathered": gathered,
}
