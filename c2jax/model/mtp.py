"""DeepSeek-V3-style multi-token prediction (MTP) modules and their self-distillation loss.

Depth k (0-based, k < cfg.num_mtp_layers) at position i combines the previous depth's
hidden state h^k_i (h^0 = the main model's final hidden state) with the embedding of
token t_{i+k+1}:
    x = eh_proj(concat(enorm(embed(t_{i+k+1})), hnorm(h^k_i)))
    h^{k+1}_i = DecoderBlock(x)          (attention + dense MLP or MoE, as a main layer)
    logits^k_i = lm_head(final_norm(h^{k+1}_i))      predicts t_{i+k+2}
The embedding table and LM head are the main model's (shared, as in DeepSeek-V3); each
depth has its own norms (HF `enorm`, `hnorm`, `shared_head.norm`), `eh_proj` and block.
The main hidden state is the main model's final-norm output (what HF/vLLM pass on).

Parameters live beside the main model's in one tree, under `mtp_layers/`, stacked over
depths by `nn.scan` (leading axis 'layers'):
  enorm/scale, hnorm/scale [Dm, D]; eh_proj/kernel [Dm, 2D, D] (rows: [embedding | hidden]);
  block/{attn_norm, attn, mlp_norm, mlp|moe} as a main layer; final_norm/scale [Dm, D].

Training (`loss`): each depth matches the main head's full distribution at the position
that predicts the same token (KL to its stop-gradient softmax), optionally plus
cross-entropy on the data. With frozen_trunk the main model gets no gradient (MTP
attached to a frozen checkpoint); otherwise the trunk, embedding and head train jointly.
When the block is an MoE layer (`uses_moe`), `apply` and `loss` also return its routing
statistics ({'expert_loads': [Dm, E], 'aux_loss': scalar}, as the main model's aux), so
the train step adds its balance loss and nudges its correction biases like the trunk's.

Shape legend: Dm MTP depths, B batch, L length, D hidden, V vocab.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from c2jax.model import attention as attention_lib
from c2jax.model import token_logprobs
from c2jax.model.layers import Linear, RMSNorm, compute_dtype, constrain
from c2jax.model.transformer import DecoderBlock, Transformer, transformer_for

PARAMS_KEY = "mtp_layers"


def uses_moe(cfg) -> bool:
  """Whether the MTP block is an MoE layer: it is one more layer past the main model's
  last, so it is MoE exactly when the main model has MoE layers."""
  return cfg.num_layers > cfg.first_k_dense


class MTPLayer(nn.Module):
  """One depth; a scan body: carry = hidden, xs = (next-token embeddings, cache);
  outputs (normed hidden, MoE routing stats or None, new cache)."""
  cfg: object

  @nn.compact
  def __call__(self, h_BxLxD, xs, positions_BxL, segment_ids_BxL):
    next_emb_BxLxD, cache = xs
    cfg = self.cfg
    d = cfg.hidden_size
    e_BxLxD = RMSNorm(d, "embed", cfg, name="enorm")(next_emb_BxLxD)
    g_BxLxD = RMSNorm(d, "embed", cfg, name="hnorm")(h_BxLxD)
    x_BxLxD = Linear((2 * d,), (d,), (None, "embed"), cfg, name="eh_proj")(
        jnp.concatenate([e_BxLxD, g_BxLxD], axis=-1))
    x_BxLxD = constrain(x_BxLxD, ("batch", "length", "embed"))
    x_BxLxD, (stats, new_cache) = DecoderBlock(cfg, uses_moe(cfg), name="block")(
        x_BxLxD, (None, cache), positions_BxL, segment_ids_BxL)
    out_BxLxD = RMSNorm(d, "embed", cfg, name="final_norm")(x_BxLxD)
    return x_BxLxD, (out_BxLxD, stats, new_cache)


def _stack(cfg) -> nn.Module:
  return nn.scan(MTPLayer, variable_axes={"params": 0}, split_rngs={"params": True},
                 in_axes=(0, nn.broadcast, nn.broadcast), length=cfg.num_mtp_layers,
                 metadata_params={nn.PARTITION_NAME: "layers"})(cfg, name=PARAMS_KEY)


def _check(cfg):
  if cfg.num_mtp_layers < 1:
    raise ValueError("config.num_mtp_layers = 0: set it >= 1 to build MTP modules.")


def init_boxed(cfg, rng: jax.Array) -> dict:
  """Fresh `mtp_layers` parameters still boxed with their logical axis names
  (model.init / model.param_axes place them at params['mtp_layers'])."""
  _check(cfg)
  h_1x1xD = jnp.zeros((1, 1, cfg.hidden_size), compute_dtype(cfg))
  xs = (jnp.zeros((cfg.num_mtp_layers, 1, 1, cfg.hidden_size), compute_dtype(cfg)), None)
  positions_1x1 = jnp.zeros((1, 1), jnp.int32)
  return _stack(cfg).init(rng, h_1x1xD, xs, positions_1x1, None)["params"]


def init(cfg, rng: jax.Array) -> dict:
  """Fresh `mtp_layers` parameters alone (model.init already includes them)."""
  return nn.unbox(init_boxed(cfg, rng))


def forward_with_hidden(cfg, params, tokens_BxL, **kwargs):
  """model.apply plus the main model's final hidden state: (logits, aux, cache, hidden)."""
  (logits, aux, cache), state = transformer_for(cfg, params).apply(
      {"params": params}, tokens_BxL, **kwargs, mutable=["intermediates"],
      capture_intermediates=lambda mdl, _: (mdl.name == "final_norm"
                                            and isinstance(mdl.parent, Transformer)))
  (hidden_BxLxD,) = state["intermediates"]["final_norm"]["__call__"]
  return logits, aux, cache, hidden_BxLxD


