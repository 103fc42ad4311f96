"""Blockwise (FlashAttention-2 style) causal attention in plain jnp + lax loops.

`blockwise_attention(q, k, v, ...)` equals softmax(q k^T * scale + mask) v, where key t is
visible to query i iff same segment and key_position_t <= query_position_i, without ever
holding more than one [block_q, block_k] score tile per head:
  forward   for each query block, an online softmax over key blocks (running max m, running
            sum l and the unnormalised output, all float32); saves the output and the
            per-row log-sum-exp lse = m + log l.
  backward  (custom_vjp) for each key block, loops over query blocks and recomputes the
            probabilities from lse, P = exp(S - lse); dV += P^T dO, dS = P * (dO V^T - D)
            with D = rowsum(dO * O), dK += dS^T Q, and dQ (a float32 [B, L, ...] carry)
            += dS K. Nothing quadratic in L is saved.
Tile pairs with no visible entry (above the causal diagonal, or between different
documents) are skipped with `lax.cond`.

Memory is O(L * heads * head_dim) for inputs, outputs and gradients plus O(block^2 * heads)
for the live tile, against O(L^2 * heads) float32 scores for the dense reference.

Masks use whatever order the positions give: the plain training path passes token indices
(then this is exactly the dense `causal_mask`), the context-parallel path the true
positions of local queries and gathered keys. Padding (segment id 0) is an ordinary
segment here, as in the dense path. Every query must see at least one key (itself, in
both callers); a row with none returns zeros.

Einsum legend: b batch, q queries of a block, t keys of a block, k kv heads, g query heads
per kv head (query head j*G + i reads kv head j, HF repeat_kv order), e q/k head dim,
v value head dim. Shapes: B batch, L queries, T keys, H = K*G heads, E, V head dims.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

# Segment ids given to the padding rows/columns that round L and T up to whole blocks:
# different from each other and from every real id (>= 0), so they see nothing.
_PAD_QUERY_SEGMENT, _PAD_KEY_SEGMENT = -1, -2


def blockwise_attention(q_BxLxHxE: jax.Array, k_BxTxKxE: jax.Array, v_BxTxKxV: jax.Array,
                        q_positions_BxL: jax.Array, k_positions_BxT: jax.Array,
                        q_segments_BxL: jax.Array | None = None,
                        k_segments_BxT: jax.Array | None = None, *, scale: float,
                        block: int = 512) -> jax.Array:
  """Causal, document-masked attention in [block, block] tiles; returns [B, L, H, V] in
  q's dtype. `H` must be a multiple of `K`; `block` bounds both tile sides (shorter
  sequences use one tile). Segments: both or neither (None = one document)."""
  batch, length, heads, e = q_BxLxHxE.shape
  keys, kv_heads = k_BxTxKxE.shape[1], k_BxTxKxE.shape[2]
  if heads % kv_heads:
    raise ValueError(f"blockwise_attention: {heads} query heads do not split into groups "
                     f"over {kv_heads} kv heads; num_heads must be a multiple of it.")
  if block < 1:
    raise ValueError(f"blockwise_attention: block = {block}; use a positive tile size "
                     "(config.model.attention_block).")
  if (q_segments_BxL is None) != (k_segments_BxT is None):
    raise ValueError("blockwise_attention: pass segment ids for both queries and keys, "
                     "or for neither.")
  if q_segments_BxL is None:
    q_segments_BxL = jnp.zeros((batch, length), jnp.int32)
    k_segments_BxT = jnp.zeros((batch, keys), jnp.int32)
  block_q, block_k = min(block, length), min(block, keys)
  q_pad, k_pad = -length % block_q, -keys % block_k

  q_BxLxKxGxE = q_BxLxHxE.reshape(batch, length, kv_heads, heads // kv_heads, e)
  q_BxLxKxGxE = jnp.pad(q_BxLxKxGxE, ((0, 0), (0, q_pad), (0, 0), (0, 0), (0, 0)))
  k_BxTxKxE = jnp.pad(k_BxTxKxE, ((0, 0), (0, k_pad), (0, 0), (0, 0)))
  v_BxTxKxV = jnp.pad(v_BxTxKxV, ((0, 0), (0, k_pad), (0, 0), (0, 0)))
  q_pos = jnp.pad(q_positions_BxL.astype(jnp.int32), ((0, 0), (0, q_pad)))
  k_pos = jnp.pad(k_positions_BxT.astype(jnp.int32), ((0, 0), (0, k_pad)))
  q_seg = jnp.pad(q_segments_BxL.astype(jnp.int32), ((0, 0), (0, q_pad)),
                  constant_values=_PAD_QUERY_SEGMENT)
  k_seg = jnp.pad(k_segments_BxT.astype(jnp.int32), ((0, 0), (0, k_pad)),
                  constant_values=_PAD_KEY_SEGMENT)

  # Ties the masks' inputs to q/k/v. In a layer scan the positions and segment ids are
  # loop-invariant, and differentiating the scan hoists loop-invariant work out of it:
  # every tile's mask would be computed once up front and kept, [L/block, T/block, block,
  # block] per head (quadratic memory). Behind the barrier the masks depend on the layer's
  # activations and stay inside the tile loops.
  q_BxLxKxGxE, k_BxTxKxE, v_BxTxKxV, q_pos, k_pos, q_seg, k_seg = jax.lax.optimization_barrier(
      (q_BxLxKxGxE, k_BxTxKxE, v_BxTxKxV, q_pos, k_pos, q_seg, k_seg))
  out_BxLxKxGxV = _attention(float(scale), block_q, block_k)(
      q_BxLxKxGxE, k_BxTxKxE, v_BxTxKxV, q_pos, k_pos, q_seg, k_seg)
  return out_BxLxKxGxV[:, :length].reshape(batch, length, heads, v_BxTxKxV.shape[-1])


def _tile_mask(q_pos_Bxq, q_seg_Bxq, k_pos_Bxt, k_seg_Bxt) -> jax.Array:
  """[B, 1, 1, q, t] bool, broadcastable over the score tile's head axes."""
  mask_Bxqxt = ((k_pos_Bxt[:, None, :] <= q_pos_Bxq[:, :, None])
                & (k_seg_Bxt[:, None, :] == q_seg_Bxq[:, :, None]))
  return mask_Bxqxt[:, None, None]


