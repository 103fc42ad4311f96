"""An actor's groups rolled out by an external agent harness (agent.external.enabled).

The actor's engine goes behind an in-process `c2jax serve` on 127.0.0.1 with token
capture; each episode of a group runs the harness (mini-swe-agent, a command) as its own
subprocess against it, concurrently, so the engine batches their requests like native
rollouts. The stitched, graded trajectories (c2jax/agent/external) are queued exactly as
the native agent loop's are: same segments, same rewards, same learner.

Weights: the server's engine thread owns the engine, so new weights are staged by a
serve.follow.WeightFollower thread (swapped in between decode steps, in flight) instead
of the native loop's per-step poll. A harness that crashes or makes no request is an
infrastructure failure: the episode is rerun up to `retries` times, then the group fails
with RolloutError (dropped, prompt returned; c2jax.rl.actors.infra).
"""

from __future__ import annotations

import concurrent.futures
import uuid

from c2jax.agent import external
from c2jax.agent.loop import RolloutError, Trajectory
from c2jax.env import tasks as tasks_lib

SERVED_MODEL = "policy"


class ExternalGroups:
  """Serves `engine` (capture into capture_path) while open; `run_group` rolls out."""

  def __init__(self, engine, tokenizer, agent_cfg, *, vocab_size: int, capture_path: str,
               actor_id: str, retries: int = 0, weights_dir: str | None = None,
               weight_poll_s: float = 2.0):
    from c2jax.serve import Running, Service  # pylint: disable=g-import-not-at-top

    self.cfg, self.actor_id, self.retries = agent_cfg.external, actor_id, retries
    self.capture_path = capture_path
    self.running = Running(Service(engine, tokenizer, SERVED_MODEL, vocab_size=vocab_size,
                                   capture_path=capture_path))
    self.follower = None
    if weights_dir is not None:
      from c2jax.serve import follow  # pylint: disable=g-import-not-at-top
      self.follower = follow.WeightFollower(engine, weights_dir, weight_poll_s).start()

  def _episode(self, task: tasks_lib.Task, index: int, seed: int | None) -> Trajectory:
    attempt, last = 0, None
    while attempt <= self.retries:
      tag = f"{self.actor_id}-{task.id}-{index}-{uuid.uuid4().hex[:8]}"
      try:
        trajectory = external.run_episode(
            task, self.cfg, base_url=self.running.base_url, model=SERVED_MODEL,
            capture_path=self.capture_path, tag=tag, seed=seed)
        trajectory.infra_retries = attempt
        return trajectory
      except RolloutError as e:
        last = e
        attempt += 1
    raise RolloutError(f"{task.id}: external harness failed after {self.retries} "
                       f"retries: {last}", self.retries)

  def run_group(self, task: tasks_lib.Task, seeds: list[int | None]) -> list[Trajectory]:
    """One episode of `task` per seed, concurrently; RolloutError if any failed for good
    (the others are finished first, never half-queued)."""
    group_size = len(seeds)
    with concurrent.futures.ThreadPoolExecutor(group_size) as pool:
      futures = [pool.submit(self._episode, task, i, seed) for i, seed in enumerate(seeds)]
      concurrent.futures.wait(futures)
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
      retries = sum(getattr(e, "retries", 0) for e in errors)
      raise RolloutError(f"{len(errors)} of {group_size} external episodes failed: "
                         f"{errors[0]}", retries)
    return [f.result() for f in futures]

  def close(self) -> None:
    if self.follower is not None:
      self.follower.stop()
    self.running.stop()