def _embed(cfg, params, tokens):
  """Embeddings of `tokens` ([..., B, L]) split like the main model's: without the
  constraint the partitioner gathered DeepSeek-V3's [B, L, D] whole on every device
  (its float32 gradient 28 GB per device at 256 x 4,096 tokens)."""
  x = jnp.take(params["embed"]["embedding"].astype(compute_dtype(cfg)), tokens, axis=0)
  return constrain(x, (None,) * (tokens.ndim - 2) + ("batch", "length", "embed"))


def _head(cfg, params, out_BxLxD):
  kernel_DxV = params["lm_head"]["kernel"].astype(compute_dtype(cfg))
  return jnp.einsum("bld,dv->blv", out_BxLxD, kernel_DxV, preferred_element_type=jnp.float32)


def shift_left(x_BxL, by: int):
  """x [B, L, ...] moved `by` positions left along L, zeros (token 0) at the end."""
  return jnp.pad(x_BxL[:, by:], [(0, 0), (0, by)] + [(0, 0)] * (x_BxL.ndim - 2))


def _moe_aux(cfg, stats) -> dict:
  """The MTP blocks' routing stats as the main model's aux: loads [Dm, E] (empty [0, E]
  for dense blocks) and the summed balance loss."""
  if stats is None:
    return {"expert_loads": jnp.zeros((0, cfg.moe.num_experts), jnp.float32),
            "aux_loss": jnp.zeros((), jnp.float32)}
  return {"expert_loads": stats["expert_loads"].astype(jnp.float32),
          "aux_loss": jnp.sum(stats["aux_loss"]).astype(jnp.float32)}


def hidden_states(cfg, params, hidden_BxLxD, tokens_BxL, positions_BxL=None,
                  segment_ids_BxL=None):
  """Teacher-forced final-normed MTP hidden states for all depths (the LM head's input)
  and the blocks' routing stats: (out [Dm, B, L, D] in the compute dtype,
  {'expert_loads': [Dm, E] or [0, E], 'aux_loss': []}). Positions past the sequence end
  read padding token 0."""
  _check(cfg)
  batch, length = tokens_BxL.shape
  if positions_BxL is None:
    positions_BxL = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
  next_DmxBxL = jnp.stack([shift_left(tokens_BxL, k + 1)
                           for k in range(cfg.num_mtp_layers)])
  xs = (_embed(cfg, params, next_DmxBxL), None)
  _, (out_DmxBxLxD, stats, _) = _stack(cfg).apply(
      {"params": params[PARAMS_KEY]}, hidden_BxLxD.astype(compute_dtype(cfg)), xs,
      positions_BxL, segment_ids_BxL)
  return out_DmxBxLxD, _moe_aux(cfg, stats)


def apply(cfg, params, hidden_BxLxD, tokens_BxL, positions_BxL=None, segment_ids_BxL=None):
  """Teacher-forced MTP logits for all depths and the blocks' routing stats:
  (logits [Dm, B, L, V] float32, {'expert_loads': [Dm, E] or [0, E], 'aux_loss': []}).
  Depth k at position i predicts t_{i+k+2}; positions past the sequence end read padding
  token 0."""
  out_DmxBxLxD, moe_aux = hidden_states(cfg, params, hidden_BxLxD, tokens_BxL,
                                        positions_BxL, segment_ids_BxL)
  return jax.vmap(lambda out: _head(cfg, params, out))(out_DmxBxLxD), moe_aux


def depth_weights(segments_BxL, mask_BxL, shift: int):
  """float32 [B, L]: where depth shift - 1 is trained at position i. t_{i+shift} must exist
  in the same document (segment id, 0 = padding) and mask (the main head's target mask,
  at i + shift) be set."""
  length = segments_BxL.shape[1]
  valid_BxL = ((segments_BxL != 0)
               & (segments_BxL == shift_left(segments_BxL, shift))
               & (jnp.arange(length) < length - shift)[None])
  return valid_BxL * shift_left(mask_BxL.astype(jnp.float32), shift)


def init_layer_cache(cfg, batch: int, max_length: int, dtype=None) -> dict:
  """The decode cache of one MTP depth (its block's attention): [B, T, ...] arrays."""
  dtype = jnp.dtype(cfg.dtype if dtype is None else dtype)
  stacked = attention_lib.init_layer_cache(cfg, 1, batch, max_length, dtype)
  return jax.tree.map(lambda x: x[0], stacked)


def apply_layer(cfg, params, depth: int, hidden_BxLxD, next_tokens_BxL, positions_BxL,
                cache):
  """One depth over a KV cache (drafting): (hidden out, logits [B, L, V], new cache)."""
  layer_params = jax.tree.map(lambda x: x[depth], params[PARAMS_KEY])
  h_BxLxD, (out_BxLxD, _, new_cache) = MTPLayer(cfg).apply(
      {"params": layer_params}, hidden_BxLxD.astype(compute_dtype(cfg)),
      (_embed(cfg, params, next_tokens_BxL), cache), positions_BxL, None)
  return h_BxLxD, _head(cfg, params, out_BxLxD), new_cache


def loss(cfg, params, tokens_BxL, hidden_BxLxD, main_logits_BxLxV=None, *, targets_BxL=None,
         positions_BxL=None, segment_ids_BxL=None, loss_mask_BxL=None,
         kl_weight: float = 1.0, ce_weight: float = 0.0, frozen_trunk: bool = False,
         counts_Dm=None, vocab_chunk: int = 0):
  """(weighted MTP loss, metrics, moe_aux): the loss is the mean over depths of
  kl_weight * KL(main || mtp) + ce_weight * CE, each averaged over valid positions;
  moe_aux is `apply`'s routing stats of the MTP blocks, whose aux_loss is not in the loss
  (the caller adds it beside the main model's, as it nudges their correction biases).

  Depth k at position i is valid when t_{i+k+1} exists in the same document (segment id,
  0 = padding) and loss_mask (of the main target at i+k+1) is set. targets_BxL (t_{i+1} at
  i) is needed only for ce_weight > 0. Metrics per depth: kl, ce (if used) and `agree`,
  the fraction where the MTP argmax equals the main argmax (greedy acceptance rate).
  counts_Dm: the valid positions per depth to average over instead of this batch's own
  (gradient accumulation passes the whole batch's, so microbatch losses add up to it).

  vocab_chunk = 0: the plain computation from the main logits [B, L, V] (float32), the
  MTP logits and their softmaxes at full size. vocab_chunk > 0 (config.train.
  mtp_vocab_chunk): main_logits_BxLxV is not needed; each depth's KL, argmax agreement
  and CE are accumulated over chunks of `vocab_chunk` vocabulary columns
  (`_vocab_chunked_terms`), the teacher's logits recomputed from the main hidden state
  shifted along the sequence, so no [B, L, V] array exists and the only shift is of
  [B, L, D] hidden states (DeepSeek-V3 at 256 x 4,096 tokens on 256 devices: 9.3 GB less
  per device than the plain computation, docs/scaling.md).
  """
  _check(cfg)
  if ce_weight and targets_BxL is None:
    raise ValueError("mtp.loss: ce_weight > 0 needs targets_BxL (the next-token labels).")
  if vocab_chunk < 0 or (vocab_chunk == 0 and main_logits_BxLxV is None):
    raise ValueError(f"mtp.loss: vocab_chunk = {vocab_chunk}; use > 0 (chunked, config."
                     "train.mtp_vocab_chunk) or 0 with the main logits.")
  if frozen_trunk:
    hidden_BxLxD = jax.lax.stop_gradient(hidden_BxLxD)
    params = {**params, "embed": jax.lax.stop_gradient(params["embed"]),
              "lm_head": jax.lax.stop_gradient(params["lm_head"])}
  batch, length = tokens_BxL.shape
  segments_BxL = (jnp.ones((batch, length), jnp.int32) if segment_ids_BxL is None
                  else segment_ids_BxL)
  mask_BxL = (jnp.ones((batch, length), jnp.float32) if loss_mask_BxL is None
              else loss_mask_BxL.astype(jnp.float32))
  if vocab_chunk:
    out_DmxBxLxD, moe_aux = hidden_states(cfg, params, hidden_BxLxD, tokens_BxL,
                                          positions_BxL, segment_ids_BxL)
    # The teacher is the main head's stop-gradient distribution, as from the main logits.
    main_BxLxD = jax.lax.stop_gradient(hidden_BxLxD.astype(compute_dtype(cfg)))

    def depth_terms(k, shift, labels_BxL):
      return _vocab_chunked_terms(out_DmxBxLxD[k], shift_left(main_BxLxD, shift),
                                  params["lm_head"]["kernel"], labels_BxL, vocab_chunk)
  else:
    logits_DmxBxLxV, moe_aux = apply(cfg, params, hidden_BxLxD, tokens_BxL, positions_BxL,
                                     segment_ids_BxL)
    teacher_logp_BxLxV = jax.nn.log_softmax(jax.lax.stop_gradient(main_logits_BxLxV), -1)

    def depth_terms(k, shift, labels_BxL):
      teacher_BxLxV = shift_left(teacher_logp_BxLxV, shift)
      student_BxLxV = jax.nn.log_softmax(logits_DmxBxLxV[k], axis=-1)
      kl_BxL = jnp.sum(jnp.exp(teacher_BxLxV) * (teacher_BxLxV - student_BxLxV), axis=-1)
      agree_BxL = jnp.argmax(student_BxLxV, -1) == jnp.argmax(teacher_BxLxV, -1)
      nll_BxL = None if labels_BxL is None else -jnp.take_along_axis(
          student_BxLxV, labels_BxL[..., None], axis=-1)[..., 0]
      return kl_BxL, agree_BxL, nll_BxL

  total, metrics = 0.0, {}
  for k in range(cfg.num_mtp_layers):
    shift = k + 1
    weight_BxL = depth_weights(segments_BxL, mask_BxL, shift)
    count = jnp.maximum(weight_BxL.sum() if counts_Dm is None else counts_Dm[k], 1.0)
    labels_BxL = shift_left(targets_BxL, shift) if ce_weight else None
    kl_BxL, agree_BxL, nll_BxL = depth_terms(k, shift, labels_BxL)
    kl = jnp.sum(kl_BxL * weight_BxL) / count
    metrics[f"mtp{k}/kl"] = kl
    metrics[f"mtp{k}/agree"] = jnp.sum(agree_BxL * weight_BxL) / count
    depth_loss = kl_weight * kl
    if ce_weight:
      ce = jnp.sum(nll_BxL * weight_BxL) / count
      metrics[f"mtp{k}/ce"] = ce
      depth_loss += ce_weight * ce
    total += depth_loss
  return total / cfg.num_mtp_layers, metrics, moe_aux


_MASKED = token_logprobs.MASKED_LOGIT


