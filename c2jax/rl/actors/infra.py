"""Infrastructure failures of rollouts: what an actor does with them, and their counts.

A rollout whose sandbox or engine fails says nothing about the policy, so it must never
reach the learner as a reward (a 0 would bias its group's advantages). The agent loop
already reruns such an episode on a fresh sandbox (config.rl.infra.retries); when it
still fails, `drop_group` drops the whole group (a partial group would bias the others'
advantages too) and returns its prompt to the pool, at most
config.rl.infra.prompt_returns times, after which the prompt is dropped for good (its
environment is broken, not flaky).

Counts live in the run directory, one file per actor (`actors/<id>.infra.json`, written
only by that actor, atomically), so they survive actor restarts and reach a learner on
another machine; `totals` sums them for the learner's metrics:
  infra_failures   groups dropped because a rollout failed beyond its retries
  infra_retries    fresh-sandbox reruns of episodes (in kept and dropped groups)
  infra_dropped    prompts dropped for good after prompt_returns returns
"""

from __future__ import annotations

import json

from c2jax.rl.queue.group_store import atomic_write, check_id

COUNTERS = ("infra_failures", "infra_retries", "infra_dropped")


def _path(dirs, actor_id: str):
  return dirs.actors / f"{check_id('actor_id', actor_id)}.infra.json"


def record(dirs, actor_id: str, **increments: int) -> dict[str, int]:
  """Adds `increments` (names from COUNTERS) to the actor's counts; returns them."""
  unknown = sorted(set(increments) - set(COUNTERS))
  if unknown:
    raise ValueError(f"Unknown infra counters {unknown}; use {COUNTERS}.")
  if hasattr(dirs, "record_infra"):  # an actor without the run directory (ray_link)
    return dirs.record_infra(actor_id, **increments)
  path = _path(dirs, actor_id)
  counts = dict.fromkeys(COUNTERS, 0)
  if path.exists():
    counts.update(json.loads(path.read_text()))
  for name, value in increments.items():
    counts[name] += int(value)
  path.parent.mkdir(parents=True, exist_ok=True)
  atomic_write(path, json.dumps(counts).encode())
  return counts


def totals(dirs) -> dict[str, int]:
  """The counts summed over every actor of the run (0 when none failed)."""
  result = dict.fromkeys(COUNTERS, 0)
  if not dirs.actors.exists():
    return result
  for path in sorted(dirs.actors.glob("*.infra.json")):
    for name, value in json.loads(path.read_text()).items():
      result[name] = result.get(name, 0) + int(value)
  return result


def drop_group(infra_cfg, dirs, pool, actor_id: str, task_id: str, retries: int) -> bool:
  """Accounts for a group lost to infrastructure and returns its prompt to the pool;
  False when the prompt was dropped for good instead (prompt_returns exhausted).
  `retries`: fresh-sandbox reruns spent on the group before it failed."""
  returned = pool.release(actor_id, task_id, max_releases=infra_cfg.prompt_returns)
  record(dirs, actor_id, infra_failures=1, infra_retries=retries,
         infra_dropped=0 if returned else 1)
  return returned
