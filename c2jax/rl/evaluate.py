"""Held-out evaluation with the agent loop: pass rate, best-of-k, tokens per rollout.

The same `run_episodes` RL uses, on tasks never trained on, with `samples` rollouts per
task: pass@1 is the mean share of solved rollouts, best-of-k the share of tasks that at
least one of the k rollouts solved.
"""

from __future__ import annotations

import time

import numpy as np

from c2jax.agent import loop as agent_loop
from c2jax.rl import rollouts


def evaluate(engine, tokenizer, agent_cfg, tasks, samples: int, temperature: float,
             salt: int = 0) -> dict[str, float]:
  cfg = agent_cfg.copy_and_resolve_references()
  cfg.temperature = temperature
  jobs = [task for task in tasks for _ in range(samples)]
  seeds = [seed for task in tasks
           for seed in rollouts.rollout_seeds("eval:" + task.id, samples, salt)]
  started = time.monotonic()
  trajectories = agent_loop.run_episodes(engine, tokenizer, cfg, jobs, seeds=seeds)
  solved_TxS = np.asarray([t.solved for t in trajectories]).reshape(len(tasks), samples)
  sampled = [sum(int(s.loss_mask.sum()) for s in t.segments) for t in trajectories]
  return {"pass_rate": float(solved_TxS.mean()),
          f"best_of_{samples}": float(solved_TxS.any(axis=1).mean()),
          "tokens_per_rollout": float(np.mean(sampled)),
          "turns": float(np.mean([t.stats.turns for t in trajectories])),
          "seconds": time.monotonic() - started}
