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

With MTP modules in the policy (model_cfg.num_mtp_layers > 0) and
rl_cfg.mtp_loss_weight > 0, the step also trains them by self-distillation on the same
forward's hidden states, detached from the trunk (c2jax.rl.learner.mtp_distill): the policy's
gradients are unchanged, and `grad_norm` reports the policy's alone (`mtp_grad_norm` the
heads'). Without that, the heads get no gradient and Adam leaves them as they are.

Log-probs are computed chunk-wise over sequence and vocabulary (model.token_logprobs,
chunks from config.rl.logprobs), the MTP loss chunk-wise over the sequence
(config.rl.mtp_seq_chunk): no [B, L, V] float32 array exists in the step.

Temperature: actors sample from softmax(logits / T) (T = config.agent.temperature) and
record log mu under exactly that distribution, so the learner scores its tokens under
softmax(logits / T) too (`temperature=`); the ratio pi_T / mu_T is then 1 on-policy
whatever T is. The reference policy of the KL is scored at the same T (it compares the
same sampling distributions). Top-k / top-p truncation renormalises over a set chosen
from the sampler's own logits, a discontinuous function the learner's logits cannot
reproduce (a token in the sampler's set may fall outside the learner's), so RL
validation refuses it (c2jax.rl.job.validate) rather than bias the ratio silently.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from c2jax import model
from c2jax.model import mtp as mtp_lib
from c2jax.model.token_logprobs import token_logprobs as chunked_token_logprobs
from c2jax.rl.learner import losses
from c2jax.rl.learner import mtp_distill
from c2jax.train import accumulate
from c2jax.train.step import TrainState

BATCH_FIELDS = ("tokens", "valid", "loss_mask", "sampler_logprobs", "router_indices",
                "advantages")


def token_logprobs(model_cfg, params, batch, temperature=1.0, *, seq_chunk: int = 512,
                   vocab_chunk: int = 8192) -> tuple[jax.Array, dict]:
  """(log pi_T(token t | tokens < t) as [B, L] float32 with 0 at t = 0, model aux).

  pi_T = softmax(logits / temperature); computed in chunks (see the module docstring).
  """
  logprobs_BxL, aux, _ = _score(model_cfg, params, batch, temperature, seq_chunk, vocab_chunk)
  return logprobs_BxL, aux


def _score(model_cfg, params, batch, temperature, seq_chunk: int, vocab_chunk: int):
  """token_logprobs plus the final-normed hidden state [B, L, D] it was read from."""
  tokens_BxL = batch["tokens"]
  routing = None
  if model_cfg.num_layers > model_cfg.first_k_dense:
    routing = jnp.transpose(batch["router_indices"], (2, 0, 1, 3))  # [Lm, B, L, K]
  hidden_BxLxD, aux, _ = model.apply(model_cfg, params, tokens_BxL,
                                     segment_ids_BxL=batch["valid"].astype(jnp.int32),
                                     routing=routing, head=False)
  picked_BxL = chunked_token_logprobs(hidden_BxLxD[:, :-1], params["lm_head"]["kernel"],
                                      tokens_BxL[:, 1:], temperature, seq_chunk=seq_chunk,
                                      vocab_chunk=vocab_chunk)
  return jnp.pad(picked_BxL, ((0, 0), (1, 0))), aux, hidden_BxLxD


GAP_KEY = "logprob_gap_BxL"


def mismatch_stats(gap_BxL, mask_BxL) -> dict:
  """The train-inference mismatch on the trained tokens: mean and 99th percentile of
  |learner log-prob - sampler log-prob| (0 when the batch trains no token).

  The learner's log-prob is the one the loss used: the current weights, with the
  sampler's routes replayed, at the sampling temperature. So the figure holds the
  engine's numerical mismatch (kernels, dtypes, quantised weights) plus the policy lag of
  tokens sampled up to config.rl.queue.max_lag versions ago; on-policy and exact it is 0.
  """
  trained_BxL = mask_BxL > 0
  count = trained_BxL.sum()
  mean = jnp.where(trained_BxL, gap_BxL, 0.0).sum() / jnp.maximum(count, 1)
  p99 = jnp.nanquantile(jnp.where(trained_BxL, gap_BxL, jnp.nan), 0.99)
  return {"mismatch_mean": mean, "mismatch_p99": jnp.where(count > 0, p99, 0.0)}


def trains_mtp(rl_cfg, model_cfg) -> bool:
  """Whether rl_step trains the policy's MTP heads (c2jax.rl.learner.mtp_distill)."""
  return bool(model_cfg.num_mtp_layers) and rl_cfg.mtp_loss_weight > 0


