"""Attention given q, k and v: the forms c2jax/model/attention.py's modules pick from.

The modules (projections, RoPE, cache writes, context parallelism) live in attention.py;
this file holds what they compute once queries, keys and values exist: MLA expanded or
absorbed against its latent cache, GQA with grouped heads (and its one-token decode step
on CPU), and the choice between the dense, blockwise and fused kernels. Shape legend as in
attention.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import c2jax_kernels as kernels
from c2jax.model import fused_attention as fused_lib
from c2jax.model.attention_masks import cache_mask, layer_mask, masked_softmax, position_mask
from c2jax.model.blockwise_attention import blockwise_attention
from c2jax.model.layers import compute_dtype, constrain

BLHE = ("batch", "length", "heads", "head_dim")


def einsum_f32(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
  return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def mla_expanded(q_nope_BxLxHxN, q_rope_BxLxHxR, kv_BxTxHx_, k_rope_BxTxR, mask, scale,
                  dtype):
  """Attention with the latent already up-projected to per-head k_nope | v.

  The scores are one matmul over [nope | rope] with the shared rope key broadcast to every
  head, the scale folded into the queries: two score matmuls, their sum and a rescale
  would each be a pass over the float32 [B, H, L, T] scores (and their gradients), the
  largest arrays of the layer at training lengths.
  """
  q_BxLxHxE, k_BxTxHxE, v_BxTxHxV = mla_qkv(q_nope_BxLxHxN, q_rope_BxLxHxR, kv_BxTxHx_,
                                            k_rope_BxTxR)
  q_BxLxHxE = (q_BxLxHxE.astype(jnp.float32) * scale).astype(q_BxLxHxE.dtype)
  scores_BxHxLxT = einsum_f32("blhe,bthe->bhlt", q_BxLxHxE, k_BxTxHxE)
  probs_BxHxLxT = masked_softmax(scores_BxHxLxT, mask, dtype)
  return jnp.einsum("bhlt,bthv->blhv", probs_BxHxLxT, v_BxTxHxV)


def token_order(x_BxLx_):
  """[B, L] token indices: with them as positions, the position mask is `causal_mask`."""
  return jnp.broadcast_to(jnp.arange(x_BxLx_.shape[1]), x_BxLx_.shape[:2])


def mla_qkv(q_nope_BxLxHxN, q_rope_BxLxHxR, kv_BxTxHx_, k_rope_BxTxR):
  """Per-head q, k ([N + R], the shared rope key broadcast to every head) and v, for the
  kernels that take one q/k vector per head."""
  n = q_nope_BxLxHxN.shape[-1]
  k_rope_BxTxHxR = jnp.broadcast_to(k_rope_BxTxR[:, :, None],
                                    (*kv_BxTxHx_.shape[:3], k_rope_BxTxR.shape[-1]))
  q_BxLxHxE = jnp.concatenate([q_nope_BxLxHxN, q_rope_BxLxHxR.astype(q_nope_BxLxHxN.dtype)],
                              axis=-1)
  k_BxTxHxE = jnp.concatenate([kv_BxTxHx_[..., :n], k_rope_BxTxHxR.astype(kv_BxTxHx_.dtype)],
                              axis=-1)
  return q_BxLxHxE, k_BxTxHxE, kv_BxTxHx_[..., n:]


def mla_blockwise(q_nope_BxLxHxN, q_rope_BxLxHxR, kv_BxTxHx_, k_rope_BxTxR, positions,
                  segments, key_positions, key_segments, scale, cfg):
  """`mla_expanded` by blockwise_attention."""
  q_BxLxHxE, k_BxTxHxE, v_BxTxHxV = mla_qkv(q_nope_BxLxHxN, q_rope_BxLxHxR, kv_BxTxHx_,
                                            k_rope_BxTxR)
  return blockwise_attention(q_BxLxHxE, k_BxTxHxE, v_BxTxHxV, positions,
                             key_positions, segments, key_segments, scale=scale,
                             block=cfg.attention_block)


def fused(q_BxLxHxE, k_BxTxKxE, v_BxTxKxV, positions, segments, key_positions,
          key_segments, scale, ordered: bool, impl: str = "fused"):
  """A whole-sequence kernel (fused_attention.MASKED_CALL_IMPLS: cuDNN's 'fused',
  'tokamax') with this module's masks: `ordered` (keys = queries in token order) uses the
  kernel's causal mask plus a same-document mask when there are segments; otherwise
  (context-parallel shards) the full position mask."""
  call = fused_lib.masked_call(impl)
  if ordered:
    # cuDNN's partitioner needs q, k and v laid out alike (batch and heads only).
    q_BxLxHxE, k_BxTxKxE, v_BxTxKxV = (constrain(x, BLHE)
                                       for x in (q_BxLxHxE, k_BxTxKxE, v_BxTxKxV))
    mask = None if segments is None else fused_lib.document_mask(segments, key_segments)
    return call(q_BxLxHxE, k_BxTxKxE, v_BxTxKxV, mask, causal=True, scale=scale)
  mask = position_mask(positions, segments, key_positions, key_segments)
  return call(q_BxLxHxE, k_BxTxKxE, v_BxTxKxV, mask, causal=False, scale=scale)


def cached_impl(cfg, queries_BxLx_, keys_BxTx_, heads, kv_heads, qk_dim, v_dim) -> str:
  """The kernel for new tokens against a KV cache: a one-token decode step scores densely;
  a prefill chunk goes through the selector with the cache's position mask (slot t
  visible iff t <= position). 'fused' there means cuDNN where it takes the shape and the
  selector's fallback elsewhere (MLA's absorbed heads, 576 wide, exceed cuDNN's 256)."""
  if queries_BxLx_.shape[1] == 1 or cfg.attention_impl == "dense":
    return "dense"
  return fused_lib.choose(cfg, dtype=compute_dtype(cfg), heads=heads, kv_heads=kv_heads,
                          qk_head_dim=qk_dim, v_head_dim=v_dim,
                          queries=queries_BxLx_.shape[1], keys=keys_BxTx_.shape[1],
                          mask="positions", strict=False)


def attend_cache(q_BxLxHxE, keys_BxTxKxE, values_BxTxKxV, positions_BxL, scale, impl, cfg):
  """Prefill against the cache with a whole-sequence kernel ('fused' | 'tokamax') or
  the blockwise one ('blockwise')."""
  batch, slots = keys_BxTxKxE.shape[:2]
  if impl in fused_lib.MASKED_CALL_IMPLS:
    return fused_lib.masked_call(impl)(q_BxLxHxE, keys_BxTxKxE, values_BxTxKxV,
                                       cache_mask(positions_BxL, slots), causal=False,
                                       scale=scale)
  slots_BxT = jnp.broadcast_to(jnp.arange(slots), (batch, slots))
  return blockwise_attention(q_BxLxHxE, keys_BxTxKxE, values_BxTxKxV, positions_BxL,
                             slots_BxT, scale=scale, block=cfg.attention_block)


def training_impl(cfg, queries_BxLx_, keys_BxTx_, heads, kv_heads, qk_dim, v_dim, segments,
                  ordered: bool) -> str:
  """cfg.attention_impl resolved for one training call (fused_attention.select_attention)."""
  mask = "positions" if not ordered else "causal" if segments is None else "documents"
  return fused_lib.choose(cfg, dtype=compute_dtype(cfg), heads=heads, kv_heads=kv_heads,
                          qk_head_dim=qk_dim, v_head_dim=v_dim,
                          queries=queries_BxLx_.shape[1], keys=keys_BxTx_.shape[1],
                          mask=mask)


# Cache elements a layer (B x T x K x E) from which a one-token CPU step streams the cache
# (gqa_step) instead of running the dots. Measured in the engine's decode loop (tokens/s,
# streaming / dots, 2026-11-28, 2-core Xeon): 0.92-0.96 at qwen3_small batch 1 and
# qwen3_tiny batch 1 and 32 (22.5k, 2.8k, 90k elements), 1.00 at qwen3_small batch 8
# (180k), 1.08 at batch 32 (720k); 1.5-5.9x for the attention alone at 4,096 tokens of
# context (1.07M and more; docs/benchmarks.md). Below it the streaming reductions' fixed
# cost (YNNPACK fusions of 40-100 us each, two a layer) outweighs the cache copy they save.
STREAM_MIN_CACHE = 1 << 17


# Rows from which a one-token CPU step below STREAM_MIN_CACHE runs gqa_blocks rather than
# gqa_dots. Measured in the engine's decode loop (tokens/s, blocks / dots, median of 11,
# 2-core AMD EPYC VM, 2026-12-02): qwen3_tiny 1.07-1.15x at batch 8 and 32, qwen3_moe_tiny
# 1.08x and 1.13x; 0.55-0.60x at batch 1, where the dots need no cache copy (B = 1);
# qwen3_small batch 2 (4 KV heads) 0.99x. docs/benchmarks.md, "GQA decode without the
# cache copy".
BLOCKS_MIN_ROWS = 2


