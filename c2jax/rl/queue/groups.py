"""Group assembly: G finished chains of one prompt -> a Group with rewards and advantages.

A chain is one rollout: one or more segments joined by self-summaries. The chain's reward
(from its whole-chain TrajectoryStats) and advantage apply to every one of its segments
(`per_segment`). The group's policy version is the oldest version among its chains, so
the queue's max_lag check bounds the staleness of every token in it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from c2jax.rl.learner import advantages as advantages_lib
from c2jax.rl.rewards import terms as rewards_lib
from c2jax.rl.queue.group_store import Group


@dataclasses.dataclass
class Chain:
  """One finished rollout.

  segments: per segment, field name -> array with the segment's length first (tokens,
    loss_mask, sampler_logprobs, versions, router_indices, ...).
  stats: the whole chain's TrajectoryStats (TrajectoryStats.of_chain of its segments).
  policy_version: the oldest policy version that sampled any of its tokens.
  """
  segments: list[dict[str, np.ndarray]]
  stats: rewards_lib.TrajectoryStats
  policy_version: int


def per_segment(values_G, segment_chain_S) -> np.ndarray:
  """The chain value (reward, advantage) of each segment."""
  return np.asarray(values_G)[np.asarray(segment_chain_S)]


def assemble_group(cfg, prompt_id: str, chains: list[Chain]) -> tuple[Group, dict]:
  """(Group, metrics) from exactly cfg.group_size chains; cfg is the RL config."""
  if len(chains) != cfg.group_size:
    raise ValueError(f"Prompt {prompt_id!r} has {len(chains)} finished chains; a group "
                     f"needs exactly config.rl.group_size = {cfg.group_size}.")
  empty = [i for i, chain in enumerate(chains) if not chain.segments]
  if empty:
    raise ValueError(f"Prompt {prompt_id!r}: chains {empty} have no segments.")
  rewards, terms = zip(*(rewards_lib.total_reward(cfg.reward, c.stats) for c in chains))
  rewards_G = np.asarray(rewards, np.float32)
  advantages_G = np.asarray(advantages_lib.compute_advantages(
      cfg.advantage, rewards_G, cfg.std_eps), np.float32)
  segments = [segment for chain in chains for segment in chain.segments]
  segment_chain_S = np.concatenate(
      [np.full(len(chain.segments), i, np.int32) for i, chain in enumerate(chains)])
  group = Group(prompt_id, min(c.policy_version for c in chains), rewards_G, advantages_G,
                segments, segment_chain_S)
  metrics = {f"reward/{name}": float(np.mean([t[name] for t in terms])) for name in terms[0]}
  metrics.update({
      "reward": float(rewards_G.mean()),
      "reward_std": float(rewards_G.std()),
      "pass_rate": float(np.mean([c.stats.tests_total > 0 and
                                  c.stats.tests_passed == c.stats.tests_total
                                  for c in chains])),
      "segments_per_chain": len(segments) / len(chains),
  })
  return group, metrics