def batch_totals(model_cfg, batch) -> dict:
  """The counts the step's terms average over, taken over the whole batch before it is cut
  into microbatches: the loss's (losses.batch_totals), rows and tokens with a valid token
  (the MoE balance loss, a mean over rows; the replay statistics, shares of tokens) and,
  with MTP heads, positions per depth."""
  mask_BxL = batch["loss_mask"] * batch["valid"]
  valid_BxL = batch["valid"].astype(jnp.float32)
  totals = {**losses.batch_totals(mask_BxL),
            "valid_rows": (valid_BxL.sum(-1) > 0).sum().astype(jnp.float32),
            "valid_tokens": valid_BxL.sum()}
  if model_cfg.num_mtp_layers:
    totals["mtp_positions"] = mtp_distill.depth_counts(model_cfg, batch)
  return totals


def rl_step(rl_cfg, model_cfg, optimizer: optax.GradientTransformation, state: TrainState,
            ref_params, batch, *, rollouts_per_step: int,
            temperature: float = 1.0, microbatches: int = 1) -> tuple[TrainState, dict]:
  """One Adam step on the RL loss; pure (jit it with the configs and optimizer bound).

  ref_params: the reference policy's parameters for the KL term (None when
  rl_cfg.kl.coef == 0). rollouts_per_step: groups x group size (the `constant`
  aggregation's divisor, whatever the number of segment rows). temperature: the actors' sampling temperature
  (config.agent.temperature), under which the learner scores tokens. microbatches: the
  gradient is accumulated over that many slices of the batch's rows
  (c2jax.train.accumulate); each term divides by the whole batch's counts, so the update
  and the metrics are those of the whole batch.
  """
  missing = [f for f in BATCH_FIELDS if f not in batch]
  if missing:
    raise ValueError(f"rl_step: batch lacks {missing}; build it with packing.pack_batch "
                     "over segments carrying those fields.")
  totals = batch_totals(model_cfg, batch)
  train_mtp = trains_mtp(rl_cfg, model_cfg)

  def value_and_grad(micro):
    mask_BxL = micro["loss_mask"] * micro["valid"]
    score = lambda p: _score(model_cfg, p, micro, temperature, rl_cfg.logprobs.seq_chunk,
                             rl_cfg.logprobs.vocab_chunk)
    ref_logprobs_BxL = None
    if rl_cfg.kl.coef > 0:
      ref_logprobs_BxL, _, _ = score(jax.lax.stop_gradient(ref_params))
      ref_logprobs_BxL = jax.lax.stop_gradient(ref_logprobs_BxL)
    valid_BxL = micro["valid"].astype(jnp.float32)
    # The balance loss is a mean over rows: this microbatch's share of the batch's rows.
    row_share = (valid_BxL.sum(-1) > 0).sum() / jnp.maximum(totals["valid_rows"], 1.0)

    def loss_fn(params):
      logprobs_BxL, aux, hidden_BxLxD = score(params)
      loss, metrics = losses.rl_loss(rl_cfg, logprobs_BxL, micro["sampler_logprobs"],
                                     ref_logprobs_BxL, micro["advantages"], mask_BxL,
                                     num_rollouts=rollouts_per_step, totals=totals)
      loss = loss + aux["aux_loss"] * row_share
      # |log pi - log mu| per token, for the mismatch statistics over the whole batch.
      metrics = {**metrics, GAP_KEY: jax.lax.stop_gradient(
          jnp.abs(logprobs_BxL - micro["sampler_logprobs"]) * mask_BxL)}
      if train_mtp:  # detached from the trunk: no gradient reaches the policy's parameters
        mtp_loss, mtp_metrics, mtp_aux_loss = mtp_distill.loss(
            model_cfg, params, hidden_BxLxD, micro, seq_chunk=rl_cfg.mtp_seq_chunk,
            counts_Dm=totals["mtp_positions"])
        loss = loss + rl_cfg.mtp_loss_weight * mtp_loss + mtp_aux_loss * row_share
        metrics = {**metrics, **mtp_metrics, "mtp_loss": mtp_loss}
      return loss, (metrics, aux)

    (loss, (metrics, aux)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    metrics = dict(metrics)
    if aux["replay_replaced"].size:  # shares of valid tokens: weighted by this slice's
      token_share = valid_BxL.sum() / jnp.maximum(totals["valid_tokens"], 1.0)
      metrics["replay_replaced"] = aux["replay_replaced"].mean() * token_share
      metrics["replay_mismatch"] = aux["replay_mismatch"].mean() * token_share
    return (loss, metrics), grads

  (_, metrics), grads = accumulate.value_and_grad(value_and_grad, state.params, batch,
                                                  microbatches, maxed=("ratio_max",),
                                                  stacked=(GAP_KEY,))
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = dict(metrics)
  metrics.update(mismatch_stats(metrics.pop(GAP_KEY), batch["loss_mask"] * batch["valid"]))
  square_sum = lambda tree: sum(jnp.sum(jnp.square(g.astype(jnp.float32)))
                                for g in jax.tree.leaves(tree))
  policy_grads = {k: v for k, v in grads.items() if k != mtp_lib.PARAMS_KEY}
  metrics["grad_norm"] = jnp.sqrt(square_sum(policy_grads))
  if train_mtp:
    metrics["mtp_grad_norm"] = jnp.sqrt(square_sum(grads[mtp_lib.PARAMS_KEY]))
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics
