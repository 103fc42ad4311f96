"""The learner's pure step: router-replayed forward, RL loss, Adam update.

    state, metrics = rl_step(rl_cfg, model_cfg, optimizer, state, ref_params, batch)

A batch comes from `packing.pack_batch` over the step's trajectory segments, one segment
per row (B rows, L tokens, Lm MoE layers, K experts per token):
  tokens [B, L] int32, valid [B, L] int32 (0 on padding), loss_mask [B, L] int32,
  sampler_logprobs [B, L] float32 (log mu of token t, at t), router_indices [B, L, Lm, K]
  int32 (the experts the engine used when it fed token t), advantages [B] float32.
The learner's log-prob of token t is read from the logits at t - 1; t = 0 is never
trained (it is <|bos|>). The forward replays the sampler's expert choices (router
replay, with the plausibility filter when model_cfg.moe.replay_filter_factor > 0), so the
learner scores the computation the sampler ran; the reference policy (KL) runs with the
same routes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from c2jax import model
from c2jax.rl import losses
from c2jax.train.step import TrainState

BATCH_FIELDS = ("tokens", "valid", "loss_mask", "sampler_logprobs", "router_indices",
                "advantages")


def token_logprobs(model_cfg, params, batch) -> tuple[jax.Array, dict]:
  """(log pi(token t | tokens < t) as [B, L] with 0 at t = 0, model aux)."""
  tokens_BxL = batch["tokens"]
  routing = None
  if model_cfg.num_layers > model_cfg.first_k_dense:
    routing = jnp.transpose(batch["router_indices"], (2, 0, 1, 3))  # [Lm, B, L, K]
  logits_BxLxV, aux, _ = model.apply(model_cfg, params, tokens_BxL,
                                     segment_ids_BxL=batch["valid"].astype(jnp.int32),
                                     routing=routing)
  logp_BxLxV = jax.nn.log_softmax(logits_BxLxV[:, :-1].astype(jnp.float32), axis=-1)
  picked_BxL = jnp.take_along_axis(logp_BxLxV, tokens_BxL[:, 1:, None], axis=-1)[..., 0]
  return jnp.pad(picked_BxL, ((0, 0), (1, 0))), aux


def rl_step(rl_cfg, model_cfg, optimizer: optax.GradientTransformation, state: TrainState,
            ref_params, batch) -> tuple[TrainState, dict]:
  """One Adam step on the RL loss; pure (jit it with the configs and optimizer bound).

  ref_params: the reference policy's parameters for the KL term (None when
  rl_cfg.kl.coef == 0).
  """
  missing = [f for f in BATCH_FIELDS if f not in batch]
  if missing:
    raise ValueError(f"rl_step: batch lacks {missing}; build it with packing.pack_batch "
                     "over segments carrying those fields.")
  mask_BxL = batch["loss_mask"] * batch["valid"]
  ref_logprobs_BxL = None
  if rl_cfg.kl.coef > 0:
    ref_logprobs_BxL, _ = token_logprobs(model_cfg, jax.lax.stop_gradient(ref_params), batch)
    ref_logprobs_BxL = jax.lax.stop_gradient(ref_logprobs_BxL)

  def loss_fn(params):
    logprobs_BxL, aux = token_logprobs(model_cfg, params, batch)
    loss, metrics = losses.rl_loss(rl_cfg, logprobs_BxL, batch["sampler_logprobs"],
                                   ref_logprobs_BxL, batch["advantages"], mask_BxL)
    loss = loss + aux["aux_loss"]
    return loss, (metrics, aux)

  (_, (metrics, aux)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = dict(metrics)
  metrics["grad_norm"] = jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32)))
                                      for g in jax.tree.leaves(grads)))
  if aux["replay_replaced"].size:
    metrics["replay_replaced"] = aux["replay_replaced"].mean()
    metrics["replay_mismatch"] = aux["replay_mismatch"].mean()
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics
