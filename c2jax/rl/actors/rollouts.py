"""What actors and the evaluator share: the run directory layout, engines, groups.

Run directory of `c2jax rl` (one per run; actors on other machines see it on shared
storage):
  config.json          the resolved job config (actors read it)
  tasks/repos/         procedural repositories; tasks/heldout.jsonl the held-out tasks;
                       tasks/train.jsonl the training prompts a running curriculum draws
                       from (otherwise they are all in the pool from the start)
  pool/                prompts waiting for / leased to actors (task_pool.TaskPool)
  queue/               finished groups (group_queue.GroupQueue)
  weights/<run>/       published weights of the current learner incarnation (or under
                       config.actors.weights_dir, a URL, for actors without this disk)
  actors/<id>.log      each actor's output
  checkpoints/, metrics.jsonl, events.*   the learner's (checkpoints may go to
                       config.learner.checkpoint_dir instead)
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import zlib

import ml_collections
import numpy as np

from c2jax import storage
from c2jax.rl.rewards import behaviour
from c2jax.rl.queue import groups as groups_lib
from c2jax.rl.queue.group_queue import GroupQueue
from c2jax.rl.tasks.task_pool import TaskPool


_WEIGHTS_PREFIX = "from-step-"  # one weights folder per learner incarnation


@dataclasses.dataclass(frozen=True)
class RunDirs:
  root: pathlib.Path

  @property
  def config(self) -> pathlib.Path:
    return self.root / "config.json"

  @property
  def repos(self) -> pathlib.Path:
    return self.root / "tasks" / "repos"

  @property
  def heldout(self) -> pathlib.Path:
    return self.root / "tasks" / "heldout.jsonl"

  @property
  def train(self) -> pathlib.Path:
    return self.root / "tasks" / "train.jsonl"

  @property
  def weights(self) -> pathlib.Path:
    return self.root / "weights"

  @property
  def actors(self) -> pathlib.Path:
    return self.root / "actors"

  @property
  def checkpoints(self) -> pathlib.Path:
    return self.root / "checkpoints"

  def pool(self) -> TaskPool:
    return TaskPool(self.root / "pool")

  def queue(self, cfg) -> GroupQueue:
    return GroupQueue(self.root / "queue", cfg.rl.queue.capacity, cfg.rl.queue.max_lag,
                      cfg.rl.queue.poll_s)


def checkpoint_location(cfg, dirs: RunDirs) -> str:
  """The learner's checkpoint directory or URL (config.learner.checkpoint_dir)."""
  return storage.resolve(cfg.learner.checkpoint_dir or dirs.checkpoints)


def fresh_weights_dir(cfg, dirs: RunDirs, step: int) -> str:
  """The weights directory (or URL) of a learner incarnation starting at `step`, below
  config.actors.weights_dir (default <workdir>/weights). Earlier incarnations' folders
  are deleted first: versions they published after the checkpoint being resumed belong
  to a discarded future. Other folders under a shared root are left alone."""
  root = storage.resolve(cfg.actors.weights_dir or dirs.weights)
  for name in storage.children(root):
    if name.startswith(_WEIGHTS_PREFIX):
      storage.remove_tree(storage.join(root, name))
  return storage.join(root, f"{_WEIGHTS_PREFIX}{step:06d}")


def load_config(dirs: RunDirs) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(json.loads(dirs.config.read_text()))


def rollout_seeds(task_id: str, count: int, salt: int = 0) -> list[int]:
  """Per-rollout sampling seeds of a prompt: distinct, and the same after a restart."""
  base = zlib.crc32(f"{salt}:{task_id}".encode()) % (2**31 - count)
  return [base + i for i in range(count)]


def segment_arrays(trajectory) -> list[dict[str, np.ndarray]]:
  """The per-token fields the learner trains on, one dict per segment."""
  return [dict(segment.arrays(), valid=np.ones(len(segment.tokens), np.int32))
          for segment in trajectory.segments]


def make_group(rl_cfg, task_id: str, trajectories) -> tuple:
  """(Group, metrics) from a prompt's finished trajectories."""
  chains = [groups_lib.Chain(segment_arrays(t), behaviour.graded_stats(rl_cfg.reward, t),
                            t.policy_version) for t in trajectories]
  group, metrics = groups_lib.assemble_group(rl_cfg, task_id, chains)
  reasons: dict[str, int] = {}
  for t in trajectories:
    reasons[t.finish_reason] = reasons.get(t.finish_reason, 0) + 1
  group.info = dict(
      metrics,
      solved=[bool(t.solved) for t in trajectories],
      sampled_tokens=[int(sum(s.loss_mask.sum() for s in t.segments)) for t in trajectories],
      total_tokens=[int(sum(len(s.tokens) for s in t.segments)) for t in trajectories],
      turns=[int(t.stats.turns) for t in trajectories],
      thinking_tokens=[int(t.stats.thinking_tokens) for t in trajectories],
      duration_s=float(max(t.duration_s for t in trajectories)),
      finish_reasons=reasons)
  return group, metrics
