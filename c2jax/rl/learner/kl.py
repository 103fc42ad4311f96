"""Per-token estimators of KL(q || p) from samples x ~ q, by name (Schulman's k1/k2/k3).

With log r = log p(x) - log q(x) (p the reference policy, q the policy that sampled):
  k1 = -log r                 unbiased, high variance, can be negative per token
  k2 = (log r)^2 / 2          biased (exact only to second order), always >= 0
  k3 = (r - 1) - log r        unbiased and >= 0, but r = exp(log r) makes its variance
                              explode once q and p drift apart
experiments/findings/kl_estimators.py measures the variances (the report's Figure 4).

Placement (config.rl.kl.placement):
  reward  the estimate is a detached per-token penalty folded into the advantage
          (`kl_penalty_to_go`). Default, with k1: the gradient of KL(q || p) for
          sequences is E_q[sum_t grad log q(x_t) * sum_{s >= t} k1_s], i.e. REINFORCE
          with -k1 as a reward, so this placement is the unbiased KL gradient.
  loss    the estimate, computed from the learner's differentiable log-probs, is added to
          the loss. Beware k1 there: E_q[grad(log q - log p)] = E_q[grad log q] = 0, so on
          on-policy samples it has zero expected gradient and only adds noise; k3 (GRPO's
          choice) or k2 give a non-zero gradient.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


def k1(log_ratio: jax.Array) -> jax.Array:
  return -log_ratio


def k2(log_ratio: jax.Array) -> jax.Array:
  return 0.5 * jnp.square(log_ratio)


def k3(log_ratio: jax.Array) -> jax.Array:
  # expm1 keeps r - 1 accurate when r is close to 1 (the usual case).
  return jnp.expm1(log_ratio) - log_ratio


KL_ESTIMATORS: dict[str, Callable[[jax.Array], jax.Array]] = {"k1": k1, "k2": k2, "k3": k3}
KL_PLACEMENTS = ("reward", "loss")


def kl_estimate(name: str, logq, logp) -> jax.Array:
  """Per-sample estimate of KL(q || p) from log q(x) and log p(x) at samples x ~ q."""
  if name not in KL_ESTIMATORS:
    raise ValueError(f"Unknown KL estimator {name!r}; choose one of "
                     f"{sorted(KL_ESTIMATORS)} (config.rl.kl.estimator).")
  return KL_ESTIMATORS[name](logp - logq)


def kl_penalty_to_go(kl_BxL: jax.Array, mask_BxL: jax.Array) -> jax.Array:
  """sum_{s >= t} mask_s * kl_s per row: the KL still to come from token t on.

  Tokens before t cannot depend on x_t, so dropping them keeps the KL gradient unbiased
  and lowers its variance. Masked (non-model) tokens contribute nothing.
  """
  masked_BxL = kl_BxL * mask_BxL
  return jnp.flip(jnp.cumsum(jnp.flip(masked_BxL, -1), axis=-1), -1)
