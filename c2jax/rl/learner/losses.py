"""The RL loss: importance-corrected policy gradient, KL to a reference, loss aggregation.

Shapes: B sequences (one trajectory segment per row), L tokens. Log-probs are of the
token actually at each position (`log pi(x_t | x_<t)`); loss_mask is 1 on tokens the
model generated and 0 on prompt, tool output and padding.

The learner's samples come from the sampler (the rollout engine, running weights up to
`max_lag` versions old), so each token carries the ratio rho_t = pi(x_t) / mu(x_t)
between the learner's policy pi and the sampler's mu. Policy losses (config.rl.loss.
policy_loss):
  tis  truncated importance sampling: -sg(min(rho, tis_cap)) * A * log pi. One step per
       batch (single epoch), so no trust region is needed; truncation bounds variance.
  ppo  clipped surrogate: -min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A).
Mismatch mask (config.rl.mismatch_mask, IcePop / masked importance sampling; off by
default): tokens whose ratio rho_t falls outside [low, high] get no policy gradient
(mode 'token'), or whole rows whose geometric-mean ratio exp(mean_t log rho_t) does
(mode 'sequence'). The divisors stay as they are (a masked token counts as a zero loss),
and the KL term is not masked. rho compares the learner's current weights with the
sampler's, so it holds both the engine's numerical mismatch and the policy lag (up to
config.rl.queue.max_lag versions); `truncated` importance weights (tis_cap) bound its
upper tail, the mask drops both tails.
Aggregations (config.rl.loss.aggregation), from token losses l_BxL and mask m_BxL:
  constant       sum(l m) / (R * normalizer_tokens), R = rollouts per step (groups x
                 group size, a config constant): Dr. GRPO, every token weighs the same
                 whatever its sequence's length or how many self-summary segments (rows)
                 its rollout was cut into (default; no length bias)
  token_mean     sum(l m) / sum(m): weights depend on the batch's total length
  sequence_mean  mean over sequences of sum_t(l m) / sum_t(m): GRPO's original, which
                 favours long wrong answers over short ones

Under gradient accumulation a batch arrives in microbatches: `totals` (batch_totals of
the whole batch) then gives the counts to divide by, so the microbatches' losses and
metrics add up to the whole batch's (`constant` needs none: its divisor is a constant).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from c2jax.rl.learner import kl as kl_lib


def batch_totals(mask_BxL) -> dict:
  """Trained tokens and rows with a trained token of a whole batch (see the docstring)."""
  mask_BxL = mask_BxL.astype(jnp.float32)
  return {"tokens": mask_BxL.sum(), "rows": (mask_BxL.sum(-1) > 0).sum().astype(jnp.float32)}


def constant(loss_BxL, mask_BxL, normalizer_tokens: float, num_rollouts: int,
             totals: dict | None = None) -> jax.Array:
  del totals  # linear in the rows already
  # Not the row count: rows grow with segments (self-summaries) and padding.
  return (loss_BxL * mask_BxL).sum() / (num_rollouts * normalizer_tokens)


def token_mean(loss_BxL, mask_BxL, normalizer_tokens: float, num_rollouts: int,
               totals: dict | None = None) -> jax.Array:
  del normalizer_tokens, num_rollouts  # normalised by the batch's own token count
  totals = batch_totals(mask_BxL) if totals is None else totals
  return (loss_BxL * mask_BxL).sum() / jnp.maximum(totals["tokens"], 1.0)


def sequence_mean(loss_BxL, mask_BxL, normalizer_tokens: float,
                  num_rollouts: int, totals: dict | None = None) -> jax.Array:
  del normalizer_tokens, num_rollouts  # normalised by each row's own length
  totals = batch_totals(mask_BxL) if totals is None else totals
  tokens_B = mask_BxL.sum(-1)
  per_sequence_B = (loss_BxL * mask_BxL).sum(-1) / jnp.maximum(tokens_B, 1.0)
  has_tokens_B = (tokens_B > 0).astype(per_sequence_B.dtype)
  return (per_sequence_B * has_tokens_B).sum() / jnp.maximum(totals["rows"], 1.0)


AGGREGATIONS: dict[str, Callable[..., jax.Array]] = {
    "constant": constant, "token_mean": token_mean, "sequence_mean": sequence_mean}


def _log_ratio(logprobs_BxL, sampler_logprobs_BxL, mask_BxL):
  # Zero off the mask: padding's log-probs are arbitrary and exp() of them could overflow
  # to inf, and inf * 0 is NaN.
  return jnp.where(mask_BxL > 0, logprobs_BxL - sampler_logprobs_BxL, 0.0)


def tis(logprobs_BxL, sampler_logprobs_BxL, advantages_BxL, mask_BxL, loss_cfg):
  ratio_BxL = jnp.exp(_log_ratio(logprobs_BxL, sampler_logprobs_BxL, mask_BxL))
  weight_BxL = jax.lax.stop_gradient(jnp.minimum(ratio_BxL, loss_cfg.tis_cap))
  loss_BxL = -weight_BxL * advantages_BxL * logprobs_BxL
  return loss_BxL, {"ratio": ratio_BxL, "limited": ratio_BxL > loss_cfg.tis_cap}


def ppo(logprobs_BxL, sampler_logprobs_BxL, advantages_BxL, mask_BxL, loss_cfg):
  ratio_BxL = jnp.exp(_log_ratio(logprobs_BxL, sampler_logprobs_BxL, mask_BxL))
  clipped_BxL = jnp.clip(ratio_BxL, 1.0 - loss_cfg.clip_low, 1.0 + loss_cfg.clip_high)
  unclipped_obj_BxL = ratio_BxL * advantages_BxL
  clipped_obj_BxL = clipped_BxL * advantages_BxL
  loss_BxL = -jnp.minimum(unclipped_obj_BxL, clipped_obj_BxL)
  return loss_BxL, {"ratio": ratio_BxL, "limited": clipped_obj_BxL < unclipped_obj_BxL}


POLICY_LOSSES: dict[str, Callable[..., tuple]] = {"tis": tis, "ppo": ppo}
MISMATCH_MASKS = ("off", "token", "sequence")


def mismatch_band(mask_cfg, logprobs_BxL, sampler_logprobs_BxL, mask_BxL):
  """1.0 on the tokens the mismatch mask keeps, 0.0 on those it drops ([B, L] float32)."""
  log_ratio_BxL = jax.lax.stop_gradient(_log_ratio(logprobs_BxL, sampler_logprobs_BxL,
                                                   mask_BxL))
  if mask_cfg.mode == "token":
    ratio_BxL = jnp.exp(log_ratio_BxL)
  elif mask_cfg.mode == "sequence":
    mean_log_B = log_ratio_BxL.sum(-1) / jnp.maximum(mask_BxL.sum(-1), 1.0)
    ratio_BxL = jnp.broadcast_to(jnp.exp(mean_log_B)[:, None], mask_BxL.shape)
  else:
    raise ValueError(f"mismatch_band: mode {mask_cfg.mode!r}; one of {MISMATCH_MASKS[1:]}.")
  return ((ratio_BxL >= mask_cfg.low) & (ratio_BxL <= mask_cfg.high)).astype(jnp.float32)


def rl_loss(cfg, logprobs_BxL, sampler_logprobs_BxL, ref_logprobs_BxL, advantages_B,
            loss_mask_BxL, *, num_rollouts: int, totals: dict | None = None):
  """(loss, metrics) for one batch; differentiable in `logprobs_BxL` only.

  num_rollouts: rollouts in the step (groups x group size), the `constant`
  aggregation's divisor; a Python int, independent of the batch's row count.

  cfg: the RL config (c2jax.rl.config.default_config()); reads cfg.loss and cfg.kl.
  ref_logprobs_BxL may be None when cfg.kl.coef == 0 (no reference policy is run).
  totals: batch_totals of the whole batch when this is one microbatch of it; the masked
  means among the metrics then add up over microbatches too (`ratio_max` takes their max).
  """
  mask_BxL = loss_mask_BxL.astype(jnp.float32)
  totals = batch_totals(mask_BxL) if totals is None else totals

  def masked_mean(x_BxL, mask_BxL):
    return (x_BxL * mask_BxL).sum() / jnp.maximum(totals["tokens"], 1.0)

  logprobs_BxL = logprobs_BxL.astype(jnp.float32)
  sampler_logprobs_BxL = jax.lax.stop_gradient(sampler_logprobs_BxL.astype(jnp.float32))
  advantages_BxL = jnp.broadcast_to(
      advantages_B.astype(jnp.float32)[:, None], mask_BxL.shape)
  aggregate = AGGREGATIONS[cfg.loss.aggregation]
  normalizer = cfg.loss.normalizer_tokens
  use_kl = cfg.kl.coef > 0
  if use_kl and ref_logprobs_BxL is None:
    raise ValueError("rl_loss: config.rl.kl.coef > 0 needs ref_logprobs_BxL (the "
                     "reference policy's log-probs); pass them or set the coef to 0.")
  if isinstance(num_rollouts, bool) or not isinstance(num_rollouts, int) or num_rollouts < 1:
    raise ValueError(f"rl_loss: num_rollouts = {num_rollouts!r}; pass the step's rollout "
                     "count (groups x group size) as a positive int.")
  aggregate = functools.partial(aggregate, normalizer_tokens=normalizer,
                                num_rollouts=num_rollouts, totals=totals)
  metrics = {}

  if use_kl and cfg.kl.placement == "reward":
    ref_BxL = ref_logprobs_BxL.astype(jnp.float32)
    kl_BxL = kl_lib.kl_estimate(cfg.kl.estimator, sampler_logprobs_BxL, ref_BxL)
    advantages_BxL = advantages_BxL - cfg.kl.coef * kl_lib.kl_penalty_to_go(kl_BxL, mask_BxL)
    metrics["kl"] = masked_mean(kl_BxL, mask_BxL)
  advantages_BxL = jax.lax.stop_gradient(advantages_BxL)

  pg_BxL, stats = POLICY_LOSSES[cfg.loss.policy_loss](
      logprobs_BxL, sampler_logprobs_BxL, advantages_BxL, mask_BxL, cfg.loss)
  if cfg.mismatch_mask.mode != "off":
    band_BxL = mismatch_band(cfg.mismatch_mask, logprobs_BxL, sampler_logprobs_BxL, mask_BxL)
    pg_BxL = pg_BxL * band_BxL
    metrics["mismatch_masked"] = masked_mean(1.0 - band_BxL, mask_BxL)
  pg_loss = aggregate(pg_BxL, mask_BxL)
  loss = pg_loss

  if use_kl and cfg.kl.placement == "loss":
    ref_BxL = jax.lax.stop_gradient(ref_logprobs_BxL.astype(jnp.float32))
    kl_BxL = kl_lib.kl_estimate(cfg.kl.estimator, logprobs_BxL, ref_BxL)
    loss = loss + cfg.kl.coef * aggregate(kl_BxL, mask_BxL)
    metrics["kl"] = masked_mean(kl_BxL, mask_BxL)

  ratio_BxL = jax.lax.stop_gradient(stats["ratio"])
  metrics.update({
      "loss": loss,
      "pg_loss": pg_loss,
      "tokens": mask_BxL.sum(),
      "ratio_mean": masked_mean(ratio_BxL, mask_BxL),
      "ratio_max": jnp.max(jnp.where(mask_BxL > 0, ratio_BxL, 0.0)),
      "limited_fraction": masked_mean(stats["limited"].astype(jnp.float32), mask_BxL),
      "sampler_nll": -masked_mean(sampler_logprobs_BxL, mask_BxL),
  })
  return loss, metrics