def gqa_attend(q_BxLxHxE, keys_BxTxKxE, values_BxTxKxE, mask_Bx1xLxT, dtype):
  """Query head j*G + i reads kv head j (HF repeat_kv order), without materialising
  repeated keys; works on per-shard heads as long as both head axes split alike."""
  batch, length, heads, e = q_BxLxHxE.shape
  kv_heads = keys_BxTxKxE.shape[2]
  q_BxLxKxGxE = q_BxLxHxE.reshape(batch, length, kv_heads, heads // kv_heads, e)
  cpu_step = length == 1 and kernels.target_platform() == "cpu"
  if cpu_step and keys_BxTxKxE.size >= STREAM_MIN_CACHE:
    form = gqa_step
  elif cpu_step and batch >= BLOCKS_MIN_ROWS:
    form = gqa_blocks
  else:
    form = gqa_dots
  out_BxLxKxGxE = form(q_BxLxKxGxE, keys_BxTxKxE, values_BxTxKxE, mask_Bx1xLxT, dtype)
  return out_BxLxKxGxE.reshape(q_BxLxHxE.shape)


def gqa_dots(q_BxLxKxGxE, keys_BxTxKxE, values_BxTxKxE, mask_Bx1xLxT, dtype):
  """Grouped attention as two einsums (training, prefill, and decode off CPU)."""
  e = q_BxLxKxGxE.shape[-1]
  scores_BxKxGxLxT = einsum_f32("blkge,btke->bkglt", q_BxLxKxGxE, keys_BxTxKxE) * e ** -0.5
  probs_BxKxGxLxT = masked_softmax(scores_BxKxGxLxT, mask_Bx1xLxT[:, None], dtype)
  return jnp.einsum("bkglt,btke->blkge", probs_BxKxGxLxT, values_BxTxKxE)


def gqa_blocks(q_BxLxKxGxE, keys_BxTxKxE, values_BxTxKxE, mask_Bx1xLxT, dtype):
  """Grouped attention as two dots that read the cache as it lies, [B, T*K, E]: every
  query head scores every (slot, kv head) pair, the pairs of other kv heads are masked out
  of the softmax (their probabilities are exactly 0), and the probabilities times the
  values [B, T*K, E] sum the right head's values only. Batch is the dots' only batch axis,
  so XLA:CPU need not copy the cache into [B, K, T, E] (gqa_dots' einsums have (B, K) as
  batch axes) on every step; the price is K times the scores and softmax, which a small
  cache (below STREAM_MIN_CACHE) affords. The same result as gqa_dots up to rounding."""
  batch, length, kv_heads, group, e = q_BxLxKxGxE.shape
  slots = keys_BxTxKxE.shape[1]
  queries = length * kv_heads * group
  scores_BxQxTK = einsum_f32("bqe,bye->bqy", q_BxLxKxGxE.reshape(batch, queries, e),
                             keys_BxTxKxE.reshape(batch, slots * kv_heads, e)) * e ** -0.5
  own_head_Kx1x1xK = (jnp.arange(kv_heads)[:, None, None, None]
                      == jnp.arange(kv_heads)[None, None, None, :])
  visible_BxLxKx1xTxK = (mask_Bx1xLxT[:, 0, :, None, None, :, None]
                         & own_head_Kx1x1xK[None, None])
  visible_BxQxTK = jnp.broadcast_to(
      visible_BxLxKx1xTxK, (batch, length, kv_heads, group, slots, kv_heads)
  ).reshape(batch, queries, slots * kv_heads)
  probs_BxQxTK = masked_softmax(scores_BxQxTK, visible_BxQxTK, dtype)
  out_BxQxE = jnp.einsum("bqy,bye->bqe", probs_BxQxTK,
                         values_BxTxKxE.reshape(batch, slots * kv_heads, e))
  return out_BxQxE.reshape(q_BxLxKxGxE.shape)


def gqa_step(q_Bx1xKxGxE, keys_BxTxKxE, values_BxTxKxE, mask_Bx1x1xT, dtype):
  """One query token a row (a decode step) on CPU, with a cache of STREAM_MIN_CACHE
  elements or more, as multiply-and-sum over the cache as it lies ([B, T, K, E]), in
  float32. A dot_general wants the batch axes (B, K) outermost,
  so XLA:CPU copies each layer's whole cache into [B, K, T, E] on every step: at 4,096
  tokens of context and batch 8 that copy made the attention 5.9x slower than these two
  streaming reductions (tools/bench/decode_attention.py). Not on TPU: its compiler
  materialises the broadcast product and estimates this form 7-9x slower than the dots,
  whose cache layout it chooses itself (the same bench, --target=v5p-8)."""
  f32 = jnp.float32
  q_Bx1xKxGxE = q_Bx1xKxGxE.astype(f32) * q_Bx1xKxGxE.shape[-1] ** -0.5
  scores_BxTxKxG = jnp.sum(q_Bx1xKxGxE * keys_BxTxKxE[:, :, :, None, :].astype(f32), axis=-1)
  scores_BxTxKxG = jnp.where(mask_Bx1x1xT[:, 0, 0, :, None, None], scores_BxTxKxG,
                             jnp.finfo(f32).min)
  probs_BxTxKxGx1 = jax.nn.softmax(scores_BxTxKxG, axis=1)[..., None]
  out_BxKxGxE = jnp.sum(probs_BxTxKxGx1 * values_BxTxKxE[:, :, :, None, :].astype(f32), axis=1)
  return out_BxKxGxE[:, None].astype(dtype)


def prefill_expands(length: int, nope: int, v: int, latent: int) -> bool:
  """Whether a chunk of `length` new tokens attends the MLA cache expanded (the latent
  up-projected to per-head k_nope | v) rather than absorbed (every head scoring and
  reading the latent itself). Per query and cached token and head, absorbed costs
  2C + R multiply-adds, expanded N + R + V; expanding costs C (N + V) per cached token and
  head, once per chunk. So expanded pays when L (2C - N - V) > C (N + V): above 42 tokens
  at `small` (C 128, N = V = 32), 170 at DeepSeek-V3 and Kimi-K2.5 (C 512, N = V = 128).
  A decode step or a speculative verify (a few tokens) stays absorbed and reads only the
  latent cache."""
  return length * (2 * latent - nope - v) > latent * (nope + v)


def mla_cached_expanded(cfg, q_nope_BxLxHxN, q_rope_BxLxHxR, c_BxTxC, k_rope_BxTxR,
                         w_CxHxN_V, positions_BxL, segment_ids_BxL, scale):
  """A long chunk against the latent cache: the latent up-projected to per-head
  k_nope | v once, then attention as in training (vLLM and SGLang prefill MLA this way)."""
  dtype, h, n = c_BxTxC.dtype, q_nope_BxLxHxN.shape[2], q_nope_BxLxHxN.shape[3]
  kv_BxTxHx_ = constrain(jnp.einsum("btc,chx->bthx", c_BxTxC, w_CxHxN_V), BLHE)
  mask = layer_mask(positions_BxL, segment_ids_BxL, c_BxTxC.shape[1])
  v = kv_BxTxHx_.shape[-1] - n
  impl = cached_impl(cfg, q_nope_BxLxHxN, kv_BxTxHx_, h, h, n + k_rope_BxTxR.shape[-1], v)
  if impl == "dense":
    return mla_expanded(q_nope_BxLxHxN, q_rope_BxLxHxR, kv_BxTxHx_, k_rope_BxTxR, mask,
                        scale, dtype)
  return attend_cache(*mla_qkv(q_nope_BxLxHxN, q_rope_BxLxHxR, kv_BxTxHx_, k_rope_BxTxR),
                      positions_BxL, scale, impl, cfg)


def mla_cached_absorbed(cfg, q_nope_BxLxHxN, q_rope_BxLxHxR, c_BxTxC, k_rope_BxTxR,
                         w_CxHxN_V, positions_BxL, segment_ids_BxL, scale):
  """Decode steps and short chunks: the up-projections absorbed into the query and the
  output, so every head scores and reads the latent cache itself."""
  dtype, h, n = c_BxTxC.dtype, q_nope_BxLxHxN.shape[2], q_nope_BxLxHxN.shape[3]
  c, r = c_BxTxC.shape[-1], k_rope_BxTxR.shape[-1]
  w_uk_CxHxN, w_uv_CxHxV = w_CxHxN_V[..., :n], w_CxHxN_V[..., n:]
  q_absorbed_BxLxHxC = jnp.einsum("blhn,chn->blhc", q_nope_BxLxHxN, w_uk_CxHxN)
  impl = cached_impl(cfg, q_absorbed_BxLxHxC, c_BxTxC, h, 1, c + r, c)
  if impl != "dense":
    layer_mask(positions_BxL, segment_ids_BxL, c_BxTxC.shape[1])  # rejects segment ids
    # Absorbed MLA is multi-query attention: every head scores the one latent key
    # [c_kv | k_rope] and reads the latent c_kv as its value.
    q_BxLxHxE = jnp.concatenate([q_absorbed_BxLxHxC, q_rope_BxLxHxR.astype(dtype)], axis=-1)
    k_BxTx1xE = jnp.concatenate([c_BxTxC, k_rope_BxTxR], axis=-1)[:, :, None]
    context_BxLxHxC = attend_cache(q_BxLxHxE, k_BxTx1xE, c_BxTxC[:, :, None],
                                   positions_BxL, scale, impl, cfg)
  else:
    scores_BxHxLxT = (einsum_f32("blhc,btc->bhlt", q_absorbed_BxLxHxC, c_BxTxC)
                      + einsum_f32("blhr,btr->bhlt", q_rope_BxLxHxR, k_rope_BxTxR)) * scale
    probs_BxHxLxT = masked_softmax(
        scores_BxHxLxT, layer_mask(positions_BxL, segment_ids_BxL, c_BxTxC.shape[1]), dtype)
    context_BxLxHxC = jnp.einsum("bhlt,btc->blhc", probs_BxHxLxT, c_BxTxC)
  return jnp.einsum("blhc,chv->blhv", context_BxLxHxC, w_uv_CxHxV)
