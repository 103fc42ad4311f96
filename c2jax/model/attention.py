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
latent directly, and the latent context is mapped to values through W_uv afterwards. A
long prefill chunk instead up-projects the cached latent once and attends per head
(attention_forms.prefill_expands). The attention arithmetic itself, given q, k and v, is
in attention_forms.py.

Shape legend: B batch, L new tokens, T key slots (L in training, cache length when
decoding), S a context shard's share of L, D hidden, H heads, K kv heads, G = H / K query
heads per kv head, E head dim, N nope dims, R rope dims, V value dims, C kv_lora rank,
Q q_lora rank.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from c2jax.model import attention_forms as forms
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
# jax.nn.dot_product_attention (cuDNN on GPU); 'tokamax' the kernel library's flash
# attention (opt-in); 'auto' lets
# c2jax.model.fused_attention.select_attention pick per call.
ATTENTION_IMPLS = fused_lib.IMPLS

_BLHE = forms.BLHE


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
        impl = forms.training_impl(cfg, q_nope, kv, h, h, n + r, v, segments, ordered=False)
        if impl in fused_lib.MASKED_CALL_IMPLS:
          return forms.fused(*forms.mla_qkv(q_nope, q_rope, kv, k_rope), positions,
                             segments, key_positions, key_segments, scale, ordered=False,
                             impl=impl)
        if impl == "blockwise":
          return forms.mla_blockwise(q_nope, q_rope, kv, k_rope, positions, segments,
                                     key_positions, key_segments, scale, cfg)
        mask = position_mask(positions, segments, key_positions, key_segments)
        return forms.mla_expanded(q_nope, q_rope, kv, k_rope, mask, scale, dtype)

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
      impl = forms.training_impl(cfg, q_nope_BxLxHxN, kv_BxTxHx_, h, h, n + r, v,
                                 segment_ids_BxL, ordered=True)
      if impl in fused_lib.MASKED_CALL_IMPLS:
        qkv = forms.mla_qkv(q_nope_BxLxHxN, q_rope_BxLxHxR, kv_BxTxHx_, k_rope_BxLxR)
        out_BxLxHxV = forms.fused(*qkv, None, segment_ids_BxL, None, segment_ids_BxL, scale,
                                  ordered=True, impl=impl)
      elif impl == "blockwise":
        order_BxL = forms.token_order(positions_BxL)
        out_BxLxHxV = forms.mla_blockwise(q_nope_BxLxHxN, q_rope_BxLxHxR, kv_BxTxHx_,
                                          k_rope_BxLxR, order_BxL, segment_ids_BxL, order_BxL,
                                          segment_ids_BxL, scale, cfg)
      else:
        out_BxLxHxV = forms.mla_expanded(q_nope_BxLxHxN, q_rope_BxLxHxR, kv_BxTxHx_,
                                         k_rope_BxLxR,
                                         layer_mask(positions_BxL, segment_ids_BxL, None),
                                         scale, dtype)
      new_cache = None
    else:
      new_cache = {"c_kv": write_cache(cache["c_kv"], c_kv_BxLxC, positions_BxL),
                   "k_rope": write_cache(cache["k_rope"], k_rope_BxLxR, positions_BxL)}
      c_BxTxC = constrain(new_cache["c_kv"].astype(dtype), ("batch", "cache_length", "kv_lora"))
      k_rope_BxTxR = new_cache["k_rope"].astype(dtype)
      expands = forms.prefill_expands(q_nope_BxLxHxN.shape[1], n, v, c)
      attend = forms.mla_cached_expanded if expands else forms.mla_cached_absorbed
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
        impl = forms.training_impl(cfg, q, keys, h, k, e, e, segments, ordered=False)
        if impl in fused_lib.MASKED_CALL_IMPLS:
          return forms.fused(q, keys, values, positions, segments, key_positions,
                             key_segments, e ** -0.5, ordered=False, impl=impl)
        if impl == "blockwise":
          return blockwise_attention(q, keys, values, positions, key_positions, segments,
                                     key_segments, scale=e ** -0.5, block=cfg.attention_block)
        mask = position_mask(positions, segments, key_positions, key_segments)
        return forms.gqa_attend(q, keys, values, mask, dtype)

      token_inputs = [(positions_BxL, ("batch", "length")),
                      (segment_ids_BxL, ("batch", "length"))]
      kv_axes = ("batch", "length", "kv_heads", "head_dim")
      out_BxLxHxE = _over_context(
          attend, context_axes, local=[(q_BxLxHxE, _BLHE), *token_inputs],
          gathered=[*token_inputs, (k_BxLxKxE, kv_axes), (v_BxLxKxE, kv_axes)],
          weights=[], weight_specs=[], out_spec=nn.logical_to_mesh_axes(_BLHE))
    elif cache is None:
      impl = forms.training_impl(cfg, q_BxLxHxE, k_BxLxKxE, h, k, e, e, segment_ids_BxL,
                                 ordered=True)
      if impl in fused_lib.MASKED_CALL_IMPLS:
        out_BxLxHxE = forms.fused(q_BxLxHxE, k_BxLxKxE, v_BxLxKxE, None, segment_ids_BxL, None,
                                  segment_ids_BxL, e ** -0.5, ordered=True, impl=impl)
      elif impl == "blockwise":
        order_BxL = forms.token_order(positions_BxL)
        out_BxLxHxE = blockwise_attention(q_BxLxHxE, k_BxLxKxE, v_BxLxKxE, order_BxL,
                                          order_BxL, segment_ids_BxL, segment_ids_BxL,
                                          scale=e ** -0.5, block=cfg.attention_block)
      else:
        out_BxLxHxE = forms.gqa_attend(q_BxLxHxE, k_BxLxKxE, v_BxLxKxE,
                                       layer_mask(positions_BxL, segment_ids_BxL, None), dtype)
    else:
      new_cache = {"k": write_cache(cache["k"], k_BxLxKxE, positions_BxL),
                   "v": write_cache(cache["v"], v_BxLxKxE, positions_BxL)}
      keys_BxTxKxE, values_BxTxKxE = new_cache["k"].astype(dtype), new_cache["v"].astype(dtype)
      mask = layer_mask(positions_BxL, segment_ids_BxL, keys_BxTxKxE.shape[1])
      impl = forms.cached_impl(cfg, q_BxLxHxE, keys_BxTxKxE, h, k, e, e)
      if impl == "dense":
        out_BxLxHxE = forms.gqa_attend(q_BxLxHxE, keys_BxTxKxE, values_BxTxKxE, mask, dtype)
      else:
        out_BxLxHxE = forms.attend_cache(q_BxLxHxE, keys_BxTxKxE, values_BxTxKxE,
                                         positions_BxL, e ** -0.5, impl, cfg)
    out_BxLxHxE = constrain(out_BxLxHxE.astype(dtype), _BLHE)
    o_proj = Linear((h, e), (d,), ("heads", "head_dim", "embed"), cfg, name="o_proj")
    return constrain(o_proj(out_BxLxHxE), ("batch", "length", "embed")), new_cache


ATTENTION = {"mla": MLA, "gqa": GQA}
