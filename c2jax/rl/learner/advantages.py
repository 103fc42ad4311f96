"""Group-relative advantage estimators, by name.

Each estimator maps rewards_NxG (N groups of G rollouts of one prompt; the last axis is
the group) to advantages_NxG of the same shape. Every segment of a self-summarised chain
later receives its chain's advantage.

  dr_grpo  A_i = r_i - mean(r)                    (default; Dr. GRPO, no std division)
  grpo     A_i = (r_i - mean(r)) / (std(r) + eps) (population std, ddof = 0)
  rloo     A_i = r_i - mean_{j != i} r_j = G / (G - 1) * (r_i - mean(r))

Why dr_grpo by default: dividing by the group std rescales each prompt's signal by how
uncertain the policy is on it, so nearly-solved (or nearly-hopeless) prompts, whose
rewards barely differ, get their tiny differences blown up to unit scale. See
experiments/findings/kl_estimators.py for the degenerate case.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


def dr_grpo(rewards_NxG: jax.Array, std_eps: float) -> jax.Array:
  del std_eps  # no std normalisation
  return rewards_NxG - rewards_NxG.mean(axis=-1, keepdims=True)


def grpo(rewards_NxG: jax.Array, std_eps: float) -> jax.Array:
  centred_NxG = rewards_NxG - rewards_NxG.mean(axis=-1, keepdims=True)
  return centred_NxG / (rewards_NxG.std(axis=-1, keepdims=True) + std_eps)


def rloo(rewards_NxG: jax.Array, std_eps: float) -> jax.Array:
  group = rewards_NxG.shape[-1]
  if group < 2:
    raise ValueError(f"rloo needs a group size >= 2 (got {group}): the baseline is the "
                     "mean of the other rollouts; raise config.rl.group_size.")
  return (group / (group - 1)) * dr_grpo(rewards_NxG, std_eps)


ADVANTAGE_ESTIMATORS: dict[str, Callable[[jax.Array, float], jax.Array]] = {
    "dr_grpo": dr_grpo,
    "grpo": grpo,
    "rloo": rloo,
}


def compute_advantages(name: str, rewards_NxG, std_eps: float = 1e-6) -> jax.Array:
  """Advantages by estimator name; rewards_NxG may also be a single group [G]."""
  if name not in ADVANTAGE_ESTIMATORS:
    raise ValueError(f"Unknown advantage estimator {name!r}; choose one of "
                     f"{sorted(ADVANTAGE_ESTIMATORS)} (config.rl.advantage).")
  rewards_NxG = jnp.asarray(rewards_NxG, jnp.float32)
  return ADVANTAGE_ESTIMATORS[name](rewards_NxG, std_eps)
