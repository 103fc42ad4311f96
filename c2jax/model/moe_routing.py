"""MoE routers: router logits -> (gate weights, expert indices), and routing statistics.

Numerics follow HF transformers: `DeepseekV3TopkRouter` ('sigmoid_bias') and
`Qwen3MoeTopKRouter` ('softmax'). Everything here runs in float32.

Einsum legend: B batch, L length, T tokens (B*L flattened), E experts, K experts per
token, G expert groups, S experts per group.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from c2jax.model import replay_filter

# Added to the top-k sum before renormalising, as HF does, so an all-zero row stays finite.
_RENORM_EPS = 1e-20


class Routing(NamedTuple):
  weights_TxK: jax.Array  # float32 gate weights of the chosen experts
  indices_TxK: jax.Array  # int32 chosen experts
  scores_TxE: jax.Array  # float32 unbiased affinities of every expert (sigmoid/softmax)
  # With replayed routing and the plausibility filter on: the share of replayed
  # (token, slot) pairs the filter replaced, and the share outside the router's own top-k.
  replay_replaced: jax.Array | None = None
  replay_mismatch: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class RouterKind:
  """One router kind.

  score: logits_TxE -> scores_TxE, the affinities gate weights are gathered from.
  select: (scores_TxE, correction_bias_E or None, moe_cfg) -> indices_TxK.
  uses_correction_bias: whether the layer owns a `correction_bias` [E] (selection only).
  """
  score: Callable[[jax.Array], jax.Array]
  select: Callable[..., jax.Array]
  uses_correction_bias: bool


def _sigmoid_scores(logits_TxE: jax.Array) -> jax.Array:
  return jax.nn.sigmoid(logits_TxE.astype(jnp.float32))


def _softmax_scores(logits_TxE: jax.Array) -> jax.Array:
  return jax.nn.softmax(logits_TxE.astype(jnp.float32), axis=-1)


def group_limited_top_k(scores_TxE, correction_bias_E, moe_cfg) -> jax.Array:
  """DeepSeek-V3 selection: biased scores, best `topk_group` groups, then top-k in them.

  A group's score is the sum of its two best biased scores. The bias only steers the
  choice (aux-loss-free balancing); it never reaches the gate weights or the gradient.
  """
  num_experts = scores_TxE.shape[-1]
  groups, keep_groups = moe_cfg.n_group, moe_cfg.topk_group
  biased_TxE = scores_TxE + jax.lax.stop_gradient(correction_bias_E.astype(jnp.float32))
  if keep_groups < groups:  # with every group kept the mask is a no-op
    per_group = num_experts // groups
    biased_TxGxS = biased_TxE.reshape(-1, groups, per_group)
    # HF takes the top 2; a group of one expert can only offer its single score.
    best_TxGx2, _ = jax.lax.top_k(biased_TxGxS, min(2, per_group))
    group_scores_TxG = best_TxGx2.sum(-1)
    _, kept_TxKg = jax.lax.top_k(group_scores_TxG, keep_groups)
    keep_TxG = jax.nn.one_hot(kept_TxKg, groups, dtype=jnp.bool_).any(axis=-2)
    keep_TxE = jnp.repeat(keep_TxG, per_group, axis=-1)
    biased_TxE = jnp.where(keep_TxE, biased_TxE, -jnp.inf)
  _, indices_TxK = jax.lax.top_k(biased_TxE, moe_cfg.num_experts_per_tok)
  return indices_TxK.astype(jnp.int32)


def plain_top_k(scores_TxE, correction_bias_E, moe_cfg) -> jax.Array:
  """Qwen3-MoE selection: the k best scores (no bias, no groups)."""
  del correction_bias_E  # this router has none
  _, indices_TxK = jax.lax.top_k(scores_TxE, moe_cfg.num_experts_per_tok)
  return indices_TxK.astype(jnp.int32)


ROUTERS: dict[str, RouterKind] = {
    "sigmoid_bias": RouterKind(score=_sigmoid_scores, select=group_limited_top_k,
                           uses_correction_bias=True),
    "softmax": RouterKind(score=_softmax_scores, select=plain_top_k, uses_correction_bias=False),
}


def gate_weights(scores_TxE, indices_TxK, moe_cfg) -> jax.Array:
  """Weights of the chosen experts, gathered from the live unbiased scores.

  Used for both the router's own choice and replayed indices, so replaying a layer's own
  choice is bit-identical and replayed experts still send gradients to the router. A
  masked sum over the experts, not take_along_axis: the exact score, and its transpose is a
  select, where the gather's is a scatter-add that the TPU compiler offloads to the
  SparseCore (and then cannot estimate the step's time).
  """
  chosen_TxKxE = indices_TxK[..., None] == jnp.arange(scores_TxE.shape[-1],
                                                      dtype=indices_TxK.dtype)
  weights_TxK = jnp.where(chosen_TxKxE, scores_TxE[..., None, :], 0.0).sum(-1)
  if moe_cfg.norm_topk_prob:
    weights_TxK = weights_TxK / (weights_TxK.sum(-1, keepdims=True) + _RENORM_EPS)
  return weights_TxK * moe_cfg.routed_scaling_factor


def route(logits_TxE, correction_bias_E, moe_cfg, replay_TxK=None, valid_T=None) -> Routing:
  """Scores, expert choice (or the replayed one) and gate weights for flat tokens.

  Replayed indices go through the plausibility filter when moe_cfg.replay_filter_factor
  > 0 (valid_T: the tokens its statistics count).
  """
  router = ROUTERS[moe_cfg.router]
  scores_TxE = router.score(logits_TxE)
  if replay_TxK is None:
    indices_TxK = router.select(scores_TxE, correction_bias_E, moe_cfg)
    return Routing(gate_weights(scores_TxE, indices_TxK, moe_cfg), indices_TxK, scores_TxE)
  if moe_cfg.replay_filter_factor <= 0:
    indices_TxK = replay_TxK.astype(jnp.int32)
    return Routing(gate_weights(scores_TxE, indices_TxK, moe_cfg), indices_TxK, scores_TxE)
  own_TxK = router.select(scores_TxE, correction_bias_E, moe_cfg)
  selection_TxE = scores_TxE
  if router.uses_correction_bias:
    selection_TxE = scores_TxE + correction_bias_E.astype(jnp.float32)
  kept = replay_filter.filter_replay(selection_TxE, replay_TxK, moe_cfg.replay_filter_factor,
                                     own_TxK, valid_T)
  return Routing(gate_weights(scores_TxE, kept.indices_TxK, moe_cfg), kept.indices_TxK,
                 scores_TxE, kept.replaced_fraction, kept.mismatch_fraction)


def expert_loads(indices_BxLxK, num_experts: int, valid_BxL=None) -> jax.Array:
  """float32 [E]: how many token copies each expert received (valid tokens only)."""
  hits_BxLxKxE = jax.nn.one_hot(indices_BxLxK, num_experts, dtype=jnp.float32)
  if valid_BxL is not None:
    hits_BxLxKxE = hits_BxLxKxE * valid_BxL[..., None, None].astype(jnp.float32)
  return hits_BxLxKxE.reshape(-1, num_experts).sum(0)


def sequence_balance_loss(scores_BxLxE, indices_BxLxK, valid_BxL=None) -> jax.Array:
  """DeepSeek-V3's sequence-wise balance loss, before its coefficient alpha.

  Per sequence with L' valid tokens: f_i = E / (K L') * (copies routed to expert i),
  P_i = mean over tokens of s_i / sum_j s_j (scores normalised over all experts);
  loss = sum_i f_i P_i, averaged over sequences that have a valid token. It is 1 when
  routing is uniform and grows as load and affinity concentrate on the same experts.
  Gradients flow through P only (f counts discrete choices).
  """
  batch, length, num_experts = scores_BxLxE.shape
  top_k = indices_BxLxK.shape[-1]
  if valid_BxL is None:
    valid_BxL = jnp.ones((batch, length), jnp.bool_)
  valid_BxL = valid_BxL.astype(jnp.float32)
  tokens_B = valid_BxL.sum(-1)
  denom_B = jnp.maximum(tokens_B, 1.0)

  counts_BxE = jnp.einsum("blke,bl->be",
                          jax.nn.one_hot(indices_BxLxK, num_experts, dtype=jnp.float32),
                          valid_BxL)
  load_frac_BxE = counts_BxE * (num_experts / top_k) / denom_B[:, None]

  affinity_BxLxE = scores_BxLxE / scores_BxLxE.sum(-1, keepdims=True)
  mean_affinity_BxE = jnp.einsum("ble,bl->be", affinity_BxLxE, valid_BxL) / denom_B[:, None]

  per_sequence_B = (load_frac_BxE * mean_affinity_BxE).sum(-1)
  has_tokens_B = (tokens_B > 0).astype(jnp.float32)
  return (per_sequence_B * has_tokens_B).sum() / jnp.maximum(has_tokens_B.sum(), 1.0)
