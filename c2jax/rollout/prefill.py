"""The engine's prefill programs (JaxEngine, jax_engine.py): one slot's chunk of tokens
written into the KV cache and the next token sampled, or several slots' chunks in one
forward. The cache's leaves are [layers, S, T, ...] (stacked) or [S, T, ...] per layer
(the CPU decode layout); each program finds the slot axis itself.

Shape legend: S slots, C chunk length, P rows of a batched call, V vocab, D hidden,
Lm MoE layers, K experts per token.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from c2jax import model
from c2jax.rollout import sampling as sampling_lib


def _slot_axis(cache) -> int:
  """The slot (batch) axis of the cache's leaves: [B, T, ...] per layer, else stacked."""
  return 0 if model.has_unstacked_layers(cache) else 1


def _slot_rows(cache, slot):
  axis = _slot_axis(cache)
  return jax.tree.map(lambda c: jax.lax.dynamic_slice_in_dim(c, slot, 1, axis=axis), cache)


def _put_rows(cache, rows, slot):
  axis = _slot_axis(cache)
  return jax.tree.map(lambda c, r: jax.lax.dynamic_update_slice_in_dim(c, r, slot, axis=axis),
                      cache, rows)


def prefill_chunk(cfg, params, cache, slot, tokens_1xC, start, count, temperature, top_k,
                  top_p, seed):
  """Writes one slot's chunk; samples from the logits of its last real token."""
  positions_1xC = start + jnp.arange(tokens_1xC.shape[1], dtype=jnp.int32)[None]
  logits_1xCxV, aux, rows = model.apply(cfg, params, tokens_1xC, positions_BxL=positions_1xC,
                                        cache=_slot_rows(cache, slot))
  last_1xV = jax.lax.dynamic_index_in_dim(logits_1xCxV[0], count - 1, keepdims=True)
  keys = functools.partial(sampling_lib.row_keys, seed[None], (start + count)[None])
  token_1, logprob_1 = sampling_lib.sample(last_1xV, temperature[None], top_k[None],
                                           top_p[None], keys)
  return _put_rows(cache, rows, slot), token_1[0], logprob_1[0], aux["expert_indices"][:, 0]


def prefill_rows(cfg, params, cache, slots_P, tokens_PxC, starts_P, counts_P, temperature_P,
                 top_k_P, top_p_P, seeds_P):
  """prefill_chunk for P slots in one forward: row p writes tokens_PxC[p] at positions
  starts_P[p].. of slot slots_P[p] and samples after its counts_P[p]-th token. Rows
  whose slot is out of range (>= S, the padding of a partly filled call) read zeros and
  write nothing. Returns (cache, tokens [P], log-probs [P], routing [Lm, P, C, K])."""
  axis = _slot_axis(cache)
  positions_PxC = starts_P[:, None] + jnp.arange(tokens_PxC.shape[1], dtype=jnp.int32)[None]
  rows = jax.tree.map(lambda c: jnp.take(c, slots_P, axis=axis, mode="fill", fill_value=0),
                      cache)
  hidden_PxCxD, aux, rows = model.apply(cfg, params, tokens_PxC, positions_BxL=positions_PxC,
                                        cache=rows, head=False)
  # Logits of each row's last real token only (not [P, C, V]).
  last_Px1xD = jnp.take_along_axis(hidden_PxCxD, (counts_P - 1)[:, None, None], axis=1)
  last_PxV = model.head(cfg, params, last_Px1xD)[:, 0]
  keys = functools.partial(sampling_lib.row_keys, seeds_P, starts_P + counts_P)
  tokens_P, logprobs_P = sampling_lib.sample(last_PxV, temperature_P, top_k_P, top_p_P, keys)
  index = (slice(None),) * axis + (slots_P,)
  cache = jax.tree.map(lambda c, r: c.at[index].set(r, mode="drop"), cache, rows)
  return cache, tokens_P, logprobs_P, aux["expert_indices"]