def _scores(q_Bxqx_, k_Bxtx_, scale):
  return jnp.einsum("bqkge,btke->bkgqt", q_Bxqx_, k_Bxtx_,
                    preferred_element_type=jnp.float32) * scale


def _zero_like_inputs(*arrays) -> jax.Array:
  """A float32 0 computed from every input. Loop carries started from it carry the same
  shard_map varying-axes type as values computed from those inputs, which `lax.cond`
  needs of its two branches when this runs per context shard (the skip branch returns
  the carry unchanged)."""
  return sum(jax.lax.stop_gradient(a.reshape(-1)[0]).astype(jnp.float32) * 0.0
             for a in arrays)


def _slice(x_BxLx_, start, size):
  return jax.lax.dynamic_slice_in_dim(x_BxLx_, start, size, axis=1)


def _forward(q, k, v, q_pos, k_pos, q_seg, k_seg, scale, block_q, block_k):
  """(out [B, L, K, G, V] in q's dtype, lse [B, K, G, L] float32)."""
  batch, length, kv_heads, groups, _ = q.shape
  v_dim = v.shape[-1]
  num_k_blocks = k.shape[1] // block_k

  def query_block(_, start):
    q_blk = _slice(q, start, block_q)
    q_pos_blk, q_seg_blk = _slice(q_pos, start, block_q), _slice(q_seg, start, block_q)

    def key_block(j, carry):
      k_start = j * block_k
      mask = _tile_mask(q_pos_blk, q_seg_blk, _slice(k_pos, k_start, block_k),
                        _slice(k_seg, k_start, block_k))

      def update(carry):
        m_BxKxGxq, l_BxKxGxq, acc_BxKxGxqxV = carry
        v_blk = _slice(v, k_start, block_k)
        s = jnp.where(mask, _scores(q_blk, _slice(k, k_start, block_k), scale), -jnp.inf)
        m_new = jnp.maximum(m_BxKxGxq, s.max(axis=-1))
        # A row whose keys so far are all masked keeps m = -inf; shift by 0 instead so
        # exp gives 0 rather than NaN.
        shift = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        p = jnp.exp(s - shift[..., None])
        alpha = jnp.exp(m_BxKxGxq - shift)
        pv = jnp.einsum("bkgqt,btkv->bkgqv", p.astype(v.dtype), v_blk,
                        preferred_element_type=jnp.float32)
        return (m_new, alpha * l_BxKxGxq + p.sum(axis=-1),
                alpha[..., None] * acc_BxKxGxqxV + pv)

      return jax.lax.cond(mask.any(), update, lambda c: c, carry)

    zero = _zero_like_inputs(q, k, v, q_pos, k_pos, q_seg, k_seg)
    init = (jnp.full((batch, kv_heads, groups, block_q), -jnp.inf, jnp.float32) + zero,
            jnp.zeros((batch, kv_heads, groups, block_q), jnp.float32) + zero,
            jnp.zeros((batch, kv_heads, groups, block_q, v_dim), jnp.float32) + zero)
    m, l, acc = jax.lax.fori_loop(0, num_k_blocks, key_block, init)
    seen = l > 0
    out = acc / jnp.where(seen, l, 1.0)[..., None]
    lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), 0.0)
    return None, (jnp.einsum("bkgqv->bqkgv", out).astype(q.dtype), lse)

  starts = jnp.arange(length // block_q) * block_q
  _, (out_NxBxqxKxGxV, lse_NxBxKxGxq) = jax.lax.scan(query_block, None, starts)
  out = jnp.moveaxis(out_NxBxqxKxGxV, 0, 1).reshape(batch, length, kv_heads, groups, v_dim)
  lse = jnp.moveaxis(lse_NxBxKxGxq, 0, 3).reshape(batch, kv_heads, groups, length)
  return out, lse


@functools.cache
def _attention(scale: float, block_q: int, block_k: int):
  """The custom_vjp attention for one (scale, tile shape)."""

  @jax.custom_vjp
  def attention(q, k, v, q_pos, k_pos, q_seg, k_seg):
    return _forward(q, k, v, q_pos, k_pos, q_seg, k_seg, scale, block_q, block_k)[0]

  def attention_fwd(q, k, v, q_pos, k_pos, q_seg, k_seg):
    out, lse = _forward(q, k, v, q_pos, k_pos, q_seg, k_seg, scale, block_q, block_k)
    return out, (q, k, v, q_pos, k_pos, q_seg, k_seg, out, lse)

  def attention_bwd(residuals, d_out):
    return _backward(scale, block_q, block_k, residuals, d_out)

  attention.defvjp(attention_fwd, attention_bwd)
  return attention


def _backward(scale, block_q, block_k, residuals, d_out):
  q, k, v, q_pos, k_pos, q_seg, k_seg, out, lse = residuals
  length = q.shape[1]
  # D_i = sum_v dO_iv O_iv = sum_t P_it dP_it: the softmax Jacobian's row term.
  delta_BxKxGxL = jnp.einsum("blkgv,blkgv->bkgl", d_out.astype(jnp.float32),
                             out.astype(jnp.float32))

  def key_block(dq_f32, k_start):
    k_blk, v_blk = _slice(k, k_start, block_k), _slice(v, k_start, block_k)
    k_pos_blk, k_seg_blk = _slice(k_pos, k_start, block_k), _slice(k_seg, k_start, block_k)

    def query_block(i, carry):
      start = i * block_q
      mask = _tile_mask(_slice(q_pos, start, block_q), _slice(q_seg, start, block_q),
                        k_pos_blk, k_seg_blk)

      def update(carry):
        dq, dk_BxtxKxE, dv_BxtxKxV = carry
        q_blk, do_blk = _slice(q, start, block_q), _slice(d_out, start, block_q)
        lse_blk = jax.lax.dynamic_slice_in_dim(lse, start, block_q, axis=3)
        delta_blk = jax.lax.dynamic_slice_in_dim(delta_BxKxGxL, start, block_q, axis=3)
        p = jnp.where(mask, jnp.exp(_scores(q_blk, k_blk, scale) - lse_blk[..., None]), 0.0)
        dv_BxtxKxV = dv_BxtxKxV + jnp.einsum("bkgqt,bqkgv->btkv", p.astype(d_out.dtype),
                                             do_blk, preferred_element_type=jnp.float32)
        dp = jnp.einsum("bqkgv,btkv->bkgqt", do_blk, v_blk,
                        preferred_element_type=jnp.float32)
        ds = p * (dp - delta_blk[..., None]) * scale
        dk_BxtxKxE = dk_BxtxKxE + jnp.einsum("bkgqt,bqkge->btke", ds.astype(q.dtype), q_blk,
                                             preferred_element_type=jnp.float32)
        dq_blk = jnp.einsum("bkgqt,btke->bqkge", ds.astype(k.dtype), k_blk,
                            preferred_element_type=jnp.float32)
        dq = jax.lax.dynamic_update_slice_in_dim(
            dq, _slice(dq, start, block_q) + dq_blk, start, axis=1)
        return dq, dk_BxtxKxE, dv_BxtxKxV

      return jax.lax.cond(mask.any(), update, lambda c: c, carry)

    init = (dq_f32, jnp.zeros(k_blk.shape, jnp.float32) + zero,
            jnp.zeros(v_blk.shape, jnp.float32) + zero)
    dq_f32, dk, dv = jax.lax.fori_loop(0, length // block_q, query_block, init)
    return dq_f32, (dk.astype(k.dtype), dv.astype(v.dtype))

  zero = _zero_like_inputs(q, k, v, q_pos, k_pos, q_seg, k_seg, out, lse, d_out)
  starts = jnp.arange(k.shape[1] // block_k) * block_k
  dq_f32, (dk_NxBxtxKxE, dv_NxBxtxKxV) = jax.lax.scan(
      key_block, jnp.zeros(q.shape, jnp.float32) + zero, starts)
  dk = jnp.moveaxis(dk_NxBxtxKxE, 0, 1).reshape(k.shape)
  dv = jnp.moveaxis(dv_NxBxtxKxV, 0, 1).reshape(v.shape)
  # Integer inputs (positions, segment ids) have no cotangent.
  return (dq_f32.astype(q.dtype), dk, dv, None, None, None, None)


