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
  return jnp.take(params["embed"]["embedding"].astype(compute_dtype(cfg)), tokens, axis=0)


def _head(cfg, params, out_BxLxD):
  kernel_DxV = params["lm_head"]["kernel"].astype(compute_dtype(cfg))
  return jnp.einsum("bld,dv->blv", out_BxLxD, kernel_DxV, preferred_element_type=jnp.float32)


def _shift_left(tokens_BxL, by: int):
  return jnp.pad(tokens_BxL[:, by:], ((0, 0), (0, by)))


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
  next_DmxBxL = jnp.stack([_shift_left(tokens_BxL, k + 1)
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
               & (segments_BxL == _shift_left(segments_BxL, shift))
               & (jnp.arange(length) < length - shift)[None])
  return valid_BxL * _shift_left(mask_BxL.astype(jnp.float32), shift)


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


def loss(cfg, params, tokens_BxL, hidden_BxLxD, main_logits_BxLxV, *, targets_BxL=None,
         positions_BxL=None, segment_ids_BxL=None, loss_mask_BxL=None,
         kl_weight: float = 1.0, ce_weight: float = 0.0, frozen_trunk: bool = False,
         counts_Dm=None):
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
  """
  _check(cfg)
  if ce_weight and targets_BxL is None:
    raise ValueError("mtp.loss: ce_weight > 0 needs targets_BxL (the next-token labels).")
  if frozen_trunk:
    hidden_BxLxD = jax.lax.stop_gradient(hidden_BxLxD)
    params = {**params, "embed": jax.lax.stop_gradient(params["embed"]),
              "lm_head": jax.lax.stop_gradient(params["lm_head"])}
  batch, length = tokens_BxL.shape
  segments_BxL = (jnp.ones((batch, length), jnp.int32) if segment_ids_BxL is None
                  else segment_ids_BxL)
  mask_BxL = (jnp.ones((batch, length), jnp.float32) if loss_mask_BxL is None
              else loss_mask_BxL.astype(jnp.float32))
  logits_DmxBxLxV, moe_aux = apply(cfg, params, hidden_BxLxD, tokens_BxL, positions_BxL,
                                   segment_ids_BxL)
  teacher_logp_BxLxV = jax.nn.log_softmax(jax.lax.stop_gradient(main_logits_BxLxV), axis=-1)
  total, metrics = 0.0, {}
  for k in range(cfg.num_mtp_layers):
    shift = k + 1
    weight_BxL = depth_weights(segments_BxL, mask_BxL, shift)
    count = jnp.maximum(weight_BxL.sum() if counts_Dm is None else counts_Dm[k], 1.0)
    teacher_BxLxV = jnp.pad(teacher_logp_BxLxV[:, shift:], ((0, 0), (0, shift), (0, 0)))
    student_BxLxV = jax.nn.log_softmax(logits_DmxBxLxV[k], axis=-1)
    kl_BxL = jnp.sum(jnp.exp(teacher_BxLxV) * (teacher_BxLxV - student_BxLxV), axis=-1)
    kl = jnp.sum(kl_BxL * weight_BxL) / count
    depth_loss = kl_weight * kl
    agree_BxL = jnp.argmax(student_BxLxV, -1) == jnp.argmax(teacher_BxLxV, -1)
    metrics[f"mtp{k}/kl"] = kl
    metrics[f"mtp{k}/agree"] = jnp.sum(agree_BxL * weight_BxL) / count
    if ce_weight:
      labels_BxL = _shift_left(targets_BxL, shift)
      nll_BxL = -jnp.take_along_axis(student_BxLxV, labels_BxL[..., None], axis=-1)[..., 0]
      ce = jnp.sum(nll_BxL * weight_BxL) / count
      depth_loss += ce_weight * ce
      metrics[f"mtp{k}/ce"] = ce
    total += depth_loss
  return total / cfg.num_mtp_layers, metrics, moe_aux
