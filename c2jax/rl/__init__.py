"""Reinforcement learning: rewards, advantages, KL, losses, router-replay filter, queue.

  length_penalty(x, k, q)                          the report's concave length penalty
  TrajectoryStats, total_reward(cfg.reward, stats) rewards from a registry of terms
  compute_advantages(name, rewards_NxG)            dr_grpo | grpo | rloo
  rl_loss(cfg, logprobs, sampler_logprobs, ref_logprobs, advantages, mask, num_rollouts=R)
  default_config(), validate(cfg)                  the `config.rl` section
Further modules, imported directly where needed:
  group_queue.GroupQueue, task_pool.TaskPool, groups.assemble_group, packing.pack_batch,
  curriculum.CurriculumSampler / RunningCurriculum (single-epoch order / draws from
  running statistics), curriculum_pool (probe rollouts, the running curriculum's pool
  feed in the learner), learner.rl_step (the pure step), learner_runtime (the
  step on the shared training runtime: sharding, batches, restore), heldout (held-out
  evals during RL), weights.WeightPublisher/Subscriber,
  actor (the rollout actor process), actors (process / Ray backends), infra
  (infrastructure failures: dropped groups, counts),
  trainer.train (`c2jax rl`; held-out evals through c2jax.eval), job (the RL job config)
"""

from c2jax.rl.advantages import ADVANTAGE_ESTIMATORS, compute_advantages
from c2jax.rl.config import default_config, validate
from c2jax.rl.kl import KL_ESTIMATORS, kl_estimate
from c2jax.rl.length_penalty import length_penalty
from c2jax.rl.losses import AGGREGATIONS, POLICY_LOSSES, rl_loss
from c2jax.rl.rewards import REWARD_TERMS, TrajectoryStats, total_reward

__all__ = ["ADVANTAGE_ESTIMATORS", "AGGREGATIONS", "KL_ESTIMATORS", "POLICY_LOSSES",
           "REWARD_TERMS", "TrajectoryStats", "compute_advantages", "default_config",
           "kl_estimate", "length_penalty", "rl_loss", "total_reward", "validate"]
