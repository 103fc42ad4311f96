"""Plausibility filter for router replay (report §4), used by moe_routing.route.

Router replay makes the learner's MoE layers use the experts the sampler chose, so the
learner evaluates the same computation the sampler ran. When the two routers disagree
badly (the sampler's weights were older, or numerics differ), a replayed expert can sit
far down the learner's ranking; forcing it adds off-policy noise. The filter keeps a
replayed expert only if its live selection score clears a threshold derived from the
router's own top-k, and otherwise substitutes the router's best choice not already used.

Threshold per token, from s_k = the lowest selection score among the router's own top-k:
  tau = factor * s_k            when s_k >= 0 (sigmoid / softmax scores)
  tau = s_k - (1 - factor)|s_k| in general (the same relative slack below s_k, so biased
                                sigmoid scores, which can be negative, work too)
factor = 1 keeps only replayed experts scoring at least as well as the router's k-th;
smaller factors tolerate more disagreement. Every candidate comes from the router's own
top-k, which all clear tau, so a substitute is always plausible.

Legend: T tokens, E experts, K experts per token.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class FilteredRoutes(NamedTuple):
  indices_TxK: jax.Array  # int32 experts to use: replayed where plausible
  replaced_fraction: jax.Array  # share of (valid) token-slots the filter replaced
  mismatch_fraction: jax.Array  # share of replayed slots outside the router's own top-k


def filter_replay(selection_scores_TxE, replay_TxK, factor: float, router_TxK=None,
                  valid_T=None) -> FilteredRoutes:
  """Replaces implausible replayed experts; see the module docstring.

  selection_scores_TxE: the scores the router selects by (for the sigmoid_bias router:
    scores plus correction bias). replay_TxK: the sampler's experts. router_TxK: the
    router's own choice; plain top-k of the scores when None (pass it for group-limited
    routing). valid_T: tokens that count in the fractions (default all).
  """
  scores_TxE = jax.lax.stop_gradient(selection_scores_TxE.astype(jnp.float32))
  num_experts = scores_TxE.shape[-1]
  top_k = replay_TxK.shape[-1]
  replay_TxK = replay_TxK.astype(jnp.int32)
  if router_TxK is None:
    _, router_TxK = jax.lax.top_k(scores_TxE, top_k)
  router_TxK = router_TxK.astype(jnp.int32)

  router_scores_TxK = jnp.take_along_axis(scores_TxE, router_TxK, axis=-1)
  kth_T = router_scores_TxK.min(-1)
  threshold_T = kth_T - (1.0 - factor) * jnp.abs(kth_T)
  replay_scores_TxK = jnp.take_along_axis(scores_TxE, replay_TxK, axis=-1)
  implausible_TxK = replay_scores_TxK < threshold_T[:, None]

  # Experts in use: the kept replays, then each substitute as it is chosen (slot order).
  taken_TxE = (jax.nn.one_hot(replay_TxK, num_experts, dtype=jnp.bool_)
               & ~implausible_TxK[..., None]).any(axis=-2)
  slots = []
  for slot in range(top_k):
    free_TxK = ~jnp.take_along_axis(taken_TxE, router_TxK, axis=-1)
    candidate_scores_TxK = jnp.where(free_TxK, router_scores_TxK, -jnp.inf)
    best_T = jnp.argmax(candidate_scores_TxK, axis=-1)
    candidate_T = jnp.take_along_axis(router_TxK, best_T[:, None], axis=-1)[:, 0]
    replace_T = implausible_TxK[:, slot]
    chosen_T = jnp.where(replace_T, candidate_T, replay_TxK[:, slot])
    taken_TxE = taken_TxE | (jax.nn.one_hot(chosen_T, num_experts, dtype=jnp.bool_)
                             & replace_T[:, None])
    slots.append(chosen_T)
  indices_TxK = jnp.stack(slots, axis=-1)

  if valid_T is None:
    valid_T = jnp.ones(scores_TxE.shape[:1], jnp.bool_)
  valid_TxK = jnp.broadcast_to(valid_T.astype(jnp.float32)[:, None], replay_TxK.shape)
  denom = jnp.maximum(valid_TxK.sum(), 1.0)
  outside_TxK = ~(replay_TxK[:, :, None] == router_TxK[:, None, :]).any(-1)
  return FilteredRoutes(
      indices_TxK=indices_TxK,
      replaced_fraction=(implausible_TxK * valid_TxK).sum() / denom,
      mismatch_fraction=(outside_TxK * valid_TxK).sum() / denom)