def _vocab_chunked_terms(student_BxLxD, teacher_BxLxD, kernel_DxV, labels_BxL, vocab_chunk):
  """Per position: (KL(softmax(teacher logits) || softmax(student logits)) [B, L],
  argmax agreement [B, L] bool, the student's NLL of labels [B, L] or None), the logits
  being hidden @ kernel in float32, accumulated over vocabulary chunks of `vocab_chunk`.

  One lax.scan step per chunk W (its body rematerialised: the backward recomputes the
  chunk's logits), carrying online statistics per position: for the teacher the running
  max m_t, sum s_t = sum exp(z_t - m_t) and cross = sum exp(z_t - m_t) (z_t - z_s); for
  the student its running max and sum; both argmaxes; the label's logit. Then
      KL = cross / s_t - lse_t + lse_s,   lse = m + log s,   NLL = lse_s - z_s[label]
  (KL = sum_v p_t (z_t - z_s) - lse_t + lse_s). The maxima enter under stop_gradient,
  which changes no value or gradient (each term is invariant to them). The kernel travels
  as the scan's per-chunk input, so under FSDP each step gathers one [D, W] slice and its
  gradient comes back in the kernel's own layout. The teacher gets no gradient.
  """
  vocab = kernel_DxV.shape[1]
  chunk = min(vocab_chunk, vocab)
  num = -(-vocab // chunk)
  kernel_DxV = kernel_DxV.astype(student_BxLxD.dtype)
  if num * chunk > vocab:
    kernel_DxV = jnp.pad(kernel_DxV, ((0, 0), (0, num * chunk - vocab)))
  kernel_NxDxW = jnp.moveaxis(kernel_DxV.reshape(kernel_DxV.shape[0], num, chunk), 1, 0)
  teacher_BxLxD = jax.lax.stop_gradient(teacher_BxLxD)
  shape = student_BxLxD.shape[:2]
  low = jnp.full(shape, _MASKED, jnp.float32)
  zero = jnp.zeros(shape, jnp.float32)
  first = jnp.zeros(shape, jnp.int32)
  init = (low, zero, zero, low, zero, low, first, low, first, zero)

  def best(z_BxLxW, j, best_BxL, arg_BxL):
    """Running (max, argmax) with the first maximum winning, as jnp.argmax."""
    z_BxLxW = jax.lax.stop_gradient(z_BxLxW)
    here_BxL = jnp.max(z_BxLxW, axis=-1)
    better_BxL = here_BxL > best_BxL
    return (jnp.where(better_BxL, here_BxL, best_BxL),
            jnp.where(better_BxL, j * chunk + jnp.argmax(z_BxLxW, axis=-1), arg_BxL))

  @jax.checkpoint
  def step(carry, xs):
    t_max, t_sum, cross, s_max, s_sum, t_best, t_arg, s_best, s_arg, label_logit = carry
    w_DxW, j = xs
    real_W = j * chunk + jnp.arange(chunk) < vocab
    dot = lambda h, w: jnp.einsum("bld,dw->blw", h, w, preferred_element_type=jnp.float32)
    z_s = jnp.where(real_W, dot(student_BxLxD, w_DxW), _MASKED)
    z_t = jnp.where(real_W, dot(teacher_BxLxD, jax.lax.stop_gradient(w_DxW)), _MASKED)
    new_t_max = jax.lax.stop_gradient(jnp.maximum(t_max, jnp.max(z_t, axis=-1)))
    e_t = jnp.exp(z_t - new_t_max[..., None])
    rescale_t = jnp.exp(t_max - new_t_max)
    t_sum = t_sum * rescale_t + jnp.sum(e_t, axis=-1)
    cross = cross * rescale_t + jnp.sum(e_t * (z_t - z_s), axis=-1)
    new_s_max = jax.lax.stop_gradient(jnp.maximum(s_max, jnp.max(z_s, axis=-1)))
    s_sum = (s_sum * jnp.exp(s_max - new_s_max)
             + jnp.sum(jnp.exp(z_s - new_s_max[..., None]), axis=-1))
    t_best, t_arg = best(z_t, j, t_best, t_arg)
    s_best, s_arg = best(z_s, j, s_best, s_arg)
    if labels_BxL is not None:
      # A masked sum, not a gather: the TPU compiler offloads a gather's transpose (a
      # scatter-add) to the SparseCore, where its cost model has no estimate.
      column_W = j * chunk + jnp.arange(chunk)
      label_logit = label_logit + jnp.sum(
          jnp.where(column_W == labels_BxL[..., None], z_s, 0.0), axis=-1)
    return (new_t_max, t_sum, cross, new_s_max, s_sum, t_best, t_arg, s_best, s_arg,
            label_logit), None

  carry, _ = jax.lax.scan(step, init, (kernel_NxDxW, jnp.arange(num)))
  t_max, t_sum, cross, s_max, s_sum, _, t_arg, _, s_arg, label_logit = carry
  lse_t_BxL = t_max + jnp.log(t_sum)
  lse_s_BxL = s_max + jnp.log(s_sum)
  kl_BxL = cross / t_sum - lse_t_BxL + lse_s_BxL
  nll_BxL = None if labels_BxL is None else lse_s_BxL - label_logit
  return kl_BxL, t_arg == s_arg, nll_BxL
