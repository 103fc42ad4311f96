"""Reinforcement learning: the asynchronous RL job behind `c2jax rl`.

Where things are:
  trainer.train        the learner loop (`c2jax rl`): groups -> batch -> step -> publish
                       weights -> checkpoint; held-out evals (heldout), the job config (job)
  learner/             the jitted step (step.rl_step), its sharded runtime (runtime),
                       losses, KL and advantage estimators, packing, online MTP distillation
  actors/              the rollout actor process (actor), process / Ray backends (backends,
                       ray_link), rollouts of native and external harnesses, infra failures
  queue/               finished groups: assembly (groups), the staleness-aware queue
                       (group_queue) and its exactly-once store (group_store)
  tasks/               prompts: task sources, the task pool, the curriculum
  rewards/             reward terms (terms), the length penalty, behaviour and model graders
  weights              XOR-delta weight publishing and in-flight swaps
  config               the `config.rl` section

The package re-exports the pieces most experiments call:
  length_penalty(x, k, q)                          the report's concave length penalty
  TrajectoryStats, total_reward(cfg.reward, stats) rewards from a registry of terms
  compute_advantages(name, rewards_NxG)            dr_grpo | grpo | rloo
  rl_loss(cfg, logprobs, sampler_logprobs, ref_logprobs, advantages, mask, num_rollouts=R)
  default_config(), validate(cfg)                  the `config.rl` section
"""

from c2jax.rl.learner.advantages import ADVANTAGE_ESTIMATORS, compute_advantages
from c2jax.rl.config import default_config, validate
from c2jax.rl.learner.kl import KL_ESTIMATORS, kl_estimate
from c2jax.rl.rewards.length_penalty import length_penalty
from c2jax.rl.learner.losses import AGGREGATIONS, POLICY_LOSSES, rl_loss
from c2jax.rl.rewards.terms import REWARD_TERMS, TrajectoryStats, total_reward

__all__ = ["ADVANTAGE_ESTIMATORS", "AGGREGATIONS", "KL_ESTIMATORS", "POLICY_LOSSES",
           "REWARD_TERMS", "TrajectoryStats", "compute_advantages", "default_config",
           "kl_estimate", "length_penalty", "rl_loss", "total_reward", "validate"]
