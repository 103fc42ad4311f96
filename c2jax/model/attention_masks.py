"""Attention masks and the KV cache's layout, shared by MLA and GQA (c2jax.model.attention).

Training masks are causal within a document (segment id); decoding masks let a query at
position p see cache slots t <= p; write_cache puts new entries at slots = positions.
The cache holds, per attention type, one stacked [layers, B, T, ...] array per name
(init_layer_cache), whose logical axes (layer_cache_axes) shard the decode state.

Shape legend: B batch, L new tokens, S queries of a context shard, T key slots.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Cache = dict[str, jax.Array]


def causal_mask(length: int, segment_ids_BxL: jax.Array | None, batch: int) -> jax.Array:
  """[B, 1, L, L] bool: key j visible to query i iff j <= i and same document."""
  idx = jnp.arange(length)
  mask_BxLxL = jnp.broadcast_to(idx[None, :] <= idx[:, None], (batch, length, length))
  if segment_ids_BxL is not None:
    mask_BxLxL = mask_BxLxL & (segment_ids_BxL[:, :, None] == segment_ids_BxL[:, None, :])
  return mask_BxLxL[:, None]


def cache_mask(positions_BxL: jax.Array, cache_length: int) -> jax.Array:
  """[B, 1, L, T] bool: slot t visible to a query at position p iff t <= p."""
  slots = jnp.arange(cache_length)
  return (slots[None, None, :] <= positions_BxL[:, :, None])[:, None]


def write_cache(cache_BxTx_: jax.Array, new_BxLx_: jax.Array,
                positions_BxL: jax.Array) -> jax.Array:
  """Writes each row's new entries at slots = their positions (beyond T: dropped)."""
  rows_Bx1 = jnp.arange(cache_BxTx_.shape[0])[:, None]
  return cache_BxTx_.at[rows_Bx1, positions_BxL].set(
      new_BxLx_.astype(cache_BxTx_.dtype), mode="drop")


def masked_softmax(scores: jax.Array, mask: jax.Array, dtype) -> jax.Array:
  """Softmax over the last axis in float32 with masked entries excluded."""
  scores = jnp.where(mask, scores.astype(jnp.float32), jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(scores, axis=-1).astype(dtype)


def position_mask(positions_BxS, segment_ids_BxS, key_positions_BxT,
                  key_segment_ids_BxT) -> jax.Array:
  """[B, 1, S, T] bool: key t visible to query s iff same document and not later."""
  mask_BxSxT = key_positions_BxT[:, None, :] <= positions_BxS[:, :, None]
  if segment_ids_BxS is not None:
    mask_BxSxT = mask_BxSxT & (segment_ids_BxS[:, :, None] == key_segment_ids_BxT[:, None, :])
  return mask_BxSxT[:, None]


def layer_mask(positions_BxL, segment_ids_BxL, cache_length: int | None):
  """A layer's mask: causal + document for training (cache_length None), else the
  cache's [B, 1, L, T] slot mask (segment ids rejected: a cached row is one sequence)."""
  batch, length = positions_BxL.shape
  if cache_length is None:
    return causal_mask(length, segment_ids_BxL, batch)
  if segment_ids_BxL is not None:
    raise ValueError(
        "segment_ids are for packed training sequences; with a KV cache each batch row is "
        "one sequence. Pass segment_ids=None and per-row positions instead.")
  return cache_mask(positions_BxL, cache_length)


def init_layer_cache(cfg, num_layers: int, batch: int, max_length: int, dtype) -> Cache:
  """Zeroed stacked cache for `num_layers` layers of this attention type."""
  if cfg.attention == "mla":
    shapes = {"c_kv": (cfg.kv_lora_rank,), "k_rope": (cfg.qk_rope_head_dim,)}
  else:
    shapes = {"k": (cfg.num_kv_heads, cfg.head_dim), "v": (cfg.num_kv_heads, cfg.head_dim)}
  return {name: jnp.zeros((num_layers, batch, max_length, *tail), dtype)
          for name, tail in shapes.items()}


def layer_cache_axes(cfg) -> dict[str, tuple[str, ...]]:
  """Logical axis names of each stacked cache array (for sharding the decode state)."""
  prefix = ("layers", "batch", "cache_length")
  if cfg.attention == "mla":
    return {"c_kv": (*prefix, "kv_lora"), "k_rope": (*prefix, "head_dim")}
  return {"k": (*prefix, "kv_heads", "head_dim"), "v": (*prefix, "kv_heads", "head_dim")}
