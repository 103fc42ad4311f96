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
from c2jax.model import attention as attention_lib
from c2jax.rollout import sampling as sampling_lib

# The tile (queries x keys) of blockwise attention in the engine's prefill on CPU.
# Measured 2026-12-03 on a 2-core AMD EPYC (Zen 4, 1 MB of L2 a core), `qwen3_small`,
# prefill tokens/s (docs/benchmarks.md): a 4,096-token prompt 418 with dense scores, 889 /
# 931-1,026 / 1,166 in tiles of 512 / 256 / 128; 8 prompts of 512 tokens 2,092 dense,
# 2,060 / 2,256 / 2,393. The dense scores of a 4,096-token chunk are 0.5 GB a layer,
# written and read back from memory; a 128 x 128 tile's, for 8 heads, 512 KB, stay in L2.
CPU_BLOCK = 128


def prefill_config(cfg, attention: str | None = "auto", block: int | None = None,
                   platform: str | None = None):
  """The model config of the engine's forwards over many tokens (prefill chunks, scoring):
  cfg with attention_impl = `attention` (None keeps cfg's, the training forwards'
  setting; 'auto', fused_attention.select_attention's choice per call: cuDNN on a GPU
  where it takes the shape, else blockwise once the chunk or the cache exceeds a tile,
  dense for one tile) and attention_block = `block` (None: CPU_BLOCK on CPU, cfg's
  elsewhere; `platform` is the one the programs run on, default JAX's backend). One-token
  decode steps score densely whatever this says."""
  if attention is not None and attention not in attention_lib.ATTENTION_IMPLS:
    raise ValueError(f"prefill_attention = {attention!r}; choose one of "
                     f"{attention_lib.ATTENTION_IMPLS}, or None for model.attention_impl.")
  if block is not None and block < 1:
    raise ValueError(f"prefill_block = {block}; use a positive tile size, or None for the "
                     "platform's default.")
  out = cfg.copy_and_resolve_references()
  if attention is not None:
    out.attention_impl = attention
  if block is not None:
    out.attention_block = block
  elif (platform or jax.default_backend()) == "cpu":
    out.attention_block = CPU_BLOCK
  return out


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
