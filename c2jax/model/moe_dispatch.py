"""MoE dispatch: run the chosen SwiGLU experts on their tokens and combine by gate weight.

Every implementation is a function
    dispatch(x_TxD, weights_TxK, indices_TxK, experts: ExpertWeights) -> y_TxD
with y_t = sum_k weights[t, k] * expert_{indices[t, k]}(x_t) and
expert_e(x) = (silu(x W_gate[e]) * (x W_up[e])) W_down[e].
`dense` is the reference; faster ones (`ragged`, later `pallas`) are tested against it.
Register a new one with `DISPATCH['name'] = fn`; config validation reads the keys.

Products with the float32 gate weights and the sum over k happen in float32, as HF
does; the result is cast back to x's dtype.

Einsum legend: T tokens, D hidden, E experts, F expert width, K experts per token,
M = T*K token copies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp


class ExpertWeights(NamedTuple):
  gate_ExDxF: jax.Array
  up_ExDxF: jax.Array
  down_ExFxD: jax.Array


def dense(x_TxD, weights_TxK, indices_TxK, experts: ExpertWeights) -> jax.Array:
  """Every expert on every token, then a weighted sum (O(T*E*F) work): the reference."""
  num_experts = experts.gate_ExDxF.shape[0]
  gate_TxExF = jnp.einsum("td,edf->tef", x_TxD, experts.gate_ExDxF)
  up_TxExF = jnp.einsum("td,edf->tef", x_TxD, experts.up_ExDxF)
  out_TxExD = jnp.einsum("tef,efd->ted", jax.nn.silu(gate_TxExF) * up_TxExF,
                         experts.down_ExFxD)
  # Unchosen experts get weight 0; a replayed duplicate index adds its weights, as in HF.
  combine_TxE = jnp.einsum(
      "tk,tke->te", weights_TxK, jax.nn.one_hot(indices_TxK, num_experts, dtype=jnp.float32))
  y_TxD = jnp.einsum("ted,te->td", out_TxExD.astype(jnp.float32), combine_TxE)
  return y_TxD.astype(x_TxD.dtype)


def ragged(x_TxD, weights_TxK, indices_TxK, experts: ExpertWeights) -> jax.Array:
  """Sort token copies by expert, grouped matmuls (`lax.ragged_dot`), unsort, combine."""
  num_tokens, top_k = indices_TxK.shape
  num_experts = experts.gate_ExDxF.shape[0]
  expert_M = indices_TxK.reshape(-1)
  # Stable sort keeps each expert's tokens in token order (deterministic results).
  order_M = jnp.argsort(expert_M, stable=True)
  x_MxD = jnp.take(x_TxD, order_M // top_k, axis=0)
  group_sizes_E = jnp.bincount(expert_M, length=num_experts).astype(jnp.int32)

  gate_MxF = jax.lax.ragged_dot(x_MxD, experts.gate_ExDxF, group_sizes_E)
  up_MxF = jax.lax.ragged_dot(x_MxD, experts.up_ExDxF, group_sizes_E)
  out_MxD = jax.lax.ragged_dot(jax.nn.silu(gate_MxF) * up_MxF, experts.down_ExFxD,
                               group_sizes_E)

  # Inverse permutation by scatter (cheaper than a second sort), then gather back.
  unsort_M = jnp.zeros_like(order_M).at[order_M].set(jnp.arange(order_M.shape[0]))
  out_TxKxD = jnp.take(out_MxD, unsort_M, axis=0).reshape(num_tokens, top_k, -1)
  y_TxD = jnp.einsum("tkd,tk->td", out_TxKxD.astype(jnp.float32), weights_TxK)
  return y_TxD.astype(x_TxD.dtype)


DISPATCH: dict[str, Callable[..., jax.Array]] = {
    "dense": dense,
    "ragged": ragged,
}
