"""Self-attention: MLA (DeepSeek-V3 / Kimi) and GQA (Qwen3), causal + document masking.

Both modules take `(x_BxLxD, positions_BxL, segment_ids_BxL, cache)` and return
`(y_BxLxD, new_cache)`.
  Training (cache None): token i attends to tokens j <= i of the same document
  (segment id); RoPE uses the explicit positions.
  Context parallel training (the ambient mesh shards 'length', see
  c2jax.parallel.context): each shard gathers the keys' inputs of the whole sequence (MLA:
  the latent c_kv and k_rope, up-projected after the gather; GQA: k and v) and attends
  with its local queries. The sequence may be in any order (the load-balanced layout), so
  visibility comes from positions: key j is visible to query i iff same document and
  position_j <= position_i, which is the rule above for rows whose positions increase
  within each document (padding, segment 0, may differ; it carries no loss).
  Decoding (cache given): the new tokens are written into cache slot t = position, and
  attend to every slot t <= their position, so rows of one batch may be at different
  lengths. Slots above a row's position may hold stale values; they are never read before
  being overwritten, because a step writes before it attends.
MLA caches only the compressed latent (normalised c_kv and the rotated shared k_rope) and
decodes with absorbed weights: q_nope is folded into W_uk, so scores are taken against the
latent directly, and the latent context is mapped to values through W_uv afterwards.

Shape legend: B batch, L new tokens, T key slots (L in training, cache length when
decoding), S a context shard's share of L, D hidden, H heads, K kv heads, G = H / K query
heads per kv head, E head dim, N nope dims, R rope dims, V value dims, C kv_lora rank,
Q q_lora rank.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

import c2jax_kernels as kernels
from c2jax.model import rope as rope_lib
from c2jax.model import fused_attention as fused_lib
from c2jax.model.blockwise_attention import blockwise_attention
from c2jax.model.layers import Linear, RMSNorm, compute_dtype, constrain
# The masks and the KV cache's layout live in attention_masks; re-exported here, where
# callers have always found them.
from c2jax.model.attention_masks import (  # noqa: F401
    Cache, cache_mask, causal_mask, init_layer_cache, layer_cache_axes, layer_mask,
    masked_softmax, position_mask, write_cache)
from c2jax.parallel import context as context_lib

# config.model.attention_impl for training forwards (decoding always scores densely):
# 'dense' materialises float32 [B, H, L, T] scores (the reference); 'blockwise' is
# c2jax.model.blockwise_attention, O(L * attention_block) memory, same masks; 'fused' is
# jax.nn.dot_product_attention (cuDNN on GPU); 'auto' lets
# c2jax.model.fused_attention.select_attention pick per call.
ATTENTION_IMPLS = fused_lib.IMPLS

_BLHE = ("batch", "length", "heads", "head_dim")


def _einsum(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
  return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _context_axes(module: nn.Module, has_cache: bool) -> tuple[str, ...]:
  """CP mesh axes for a training forward; () for decoding (single-device cache path) and
  for init (whose 1-token dummy input cannot be split)."""
  if has_cache or module.is_initializing():
    return ()
  return context_lib.length_axes()


def _context_specs(*logical_axes):
  """Mesh layouts of activations under the active rules (as `constrain` places them)."""
  return [nn.logical_to_mesh_axes(axes) for axes in logical_axes]


def _over_context(attend, axes, local, gathered, weights, weight_specs, out_spec):
  """`attend(*local, *gathered, *weights)` per CP shard; `local` and `gathered` are
  (array, logical axes) pairs, `gathered` ones see the whole sequence (positions, segment
  ids and key inputs)."""
  pairs = [*local, *gathered]
  specs = _context_specs(*(axes_ for _, axes_ in pairs))
  gather = [False] * len(local) + [True] * len(gathered) + [False] * len(weights)
  return context_lib.over_context(attend, axes, [x for x, _ in pairs] + list(weights),
                                  specs + list(weight_specs), gather, out_spec)


def _mla_expanded(q_nope_BxLxHxN, q_rope_BxLxHxR, kv_BxTxHx_, k_rope_BxTxR, mask, scale,
                  dtype):
  """Attention with the latent already up-projected to per-head k_nope | v.

  The scores are one matmul over [nope | rope] with the shared rope key broadcast to every
  head, the scale folded into the queries: two score matmuls, their sum and a rescale
  would each be a pass over the float32 [B, H, L, T] scores (and their gradients), the
  largest arrays of the layer at training lengths.
  """
  q_BxLxHxE, k_BxTxHxE, v_BxTxHxV = _mla_qkv(q_nope_BxLxHxN, q_rope_BxLxHxR, kv_BxTxHx_,
                                             k_rope_BxTxR)
  q_BxLxHxE = (q_BxLxHxE.astype(jnp.float32) * scale).astype(q_BxLxHxE.dtype)
  scores_BxHxLxT = _einsum("blhe,bthe->bhlt", q_BxLxHxE, k_BxTxHxE)
  probs_BxHxLxT = masked_softmax(scores_BxHxLxT, mask, dtype)
  return jnp.einsum("bhlt,bthv->blhv", probs_BxHxLxT, v_BxTxHxV)


def _token_order(x_BxLx_):
  """[B, L] token indices: with them as positions, the position mask is `causal_mask`."""
  return jnp.broadcast_to(jnp.arange(x_BxLx_.shape[1]), x_BxLx_.shape[:2])


def _mla_qkv(q_nope_BxLxHxN, q_rope_BxLxHxR, kv_BxTxHx_, k_rope_BxTxR):
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


def _mla_blockwise(q_nope_BxLxHxN, q_rope_BxLxHxR, kv_BxTxHx_, k_rope_BxTxR, positions,
                   segments, key_positions, key_segments, scale, cfg):
  """`_mla_expanded` by blockwise_attention."""
  q_BxLxHxE, k_BxTxHxE, v_BxTxHxV = _mla_qkv(q_nope_BxLxHxN, q_rope_BxLxHxR, kv_BxTxHx_,
                                             k_rope_BxTxR)
  return blockwise_attention(q_BxLxHxE, k_BxTxHxE, v_BxTxHxV, positions,
                             key_positions, segments, key_segments, scale=scale,
                             block=cfg.attention_block)


def _fused(q_BxLxHxE, k_BxTxKxE, v_BxTxKxV, positions, segments, key_positions,
           key_segments, scale, ordered: bool):
  """fused_attention with this module's masks: `ordered` (keys = queries in token order)
  uses cuDNN's causal mask plus a same-document mask when there are segments; otherwise
  (context-parallel shards) the full position mask."""
  if ordered:
    # cuDNN's partitioner needs q, k and v laid out alike (batch and heads only).
    q_BxLxHxE, k_BxTxKxE, v_BxTxKxV = (constrain(x, _BLHE)
                                       for x in (q_BxLxHxE, k_BxTxKxE, v_BxTxKxV))
    mask = None if segments is None else fused_lib.document_mask(segments, key_segments)
    return fused_lib.fused_attention(q_BxLxHxE, k_BxTxKxE, v_BxTxKxV, mask, causal=True,
                                     scale=scale)
  mask = position_mask(positions, segments, key_positions, key_segments)
  return fused_lib.fused_attention(q_BxLxHxE, k_BxTxKxE, v_BxTxKxV, mask, causal=False,
                                   scale=scale)


def _cached_impl(cfg, queries_BxLx_, keys_BxTx_, heads, kv_heads, qk_dim, v_dim) -> str:
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


def _attend_cache(q_BxLxHxE, keys_BxTxKxE, values_BxTxKxV, positions_BxL, scale, impl, cfg):
  """Prefill against the cache with the fused or blockwise kernel ('fused' | 'blockwise')."""
  batch, slots = keys_BxTxKxE.shape[:2]
  if impl == "fused":
    return fused_lib.fused_attention(q_BxLxHxE, keys_BxTxKxE, values_BxTxKxV,
                                     cache_mask(positions_BxL, slots), causal=False,
                                     scale=scale)
  slots_BxT = jnp.broadcast_to(jnp.arange(slots), (batch, slots))
  return blockwise_attention(q_BxLxHxE, keys_BxTxKxE, values_BxTxKxV, positions_BxL,
                             slots_BxT, scale=scale, block=cfg.attention_block)


def _impl(cfg, queries_BxLx_, keys_BxTx_, heads, kv_heads, qk_dim, v_dim, segments,
          ordered: bool) -> str:
  """cfg.attention_impl resolved for one training call (fused_attention.select_attention)."""
  mask = "positions" if not ordered else "causal" if segments is None else "documents"
  return fused_lib.choose(cfg, dtype=compute_dtype(cfg), heads=heads, kv_heads=kv_heads,
                          qk_head_dim=qk_dim, v_head_dim=v_dim,
                          queries=queries_BxLx_.shape[1], keys=keys_BxTx_.shape[1],
                          mask=mask)


def _gqa_attend(q_BxLxHxE, keys_BxTxKxE, values_BxTxKxE, mask_Bx1xLxT, dtype):
  """Query head j*G + i reads kv head j (HF repeat_kv order), without materialising
  repeated keys; works on per-shard heads as long as both head axes split alike."""
  batch, length, heads, e = q_BxLxHxE.shape
  kv_heads = keys_BxTxKxE.shape[2]
  q_BxLxKxGxE = q_BxLxHxE.reshape(batch, length, kv_heads, heads // kv_heads, e)
  if length == 1 and kernels.target_platform() == "cpu":
    return _gqa_step(q_BxLxKxGxE[:, 0], keys_BxTxKxE, values_BxTxKxE,
                     mask_Bx1xLxT[:, 0, 0], dtype).reshape(q_BxLxHxE.shape)
  scores_BxKxGxLxT = _einsum("blkge,btke->bkglt", q_BxLxKxGxE, keys_BxTxKxE) * e ** -0.5
  probs_BxKxGxLxT = masked_softmax(scores_BxKxGxLxT, mask_Bx1xLxT[:, None], dtype)
  out_BxLxKxGxE = jnp.einsum("bkglt,btke->blkge", probs_BxKxGxLxT, values_BxTxKxE)
  return out_BxLxKxGxE.reshape(q_BxLxHxE.shape)


def _gqa_step(q_BxKxGxE, keys_BxTxKxE, values_BxTxKxE, mask_BxT, dtype):
  """One query token a row (a decode step) on CPU, as multiply-and-sum over the cache as it
  lies ([B, T, K, E]), in float32. A dot_general wants the batch axes (B, K) outermost,
  so XLA:CPU copies each layer's whole cache into [B, K, T, E] on every step: at 4,096
  tokens of context and batch 8 that copy made the attention 5.9x slower than these two
  streaming reductions (tools/bench/bench_decode_attention.py). Not on TPU: its compiler
  materialises the broadcast product and estimates this form 7-9x slower than the dots,
  whose cache layout it chooses itself (the same bench, --target=v5p-8)."""
  e = q_BxKxGxE.shape[-1]
  q_Bx1xKxGxE = q_BxKxGxE.astype(jnp.float32)[:, None] * e ** -0.5
  scores_BxTxKxG = jnp.sum(q_Bx1xKxGxE * keys_BxTxKxE[:, :, :, None, :].astype(jnp.float32),
                           axis=-1)
  scores_BxTxKxG = jnp.where(mask_BxT[:, :, None, None], scores_BxTxKxG,
                             jnp.finfo(jnp.float32).min)
  probs_BxTxKxG = jax.nn.softmax(scores_BxTxKxG, axis=1).astype(dtype)
  return jnp.sum(probs_BxTxKxG[..., None].astype(jnp.float32)
                 * values_BxTxKxE[:, :, :, None, :].astype(jnp.float32), axis=1).astype(dtype)


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


def _mla_cached_expanded(cfg, q_nope_BxLxHxN, q_rope_BxLxHxR, c_BxTxC, k_rope_BxTxR,
                         w_CxHxN_V, positions_BxL, segment_ids_BxL, scale):
  """A long chunk against the latent cache: the latent up-projected to per-head
  k_nope | v once, then attention as in training (vLLM and SGLang prefill MLA this way)."""
  dtype, h, n = c_BxTxC.dtype, q_nope_BxLxHxN.shape[2], q_nope_BxLxHxN.shape[3]
  kv_BxTxHx_ = constrain(jnp.einsum("btc,chx->bthx", c_BxTxC, w_CxHxN_V), _BLHE)
  mask = layer_mask(positions_BxL, segment_ids_BxL, c_BxTxC.shape[1])
  v = kv_BxTxHx_.shape[-1] - n
  impl = _cached_impl(cfg, q_nope_BxLxHxN, kv_BxTxHx_, h, h, n + k_rope_BxTxR.shape[-1], v)
  if impl == "dense":
    return _mla_expanded(q_nope_BxLxHxN, q_rope_BxLxHxR, kv_BxTxHx_, k_rope_BxTxR, mask,
                         scale, dtype)
  return _attend_cache(*_mla_qkv(q_nope_BxLxHxN, q_rope_BxLxHxR, kv_BxTxHx_, k_rope_BxTxR),
                       positions_BxL, scale, impl, cfg)


def _mla_cached_absorbed(cfg, q_nope_BxLxHxN, q_rope_BxLxHxR, c_BxTxC, k_rope_BxTxR,
                         w_CxHxN_V, positions_BxL, segment_ids_BxL, scale):
  """Decode steps and short chunks: the up-projections absorbed into the query and the
  output, so every head scores and reads the latent cache itself."""
  dtype, h, n = c_BxTxC.dtype, q_nope_BxLxHxN.shape[2], q_nope_BxLxHxN.shape[3]
  c, r = c_BxTxC.shape[-1], k_rope_BxTxR.shape[-1]
  w_uk_CxHxN, w_uv_CxHxV = w_CxHxN_V[..., :n], w_CxHxN_V[..., n:]
  q_absorbed_BxLxHxC = jnp.einsum("blhn,chn->blhc", q_nope_BxLxHxN, w_uk_CxHxN)
  impl = _cached_impl(cfg, q_absorbed_BxLxHxC, c_BxTxC, h, 1, c + r, c)
  if impl != "dense":
    layer_mask(positions_BxL, segment_ids_BxL, c_BxTxC.shape[1])  # rejects segment ids
    # Absorbed MLA is multi-query attention: every head scores the one latent key
    # [c_kv | k_rope] and reads the latent c_kv as its value.
    q_BxLxHxE = jnp.concatenate([q_absorbed_BxLxHxC, q_rope_BxLxHxR.astype(dtype)], axis=-1)
    k_BxTx1xE = jnp.concatenate([c_BxTxC, k_rope_BxTxR], axis=-1)[:, :, None]
    context_BxLxHxC = _attend_cache(q_BxLxHxE, k_BxTx1xE, c_BxTxC[:, :, None],
                                    positions_BxL, scale, impl, cfg)
  else:
    scores_BxHxLxT = (_einsum("blhc,btc->bhlt", q_absorbed_BxLxHxC, c_BxTxC)
                      + _einsum("blhr,btr->bhlt", q_rope_BxLxHxR, k_rope_BxTxR)) * scale
    probs_BxHxLxT = masked_softmax(
        scores_BxHxLxT, layer_mask(positions_BxL, segment_ids_BxL, c_BxTxC.shape[1]), dtype)
    context_BxLxHxC = jnp.einsum("bhlt,btc->blhc", probs_BxHxLxT, c_BxTxC)
  return jnp.einsum("blhc,chv->blhv", context_BxLxHxC, w_uv_CxHxV)


class MLA(nn.Module):
  """Multi-head latent attention, parameters in HF DeepseekV3 order (see model contract)."""
  cfg: object

  @nn.compact
  def __call__(self, x_BxLxD, positions_BxL, segment_ids_BxL=None,
               cache: Cache | None = None):
    cfg = self.cfg
    dtype = compute_dtype(cfg)
    d, h = cfg.hidden_size, cfg.num_heads
    n, r, v, c = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    rope = rope_lib.Rope(cfg.rope, r)
    scale = rope_lib.mla_softmax_scale(cfg)

    if cfg.q_lora_rank is None:
      q_BxLxHxE = Linear((d,), (h, n + r), ("embed", "heads", "head_dim"), cfg,
                         name="q_proj")(x_BxLxD)
    else:
      q_lora = cfg.q_lora_rank
      q_BxLxQ = Linear((d,), (q_lora,), ("embed", "q_lora"), cfg, name="q_a_proj")(x_BxLxD)
      q_BxLxQ = RMSNorm(q_lora, "q_lora", cfg, name="q_a_norm")(q_BxLxQ)
      q_BxLxQ = constrain(q_BxLxQ, ("batch", "length", "q_lora"))
      q_BxLxHxE = Linear((q_lora,), (h, n + r), ("q_lora", "heads", "head_dim"), cfg,
                         name="q_b_proj")(q_BxLxQ)
    q_BxLxHxE = constrain(q_BxLxHxE, _BLHE)
    q_nope_BxLxHxN = q_BxLxHxE[..., :n]
    q_rope_BxLxHxR = rope(q_BxLxHxE[..., n:], positions_BxL)

    kv_BxLx_ = Linear((d,), (c + r,), ("embed", "kv_lora"), cfg, name="kv_a_proj")(x_BxLxD)
    c_kv_BxLxC = RMSNorm(c, "kv_lora", cfg, name="kv_a_norm")(kv_BxLx_[..., :c])
    c_kv_BxLxC = constrain(c_kv_BxLxC, ("batch", "length", "kv_lora"))
    k_rope_BxLxR = rope(kv_BxLx_[..., None, c:], positions_BxL)[:, :, 0]
    kv_b = Linear((c,), (h, n + v), ("kv_lora", "heads", "head_dim"), cfg, name="kv_b_proj")
    o_proj = Linear((h, v), (d,), ("heads", "head_dim", "embed"), cfg, name="o_proj")

    context_axes = _context_axes(self, cache is not None)
    if context_axes:
      def attend(q_nope, q_rope, positions, segments, key_positions, key_segments, c_kv,
                 k_rope, w_kv_b):
        # Up-projected after the gather: at Kimi-K2.5 size the latent + rope key (576
        # numbers a token) are ~29x smaller than the per-head k_nope | v they expand to.
        kv = jnp.einsum("btc,chx->bthx", c_kv, w_kv_b.astype(dtype))
        impl = _impl(cfg, q_nope, kv, h, h, n + r, v, segments, ordered=False)
        if impl == "fused":
          return _fused(*_mla_qkv(q_nope, q_rope, kv, k_rope), positions, segments,
                        key_positions, key_segments, scale, ordered=False)
        if impl == "blockwise":
          return _mla_blockwise(q_nope, q_rope, kv, k_rope, positions, segments,
                                key_positions, key_segments, scale, cfg)
        mask = position_mask(positions, segments, key_positions, key_segments)
        return _mla_expanded(q_nope, q_rope, kv, k_rope, mask, scale, dtype)

      q_spec = nn.logical_to_mesh_axes(_BLHE)
      token_inputs = [(positions_BxL, ("batch", "length")),
                      (segment_ids_BxL, ("batch", "length"))]
      out_BxLxHxV = _over_context(
          attend, context_axes,
          local=[(q_nope_BxLxHxN, _BLHE), (q_rope_BxLxHxR, _BLHE), *token_inputs],
          gathered=[*token_inputs, (c_kv_BxLxC, ("batch", "length", "kv_lora")),
                    (k_rope_BxLxR, ("batch", "length", "head_dim"))],
          weights=[kv_b.kernel], weight_specs=[jax.sharding.PartitionSpec(None, q_spec[2])],
          out_spec=q_spec)
      new_cache = None
    elif cache is None:
      kv_BxTxHx_ = constrain(kv_b(c_kv_BxLxC), _BLHE)
      impl = _impl(cfg, q_nope_BxLxHxN, kv_BxTxHx_, h, h, n + r, v, segment_ids_BxL,
                   ordered=True)
      if impl == "fused":
        out_BxLxHxV = _fused(*_mla_qkv(q_nope_BxLxHxN, q_rope_BxLxHxR, kv_BxTxHx_,
                                       k_rope_BxLxR),
                             None, segment_ids_BxL, None, segment_ids_BxL, scale,
                             ordered=True)
      elif impl == "blockwise":
        order_BxL = _token_order(positions_BxL)
        out_BxLxHxV = _mla_blockwise(q_nope_BxLxHxN, q_rope_BxLxHxR, kv_BxTxHx_, k_rope_BxLxR,
                                     order_BxL, segment_ids_BxL, order_BxL, segment_ids_BxL,
                                     scale, cfg)
      else:
        out_BxLxHxV = _mla_expanded(q_nope_BxLxHxN, q_rope_BxLxHxR, kv_BxTxHx_, k_rope_BxLxR,
                                    layer_mask(positions_BxL, segment_ids_BxL, None), scale,
                                    dtype)
      new_cache = None
    else:
      new_cache = {"c_kv": write_cache(cache["c_kv"], c_kv_BxLxC, positions_BxL),
                   "k_rope": write_cache(cache["k_rope"], k_rope_BxLxR, positions_BxL)}
      c_BxTxC = constrain(new_cache["c_kv"].astype(dtype), ("batch", "cache_length", "kv_lora"))
      k_rope_BxTxR = new_cache["k_rope"].astype(dtype)
      attend = (_mla_cached_expanded if prefill_expands(q_nope_BxLxHxN.shape[1], n, v, c)
                else _mla_cached_absorbed)
      out_BxLxHxV = attend(cfg, q_nope_BxLxHxN, q_rope_BxLxHxR, c_BxTxC, k_rope_BxTxR,
                           kv_b.kernel.astype(dtype), positions_BxL, segment_ids_BxL, scale)

    out_BxLxHxV = constrain(out_BxLxHxV.astype(dtype), _BLHE)
    return constrain(o_proj(out_BxLxHxV), ("batch", "length", "embed")), new_cache


class GQA(nn.Module):
  """Grouped-query attention with optional per-head q/k RMSNorm (Qwen3)."""
  cfg: object

  @nn.compact
  def __call__(self, x_BxLxD, positions_BxL, segment_ids_BxL=None,
               cache: Cache | None = None):
    cfg = self.cfg
    dtype = compute_dtype(cfg)
    d, h, k, e = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    rope = rope_lib.Rope(cfg.rope, e)

    q_BxLxHxE = Linear((d,), (h, e), ("embed", "heads", "head_dim"), cfg, name="q_proj")(x_BxLxD)
    k_BxLxKxE = Linear((d,), (k, e), ("embed", "kv_heads", "head_dim"), cfg,
                       name="k_proj")(x_BxLxD)
    v_BxLxKxE = Linear((d,), (k, e), ("embed", "kv_heads", "head_dim"), cfg,
                       name="v_proj")(x_BxLxD)
    if cfg.qk_norm:
      q_BxLxHxE = RMSNorm(e, "head_dim", cfg, name="q_norm")(q_BxLxHxE)
      k_BxLxKxE = RMSNorm(e, "head_dim", cfg, name="k_norm")(k_BxLxKxE)
    q_BxLxHxE = constrain(rope(q_BxLxHxE, positions_BxL), _BLHE)
    k_BxLxKxE = constrain(rope(k_BxLxKxE, positions_BxL), ("batch", "length", "kv_heads",
                                                            "head_dim"))
    v_BxLxKxE = constrain(v_BxLxKxE, ("batch", "length", "kv_heads", "head_dim"))

    new_cache = None
    context_axes = _context_axes(self, cache is not None)
    if context_axes:
      def attend(q, positions, segments, key_positions, key_segments, keys, values):
        impl = _impl(cfg, q, keys, h, k, e, e, segments, ordered=False)
        if impl == "fused":
          return _fused(q, keys, values, positions, segments, key_positions, key_segments,
                        e ** -0.5, ordered=False)
        if impl == "blockwise":
          return blockwise_attention(q, keys, values, positions, key_positions, segments,
                                     key_segments, scale=e ** -0.5, block=cfg.attention_block)
        mask = position_mask(positions, segments, key_positions, key_segments)
        return _gqa_attend(q, keys, values, mask, dtype)

      token_inputs = [(positions_BxL, ("batch", "length")),
                      (segment_ids_BxL, ("batch", "length"))]
      kv_axes = ("batch", "length", "kv_heads", "head_dim")
      out_BxLxHxE = _over_context(
          attend, context_axes, local=[(q_BxLxHxE, _BLHE), *token_inputs],
          gathered=[*token_inputs, (k_BxLxKxE, kv_axes), (v_BxLxKxE, kv_axes)],
          weights=[], weight_specs=[], out_spec=nn.logical_to_mesh_axes(_BLHE))
    elif cache is None and _impl(cfg, q_BxLxHxE, k_BxLxKxE, h, k, e, e, segment_ids_BxL,
                                 ordered=True) == "fused":
      out_BxLxHxE = _fused(q_BxLxHxE, k_BxLxKxE, v_BxLxKxE, None, segment_ids_BxL, None,
                           segment_ids_BxL, e ** -0.5, ordered=True)
    elif cache is None and _impl(cfg, q_BxLxHxE, k_BxLxKxE, h, k, e, e, segment_ids_BxL,
                                 ordered=True) == "blockwise":
      order_BxL = _token_order(positions_BxL)
      out_BxLxHxE = blockwise_attention(q_BxLxHxE, k_BxLxKxE, v_BxLxKxE, order_BxL, order_BxL,
                                        segment_ids_BxL, segment_ids_BxL, scale=e ** -0.5,
                                        block=cfg.attention_block)
    elif cache is None:
      out_BxLxHxE = _gqa_attend(q_BxLxHxE, k_BxLxKxE, v_BxLxKxE,
                                layer_mask(positions_BxL, segment_ids_BxL, None), dtype)
    else:
      new_cache = {"k": write_cache(cache["k"], k_BxLxKxE, positions_BxL),
                   "v": write_cache(cache["v"], v_BxLxKxE, positions_BxL)}
      keys_BxTxKxE, values_BxTxKxE = new_cache["k"].astype(dtype), new_cache["v"].astype(dtype)
      mask = layer_mask(positions_BxL, segment_ids_BxL, keys_BxTxKxE.shape[1])
      impl = _cached_impl(cfg, q_BxLxHxE, keys_BxTxKxE, h, k, e, e)
      if impl == "dense":
        out_BxLxHxE = _gqa_attend(q_BxLxHxE, keys_BxTxKxE, values_BxTxKxE, mask, dtype)
      else:
        out_BxLxHxE = _attend_cache(q_BxLxHxE, keys_BxTxKxE, values_BxTxKxE, positions_BxL,
                                    e ** -0.5, impl, cfg)
    out_BxLxHxE = constrain(out_BxLxHxE.astype(dtype), _BLHE)
    o_proj = Linear((h, e), (d,), ("heads", "head_dim", "embed"), cfg, name="o_proj")
    return constrain(o_proj(out_BxLxHxE), ("batch", "length", "embed")), new_cache


ATTENTION = {"mla": MLA, "gqa": GQA}
